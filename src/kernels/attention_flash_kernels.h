// Private interface between the fused-attention algorithm (attention_flash.cpp, attention_flash_tiles.cpp) and its
// microkernels: one table of function pointers per instruction set (attention_flash_portable.cpp,
// attention_flash_avx2.cpp, attention_flash_avx512.cpp, attention_flash_avx512bf16.cpp).
#pragma once

#include <cstdint>

namespace qkv::kernels::flash {

// One small matrix product on strided operands (all strides in elements of E):
//   A(r, k) = a[r*a_rs + k*a_ks]   B(k, c) = b[k*b_ks + c]   C(r, c) = c[r*c_rs + c]
//   C = accumulate ? row_scale[r] * C + sum_k A(r, k) * B(k, c) : scale * sum_k A(r, k) * B(k, c)
// for r < rows, c < cols, k < depth; row_scale may be nullptr (= 1), scale is 1 but for GemmBf16. B's rows and C's
// rows are contiguous; A is read by broadcasts, so either of its strides may be 1 (A or Aᵀ). Summation order over k
// is fixed: results never depend on threads.
// Gemm: float32 operands. GemmBf16 (the precision kBFloat16 forward): a and b hold 32-bit words of two bfloat16
// along k (low half: the even k), depth counts pairs, and A(r, k)·B(k, c) is the pair's two products; C stays float32.
template <class E>
struct GemmOf {
  int64_t rows = 0, cols = 0, depth = 0;
  const E* a = nullptr;
  int64_t a_rs = 0, a_ks = 0;
  const E* b = nullptr;
  int64_t b_ks = 0;
  float* c = nullptr;
  int64_t c_rs = 0;
  const float* row_scale = nullptr;
  bool accumulate = false;
  // GemmBf16 without accumulate: the score tile's scale folded into the store (the same bits as a pass over C after
  // it). The float32 products take none (1).
  float scale = 1.0f;
};
using Gemm = GemmOf<float>;
using GemmBf16 = GemmOf<uint32_t>;

struct Kernels {
  const char* name;

  void (*gemm)(const Gemm& g);

  // Forward online-softmax step on a transposed score tile st (rows = keys j < nk, row stride ld; columns =
  // queries c < ncols, ncols a multiple of 8 and <= ld), in log2 units with masks applied (-inf = blocked).
  // Per column: m_new = max(m, max_j st), alpha = 2^(m - m_new), st = 2^(st - m_new), l = alpha*l + sum_j st.
  // A column still fully masked keeps m = -inf, gives alpha = 0 and st = 0 (never NaN).
  void (*softmax_cols)(float* st, int64_t ld, int64_t nk, int64_t ncols, float* m, float* l, float* alpha);

  // Scores for a few queries (nq <= 8) by dot products, transposed: st[j*ld + i] = sum_d q[i*dk + d]*k[j*k_rs + d]
  // for j < nk, i < nq. Columns nq..ld-1 are left alone.
  void (*dot_scores)(const float* q, int64_t nq, int64_t dk, const float* k, int64_t k_rs, int64_t nk, float* st,
                     int64_t ld);

  // Backward, per row r < rows of a (query × key) tile with row stride ld (scores s in log2 units), c < cols:
  //   p = 2^(s + bias - lse2[r])   (bias nullptr = 0; -inf = blocked; lse2 = +inf on fully masked rows: p = 0)
  //   s  <- p
  //   dp <- scale * p * (dp - delta[r])
  void (*bwd_probs)(float* s, const float* bias, float* dp, int64_t ld, int64_t rows, int64_t cols,
                    const float* lse2, const float* delta, float scale);

  // The bf16 products (vdpbf16ps); nullptr where the set has none (the forward then runs float32 products on the
  // bf16-rounded inputs).
  void (*gemm_bf16)(const GemmBf16& g) = nullptr;
  // Pair words for it, each half rounded to nearest even (qkv/kernels/lowp.h's rounding):
  //   pairs_of_rows:     out[i] = (x0[i], x1[i])  for i < n  (x1 nullptr: 0)
  //   pairs_of_adjacent: out[i] = (x[2i], x[2i+1]) for i < n
  void (*pairs_of_rows)(const float* x0, const float* x1, int64_t n, uint32_t* out) = nullptr;
  void (*pairs_of_adjacent)(const float* x, int64_t n, uint32_t* out) = nullptr;
};

const Kernels& portable_kernels();
const Kernels& avx2_kernels();    // only call when the CPU has AVX2 and FMA
const Kernels& avx512_kernels();  // only call when the CPU has AVX-512 F, BW, DQ and VL
const Kernels& avx512bf16_kernels();  // avx512's, plus gemm_bf16: only call when the CPU has AVX512-BF16
// avx512bf16's with gemm_bf16 on AMX tiles (only call when cpu_supports(Isa::kAmx)), or over the emulated tile unit
// (tests; only call when the CPU has AVX512-BF16). The products themselves: lowp_amx.cpp.
const Kernels& amx_kernels();
const Kernels& amx_emulated_kernels();
void gemm_bf16_amx(const GemmBf16& g);
void gemm_bf16_amx_emulated(const GemmBf16& g);
// The same walk over the emulated tile unit with plain-loop copies and stores (any CPU; lowp.cpp): their reference.
void gemm_bf16_amx_reference(const GemmBf16& g);

}  // namespace qkv::kernels::flash
