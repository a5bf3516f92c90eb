// Shaw et al. relative attention: scores and values each get a learned vector for the clipped distance j - i.
// Plain loops, one query row at a time (row-parallel with OpenMP); masks follow qkv::attention's rules.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/nn/init.h"
#include "qkv/nn/positional/relative.h"

namespace qkv::nn {
namespace {

void check_shaw_dims(int64_t clip, int64_t D) {
  QKV_CHECK_ARG(clip >= 0, "[ShawRelativePosition] clip must be >= 0, got ", clip);
  QKV_CHECK_ARG(D >= 1, "[ShawRelativePosition] D must be >= 1, got ", D);
}

}  // namespace

ShawRelativePosition::ShawRelativePosition(int64_t clip, int64_t D) : clip_(clip), head_dim_(D) {
  check_shaw_dims(clip, D);
  rel_k = Tensor::zeros({2 * clip + 1, D});
  rel_v = Tensor::zeros({2 * clip + 1, D});
  register_parameter("rel_k", &rel_k);
  register_parameter("rel_v", &rel_v);
}

ShawRelativePosition::ShawRelativePosition(int64_t clip, int64_t D, Rng& rng, float init_std)
    : clip_(clip), head_dim_(D) {
  check_shaw_dims(clip, D);
  QKV_CHECK_ARG(std::isfinite(init_std) && init_std >= 0.0f,
                "[ShawRelativePosition] init_std must be finite and >= 0, got ", init_std);
  rel_k = init_normal(rng, {2 * clip + 1, D}, 0.0f, init_std);
  rel_v = init_normal(rng, {2 * clip + 1, D}, 0.0f, init_std);
  register_parameter("rel_k", &rel_k);
  register_parameter("rel_v", &rel_v);
}

AttentionResult ShawRelativePosition::forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const AttentionOptions& options, int64_t query_offset) const {
  QKV_CHECK_ARG(q.defined() && q.dim() == 4 && q.size(-1) == head_dim_, "[ShawRelativePosition] q ",
                q.defined() ? str(q.shape()) : std::string("(undefined)"), " must be (B, H, Tq, ", head_dim_, ")");
  QKV_CHECK_ARG(v.defined() && v.size(-1) == head_dim_, "[ShawRelativePosition] v ",
                v.defined() ? str(v.shape()) : std::string("(undefined)"), " must be (B, H, Tk, ", head_dim_, ")");
  return relative_attention(q, k, v, rel_k, rel_v, clip_, options, query_offset);
}

}  // namespace qkv::nn
