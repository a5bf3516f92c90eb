// nn::Context: what a module's one forward runs with. A default Context is inference: module tensors are
// constants and nothing is recorded. A training Context binds the module tensors to a Tape (through a
// ParameterSet), so the same forward records its backward, and supplies the run's one dropout Rng.
#pragma once

#include <memory>
#include <vector>

#include "qkv/core/attention_types.h"

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/ops/autograd.h"

namespace qkv::nn {

// Context parallelism: this process holds some positions of every sequence of the batch, the other processes the
// rest. A forward under a SequenceShard keeps its tokenwise work on the local positions, gives them their global
// positions, and runs every attention through attention(), across the processes (train::ContextParallel: ring
// attention in the zigzag layout).
class SequenceShard {
 public:
  virtual ~SequenceShard() = default;
  // The length that sequences of length t are right-padded to, so that they split as the layout needs (>= t).
  virtual int64_t padded_length(int64_t t) const = 0;
  // The global positions this process holds of a sequence of (padded) length t, in order.
  virtual std::vector<int64_t> positions(int64_t t) const = 0;
  // Attention of the local queries over every process's keys: q, k, v (B, H, L, D) hold the local positions.
  virtual ad::Var attention(const ad::Var& q, const ad::Var& k, const ad::Var& v,
                            const AttentionOptions& options) const = 0;
};

class Context {
 public:
  // Inference, no dropout stream: a module in training() mode with dropout p > 0 is refused.
  Context() = default;
  // Inference with a dropout stream (a module's own Tensor forward in training() mode).
  explicit Context(Rng* dropout_rng) : rng_(dropout_rng) {}
  // Training: module tensors found in `params` become parameter leaves on `tape`; others stay constants.
  // dropout_rng may be null when no dropout is active; tape, params and dropout_rng must outlive the Context.
  Context(ad::Tape& tape, ad::ParameterSet& params, Rng* dropout_rng = nullptr);

  // The Var of a module tensor: a parameter leaf when training and the tensor is in the set, else a constant.
  ad::Var param(const Tensor& module_tensor) const {
    return binder_ ? (*binder_)(module_tensor) : ad::Var(module_tensor);
  }
  ad::Tape* tape() const { return binder_ ? &binder_->tape() : nullptr; }
  Rng* dropout_rng() const { return rng_; }
  // Context parallelism (nullptr: off, the default). `shard` must outlive the forwards that use it.
  void set_sequence_shard(const SequenceShard* shard) { shard_ = shard; }
  const SequenceShard* sequence_shard() const { return shard_; }

  // x: any shape. Inverted dropout with probability p when `training` and p > 0, drawing from dropout_rng();
  // identity otherwise. p in [0, 1]; p == 1 zeroes everything, as PyTorch. `op` names the module in errors.
  ad::Var dropout(const ad::Var& x, float p, bool training, const char* op = "Dropout") const;

 private:
  std::shared_ptr<ad::Binder> binder_;
  Rng* rng_ = nullptr;
  const SequenceShard* shard_ = nullptr;
};

}  // namespace qkv::nn
