// Causal self-attention over a (batch, heads, time, head_dim) tensor through the installed qkv library.
#include <cstdio>

#include "qkv/core/rng.h"
#include "qkv/ops/attention.h"

int main() {
  qkv::Rng rng(42);
  // q, k, v: (B=2, H=4, T=16, D=32)
  const qkv::Tensor q = rng.normal({2, 4, 16, 32});
  const qkv::Tensor k = rng.normal({2, 4, 16, 32});
  const qkv::Tensor v = rng.normal({2, 4, 16, 32});

  qkv::AttentionOptions options;
  options.causal = qkv::Causal::kTopLeft;  // query i sees keys 0..i
  options.return_lse = true;
  const qkv::AttentionResult r = qkv::attention(q, k, v, options);

  std::printf("out %s, lse %s, out[0,0,0,0] = %.6f\n", qkv::str(r.out.shape()).c_str(),
              qkv::str(r.lse.shape()).c_str(), r.out.at({0, 0, 0, 0}));
  return 0;
}
