// Data parallelism: broadcast of the start state, the global loss and the bucketed gradient all-reduce.
#include "qkv/train/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "qkv/core/error.h"
#include "qkv/dist/ring_attention.h"

namespace qkv::train {

DataParallel::DataParallel(dist::Communicator& comm, ad::ParameterSet& params, int64_t bucket_floats)
    : comm_(&comm), params_(&params), bucket_floats_(bucket_floats) {
  QKV_CHECK_ARG(bucket_floats > 0, "[DataParallel] bucket_floats ", bucket_floats, " must be positive");
}

namespace {

// The names and shapes of a state dict as one string: equal on every rank or the broadcast below cannot work.
std::string layout(const nn::StateDict& state) {
  std::string s;
  for (const auto& [name, t] : state) s += name + str(t.shape()) + ";";
  return s;
}

}  // namespace

void DataParallel::broadcast_from_root(Optimizer& optimizer) {
  dist::Communicator& c = *comm_;
  if (c.size() == 1) return;
  for (size_t i = 0; i < params_->size(); ++i) {
    Tensor& v = *(*params_)[i].value;
    QKV_ASSERT(v.is_contiguous());
    c.broadcast(v.data(), v.numel(), 0);
  }
  nn::StateDict state = optimizer.state_dict();
  const std::string mine = layout(state);
  c.check_same(dist::hash_bytes(mine.data(), mine.size()), "the optimizer state's tensors (names and shapes)");
  for (auto& [name, t] : state) {
    Tensor owned = t.contiguous().clone();
    c.broadcast(owned.data(), owned.numel(), 0);
    t = owned;
  }
  optimizer.load_state_dict(state);
}

double DataParallel::global_loss(double local_loss) {
  const double share = shares_ ? local_loss : weight_ * local_loss;
  float sums[3] = {shares_ ? 1.0f : static_cast<float>(weight_), static_cast<float>(share),
                   std::isfinite(local_loss) ? 0.0f : 1.0f};
  comm_->allreduce_sum(sums, 3);
  total_weight_ = sums[0];
  if (sums[2] > 0.0f) return std::nan("");
  if (shares_) return sums[1];
  return total_weight_ > 0.0 ? static_cast<double>(sums[1]) / total_weight_ : 0.0;
}

void DataParallel::reduce_gradients() {
  dist::Communicator& c = *comm_;
  const size_t n = params_->size();
  // Which parameters got a gradient anywhere (a max over the ranks), so that every rank reduces the same set.
  std::vector<float> has(n);
  for (size_t i = 0; i < n; ++i) has[i] = (*params_)[i].has_grad ? 1.0f : 0.0f;
  c.allreduce_max(has.data(), static_cast<int64_t>(n));
  const float scale = shares_ ? 1.0f : total_weight_ > 0.0 ? static_cast<float>(weight_ / total_weight_) : 0.0f;
  std::vector<float*> grads;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < n; ++i) {
    if (has[i] == 0.0f) continue;
    ad::Parameter& p = (*params_)[i];
    if (!p.has_grad) {
      if (!p.grad.defined()) p.grad = Tensor::zeros(p.value->shape());
      p.grad.fill(0.0f);
      p.has_grad = true;
    }
    QKV_ASSERT(p.grad.is_contiguous());
    grads.push_back(p.grad.data());
    sizes.push_back(p.grad.numel());
  }
  // Buckets in ParameterSet order: pack (scaled by this rank's share), sum over the ranks, unpack.
  size_t first = 0;
  while (first < grads.size()) {
    size_t last = first;
    int64_t total = 0;
    while (last < grads.size() && (total == 0 || total + sizes[last] <= bucket_floats_)) total += sizes[last++];
    bucket_.resize(static_cast<size_t>(total));
    int64_t off = 0;
    for (size_t j = first; j < last; ++j) {
      for (int64_t e = 0; e < sizes[j]; ++e) bucket_[static_cast<size_t>(off + e)] = grads[j][e] * scale;
      off += sizes[j];
    }
    c.allreduce_sum(bucket_.data(), total);
    off = 0;
    for (size_t j = first; j < last; ++j) {
      std::memcpy(grads[j], bucket_.data() + off, static_cast<size_t>(sizes[j]) * sizeof(float));
      off += sizes[j];
    }
    first = last;
  }
  weight_ = 1.0;
}

uint64_t DataParallel::parameter_hash() const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < params_->size(); ++i) {
    const Tensor v = (*params_)[i].value->contiguous();
    h = dist::hash_floats(v.data(), v.numel(), h);
  }
  return h;
}

void DataParallel::check_replicas(int64_t step) {
  comm_->check_same(parameter_hash(), "the parameters after step " + std::to_string(step));
}

int64_t ContextParallel::padded_length(int64_t t) const {
  const int64_t chunks = 2 * static_cast<int64_t>(comm_->size());
  return (t + chunks - 1) / chunks * chunks;
}

std::vector<int64_t> ContextParallel::positions(int64_t t) const {
  return dist::ring_positions(t, comm_->rank(), comm_->size(), Causal::kTopLeft);
}

ad::Var ContextParallel::attention(const ad::Var& q, const ad::Var& k, const ad::Var& v,
                                   const AttentionOptions& options) const {
  QKV_CHECK_ARG(options.causal != Causal::kNone, "[ContextParallel] q ", str(q.shape()), " k ", str(k.shape()),
                ": the sequence is split in causal attention's zigzag layout, so only causal attention runs on it");
  return dist::ring_attention(q, k, v, *comm_, options);
}

double ContextParallel::global_sum(double local) const {
  float x = static_cast<float>(local);
  comm_->allreduce_sum(&x, 1);
  return x;
}

}  // namespace qkv::train
