// Data parallelism for train::Trainer: every rank of a communicator holds the same parameters and optimizer state,
// runs the forward and backward of its own shard of each global batch, and the gradients are summed across the
// ranks before clipping and the optimizer step, which then see the gradient of the global batch.
//
// The global batch's loss is the mean over all its loss terms (the tokens that are not padding): a rank's shard
// has `weight` of them, so the global loss is sum(w_r·loss_r) / sum(w_r) and the global gradient
// sum((w_r / W)·g_r). With equal weights that is the mean of the ranks' gradients.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/dist/comm.h"
#include "qkv/ops/autograd.h"
#include "qkv/train/optim.h"

namespace qkv::train {

class DataParallel {
 public:
  // comm and params must outlive this. bucket_floats: the size of one all-reduce (gradients are packed in
  // ParameterSet order into buckets of at most this many floats; the order never changes).
  DataParallel(dist::Communicator& comm, ad::ParameterSet& params, int64_t bucket_floats = 1 << 20);

  dist::Communicator& comm() { return *comm_; }

  // Rank 0's parameter values and optimizer state to every rank (start-up and after a resume).
  void broadcast_from_root(Optimizer& optimizer);

  // This rank's number of loss terms in the current batch shard (1 when never set: equal weights).
  void set_local_weight(double weight) { weight_ = weight; }

  // Collective: the global batch's loss from this rank's `local_loss` (non-finite when any rank's is).
  double global_loss(double local_loss);
  // Collective, after backward: every gradient becomes the global batch's, identical on every rank. A parameter
  // that received a gradient on some rank only gets zeros elsewhere first. Resets the weight to 1.
  void reduce_gradients();

  // Collective: throws std::runtime_error naming the step and the first rank whose parameters differ from rank 0's.
  void check_replicas(int64_t step);
  // Hash of every parameter value, in order.
  uint64_t parameter_hash() const;

 private:
  dist::Communicator* comm_;
  ad::ParameterSet* params_;
  int64_t bucket_floats_;
  double weight_ = 1.0, total_weight_ = 1.0;
  std::vector<float> bucket_;
};

}  // namespace qkv::train
