// Data parallelism: broadcast of the start state, the global loss and the bucketed gradient all-reduce, which
// starts each bucket as soon as the backward has finished its gradients.
#include "qkv/train/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "qkv/core/error.h"
#include "qkv/parallel/ring_attention.h"

namespace qkv::train {

DataParallel::DataParallel(parallel::Communicator& comm, ad::ParameterSet& params, int64_t bucket_floats)
    : comm_(&comm), params_(&params), bucket_floats_(bucket_floats) {
  QKV_CHECK_ARG(bucket_floats > 0, "[DataParallel] bucket_floats ", bucket_floats, " must be positive");
  plan();
}

void DataParallel::plan() {
  const size_t n = params_->size();
  buckets_.clear();
  bucket_of_.assign(n, 0);
  ready_.assign(n, 0);
  int64_t offset = 0;
  for (size_t i = n; i-- > 0;) {
    const int64_t size = (*params_)[i].value->numel();
    if (buckets_.empty() || (buckets_.back().floats > 0 && buckets_.back().floats + size > bucket_floats_)) {
      if (!buckets_.empty()) offset += buckets_.back().floats + static_cast<int64_t>(buckets_.back().params.size());
      buckets_.emplace_back();
      buckets_.back().offset = offset;
    }
    buckets_.back().params.push_back(i);
    buckets_.back().floats += size;
    bucket_of_[i] = buckets_.size() - 1;
  }
  if (!buckets_.empty()) offset += buckets_.back().floats + static_cast<int64_t>(buckets_.back().params.size());
  buffer_.assign(static_cast<size_t>(offset), 0.0f);
  next_ = done_ = 0;
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
  parallel::Communicator& c = *comm_;
  if (c.size() == 1) return;
  for (size_t i = 0; i < params_->size(); ++i) {
    Tensor& v = *(*params_)[i].value;
    QKV_ASSERT(v.is_contiguous());
    c.broadcast(v.data(), v.numel(), 0);
  }
  nn::StateDict state = optimizer.state_dict();
  const std::string mine = layout(state);
  c.check_same(parallel::hash_bytes(mine.data(), mine.size()), "the optimizer state's tensors (names and shapes)");
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

// Packs bucket b (this rank's gradients times its share, zeros for a parameter without one, and the flags) and
// starts its all-reduce. MPI_Iallreduce may run another algorithm than MPI_Allreduce, so the sum's bits may differ
// from the blocking one's, but they are the same on every rank.
void DataParallel::start(size_t b, bool during_backward) {
  Bucket& k = buckets_[b];
  const float scale = shares_ ? 1.0f : total_weight_ > 0.0 ? static_cast<float>(weight_ / total_weight_) : 0.0f;
  float* out = buffer_.data() + k.offset;
  float* flags = out + k.floats;
  for (size_t j = 0; j < k.params.size(); ++j) {
    const ad::Parameter& p = (*params_)[k.params[j]];
    const int64_t size = p.value->numel();
    if (p.has_grad) {
      QKV_ASSERT(p.grad.is_contiguous() && p.grad.numel() == size);
      const float* g = p.grad.data();
      for (int64_t e = 0; e < size; ++e) out[e] = g[e] * scale;
    } else {
      std::fill(out, out + size, 0.0f);
    }
    flags[j] = p.has_grad ? 1.0f : 0.0f;
    out += size;
  }
  k.request = comm_->iallreduce_sum(buffer_.data() + k.offset, k.floats + static_cast<int64_t>(k.params.size()));
  if (during_backward) ++started_early_;
}

void DataParallel::parameter_ready(const ad::Parameter& p, size_t nodes_left) {
  if (next_ == 0 && done_ == 0 && bucket_of_.size() != params_->size()) plan();  // parameters added since
  const int64_t i = params_->index_of(p.value);
  if (i < 0 || ready_[static_cast<size_t>(i)] != 0) return;  // another set's parameter, or reported already
  ready_[static_cast<size_t>(i)] = 1;
  ++buckets_[bucket_of_[static_cast<size_t>(i)]].ready;
  while (next_ < buckets_.size() && buckets_[next_].ready == buckets_[next_].params.size())
    start(next_++, nodes_left > 0);
  // Open MPI advances a non-blocking collective only inside MPI calls: test the oldest in flight.
  while (done_ < next_ && comm_->test(buckets_[done_].request)) ++done_;
}

void DataParallel::reduce_gradients() {
  if (next_ == 0 && done_ == 0 && bucket_of_.size() != params_->size()) plan();
  while (next_ < buckets_.size()) start(next_++, false);  // the buckets no report completed, in order
  for (Bucket& k : buckets_) comm_->wait(k.request);
  for (const Bucket& k : buckets_) {
    const float* in = buffer_.data() + k.offset;
    const float* flags = in + k.floats;
    for (size_t j = 0; j < k.params.size(); ++j) {
      ad::Parameter& p = (*params_)[k.params[j]];
      const int64_t size = p.value->numel();
      if (flags[j] > 0.0f) {  // some rank had a gradient: the sum, with zeros from the ranks that had none
        if (!p.grad.defined()) p.grad = Tensor::zeros(p.value->shape());
        QKV_ASSERT(p.grad.is_contiguous() && p.grad.numel() == size);
        std::memcpy(p.grad.data(), in, static_cast<size_t>(size) * sizeof(float));
        p.has_grad = true;
      }
      in += size;
    }
  }
  for (Bucket& k : buckets_) k.ready = 0;
  std::fill(ready_.begin(), ready_.end(), 0);
  next_ = done_ = 0;
  started_during_backward_ = started_early_;
  started_early_ = 0;
  weight_ = 1.0;
}

uint64_t DataParallel::parameter_hash() const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < params_->size(); ++i) {
    const Tensor v = (*params_)[i].value->contiguous();
    h = parallel::hash_floats(v.data(), v.numel(), h);
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
  return parallel::ring_positions(t, comm_->rank(), comm_->size(), Causal::kTopLeft);
}

ad::Var ContextParallel::attention(const ad::Var& q, const ad::Var& k, const ad::Var& v,
                                   const AttentionOptions& options) const {
  QKV_CHECK_ARG(options.causal != Causal::kNone, "[ContextParallel] q ", str(q.shape()), " k ", str(k.shape()),
                ": the sequence is split in causal attention's zigzag layout, so only causal attention runs on it");
  return parallel::ring_attention(q, k, v, *comm_, options);
}

double ContextParallel::global_sum(double local) const {
  float x = static_cast<float>(local);
  comm_->allreduce_sum(&x, 1);
  return x;
}

}  // namespace qkv::train
