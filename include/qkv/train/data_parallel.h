// Data parallelism for train::Trainer: every rank of a communicator holds the same parameters and optimizer state,
// runs the forward and backward of its own shard of each global batch, and the gradients are summed across the
// ranks before clipping and the optimizer step, which then see the gradient of the global batch.
//
// The global batch's loss is the mean over all its loss terms (the tokens that are not padding): a rank's shard
// has `weight` of them, so the global loss is sum(w_r·loss_r) / sum(w_r) and the global gradient
// sum((w_r / W)·g_r). With equal weights that is the mean of the ranks' gradients.
//
// Context parallelism (ContextParallel below) runs on the same machinery: the ranks split every sequence instead
// of the batch, and since a rank's backward reaches the other ranks' positions through ring attention, each rank's
// loss is its share of the one global mean (the sum of its loss terms / the global count): set_loss_shares(true).
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/parallel/comm.h"
#include "qkv/nn/context.h"
#include "qkv/ops/autograd.h"
#include "qkv/train/optim.h"

namespace qkv::train {

class DataParallel {
 public:
  // comm and params must outlive this. bucket_floats: the gradient floats of one all-reduce. The buckets are fixed
  // once, in REVERSE ParameterSet order (the order a backward finishes the gradients, as PyTorch's DDP), each of
  // at most bucket_floats gradient floats (a larger parameter is a bucket of its own), and never change.
  DataParallel(parallel::Communicator& comm, ad::ParameterSet& params, int64_t bucket_floats = 1 << 20);

  parallel::Communicator& comm() { return *comm_; }

  // Rank 0's parameter values and optimizer state to every rank (start-up and after a resume).
  void broadcast_from_root(Optimizer& optimizer);

  // This rank's number of loss terms in the current batch shard (1 when never set: equal weights).
  void set_local_weight(double weight) { weight_ = weight; }
  // Each rank's loss is already its share of the global loss (context parallelism): global_loss() sums the ranks'
  // losses and the gradients are summed unscaled. Off by default (data parallelism).
  void set_loss_shares(bool on) { shares_ = on; }

  // Collective: the global batch's loss from this rank's `local_loss` (non-finite when any rank's is). Call it
  // before the backward: it fixes the scale of this rank's gradients.
  double global_loss(double local_loss);

  // The all-reduce overlaps the backward: Tape::set_on_param_ready with parameter_ready() (train::Trainer does so
  // when overlap() is on, the default). Once every parameter of the next bucket in the fixed order is final, the
  // bucket is packed (scaled by this rank's share) and its non-blocking all-reduce starts; buckets start strictly
  // in bucket order on every rank, and each call drives MPI's progress on those in flight. A parameter that no
  // node of this rank's backward reads is never reported: it holds back its bucket, and every later one, until
  // reduce_gradients().
  void parameter_ready(const ad::Parameter& p, size_t nodes_left);
  void set_overlap(bool on) { overlap_ = on; }
  bool overlap() const { return overlap_; }
  // Collective, after backward: starts the buckets not started yet, waits for all, and every gradient becomes the
  // global batch's, identical on every rank. Each bucket carries one has-a-gradient flag per parameter (summed):
  // a parameter that received a gradient on some rank only gets the others' zeros; one that received none
  // anywhere stays without a gradient. Resets the weight to 1. With no parameter_ready() calls this is the whole
  // all-reduce, after the backward.
  void reduce_gradients();

  size_t num_buckets() const { return buckets_.size(); }
  // Of the last reduce_gradients()'s step: the buckets started while some node's backward had yet to run.
  int64_t buckets_started_during_backward() const { return started_during_backward_; }

  // Collective: throws std::runtime_error naming the step and the first rank whose parameters differ from rank 0's.
  void check_replicas(int64_t step);
  // Hash of every parameter value, in order.
  uint64_t parameter_hash() const;

 private:
  struct Bucket {
    std::vector<size_t> params;  // ParameterSet indices, in bucket order
    int64_t offset = 0;          // into buffer_: the gradients, then one flag per parameter
    int64_t floats = 0;          // gradient floats
    size_t ready = 0;            // parameters final so far in this step
    parallel::Request request;
  };
  void plan();  // the buckets, for the current ParameterSet
  void start(size_t b, bool during_backward);

  parallel::Communicator* comm_;
  ad::ParameterSet* params_;
  int64_t bucket_floats_;
  double weight_ = 1.0, total_weight_ = 1.0;
  bool shares_ = false, overlap_ = true;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;     // per parameter
  std::vector<char> ready_;           // per parameter, this step
  std::vector<float> buffer_;
  size_t next_ = 0, done_ = 0;        // the next bucket to start; buckets [0, done_) completed
  int64_t started_early_ = 0, started_during_backward_ = 0;
};

// Context parallelism over every rank of `comm`: each rank holds, of every sequence, the positions of the zigzag
// layout of parallel::ring_shard (T right-padded to a multiple of 2N, rank r holding chunks r and 2N-1-r), and every
// attention is causal ring attention (parallel::ring_attention). Set on the training Context
// (nn::Context::set_sequence_shard) of a model forward that supports it (train::TextModel's decoder-only and
// Llama kinds).
class ContextParallel : public nn::SequenceShard {
 public:
  explicit ContextParallel(parallel::Communicator& comm) : comm_(&comm) {}
  int64_t padded_length(int64_t t) const override;
  std::vector<int64_t> positions(int64_t t) const override;
  // Causal attention only (the layout is causal's zigzag); a per-key mask travels with its keys.
  ad::Var attention(const ad::Var& q, const ad::Var& k, const ad::Var& v,
                    const AttentionOptions& options) const override;
  // Collective: the sum of `local` over the ranks (a loss-term count).
  double global_sum(double local) const;

 private:
  parallel::Communicator* comm_;
};

}  // namespace qkv::train
