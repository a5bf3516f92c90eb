// Low-precision kernels behind qkv::Precision (qkv/core/precision.h): bfloat16 rounding and conversion, and the
// int8 linear (symmetric per-row quantization, int32 accumulation). Each has a portable reference and an AVX2
// build; the dispatchers pick by active_isa() (qkv/kernels/cpu.h), and lowp_paths() names what runs.
//
// bfloat16 here is round to nearest even of float32's top 16 bits: NaN stays NaN (made quiet, sign kept), ±inf
// stays ±inf, and a finite value past bfloat16's largest rounds to ±inf, as PyTorch's and the hardware's
// conversions do. This CPU class has no bf16 arithmetic (no AVX512-BF16, no AMX), so a bf16 product is "round the
// operands, then the float32 kernel": the same FLOPs as float32 plus one rounding pass over the activations.
#pragma once

#include <cstdint>
#include <vector>

namespace qkv::kernels {

// One float rounded to bfloat16 (kept as a float: its low 16 bits are zero).
float bf16_round(float x);

// y[i] = bf16_round(x[i]) for i < n; y may equal x. Threaded over large n.
void bf16_round(const float* x, float* y, int64_t n);
// Packed bfloat16 bits and back (exact).
void float_to_bf16(const float* x, uint16_t* y, int64_t n);
void bf16_to_float(const uint16_t* x, float* y, int64_t n);

// Int8 rows as the int8 kernel reads them: values in [-127, 127] held in int16 (the AVX2 path multiplies int16
// pairs with vpmaddwd into int32, exact; it never uses the saturating vpmaddubsw), each row padded with zeros to
// ld = cols rounded up to 16. scale[r] = max |row r| / 127 (0 for an all-zero row, NaN for a row with a non-finite
// value, so that the products of that row are NaN rather than silently finite). An Int8View is some of those rows
// without copying: what the int8 product reads.
struct Int8View {
  const int16_t* q = nullptr;
  const float* scale = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
};
struct Int8Rows {
  int64_t rows = 0, cols = 0, ld = 0;
  std::vector<int16_t> q;    // rows * ld
  std::vector<float> scale;  // rows
  Int8View view(int64_t begin, int64_t end) const;  // rows [begin, end), sharing the data
  Int8View view() const { return view(0, rows); }
};
int64_t int8_ld(int64_t cols);

// Symmetric per-row quantization: q = round_to_nearest_even(x / scale) with scale = max|x| / 127, computed as
// x · (127 / max|x|). x (rows, cols) with row stride ldx. Threaded over rows.
void quantize_rows_int8(const float* x, int64_t rows, int64_t cols, int64_t ldx, Int8Rows& out);

// c (m, n) row-major with ldc: c[i][j] = float(Σ_k a.q[i][k] · b.q[j][k]) · (a.scale[i] · b.scale[j]) + bias[j]
// (bias may be null). a and b must have the same cols; the int32 sums are exact (cols <= 2^17 is required).
// Threaded over blocks of c; bit-identical for every thread count and between the portable and AVX2 builds.
void gemm_int8_nt(const Int8View& a, const Int8View& b, const float* bias, float* c, int64_t ldc);

// One path by name, for tests (avx2:: only when cpu_supports(Isa::kAvx2)). Ranges of elements / of c's rows
// [m0, m1) and columns [n0, n1).
namespace portable {
void bf16_round_range(const float* x, float* y, int64_t n);
void float_to_bf16_range(const float* x, uint16_t* y, int64_t n);
void bf16_to_float_range(const uint16_t* x, float* y, int64_t n);
void gemm_int8_block(const Int8View& a, const Int8View& b, const float* bias, float* c, int64_t ldc, int64_t m0,
                     int64_t m1, int64_t n0, int64_t n1);
}  // namespace portable
namespace avx2 {
void bf16_round_range(const float* x, float* y, int64_t n);
void float_to_bf16_range(const float* x, uint16_t* y, int64_t n);
void bf16_to_float_range(const uint16_t* x, float* y, int64_t n);
void gemm_int8_block(const Int8View& a, const Int8View& b, const float* bias, float* c, int64_t ldc, int64_t m0,
                     int64_t m1, int64_t n0, int64_t n1);
}  // namespace avx2

// What the bf16 and int8 products run on this CPU under the QKV_ISA cap, for `qkv info` and qkv.cpu_info():
//   bf16 "converting (no AVX512-BF16/AMX on this CPU): bf16-rounded operands, float32 avx2 kernels"
//   int8 "avx2 vpmaddwd (int16 pairs, int32 accumulation; no VNNI/AMX on this CPU)"
struct LowpPaths {
  const char* bf16;
  const char* int8;
};
LowpPaths lowp_paths();

}  // namespace qkv::kernels
