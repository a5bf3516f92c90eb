// Low-precision kernels behind qkv::Precision (qkv/core/precision.h): bfloat16 rounding and conversion, and the
// int8 linear (symmetric per-row quantization, int32 accumulation). Each has a portable reference and an AVX2
// build; the dispatchers pick by active_isa() (qkv/kernels/cpu.h), and lowp_paths() names what runs.
//
// bfloat16 here is round to nearest even of float32's top 16 bits: NaN stays NaN (made quiet, sign kept), ±inf
// stays ±inf, and a finite value past bfloat16's largest rounds to ±inf, as PyTorch's and the hardware's
// conversions do. Where the CPU has AVX512-BF16 (Isa::kAvx512Bf16), the bf16 product runs vdpbf16ps on weights
// packed once (PackedB below); elsewhere it is "round the operands, then the float32 kernel". Where it has
// AVX512-VNNI (Isa::kAvx512Vnni), the int8 product runs vpdpbusd zmm on packed weights, where it has AVX2 and
// AVX-VNNI but no AVX-512 (Isa::kAvx2Vnni) vpdpbusd ymm on the same packed weights, where it has AVX2 alone the
// same quads widened to int16 pairs for vpmaddwd; elsewhere portable loops on unpacked rows. Every int8 build gives
// the same bits (exact int32 sums, the same float epilogue). Which build runs is one table per ISA in lowp.cpp.
//
// Packed products (gemm_bf16_packed, gemm_int8_packed). The weight W (n, k) is packed once into panels of
// kPanel = 32 output columns: panel p holds columns [32p, 32p + 32) as k-groups of 4 bytes per column,
// [group][column][4 bytes]: 2 bfloat16 (k, k+1) for bf16, 4 int8 (k..k+3) for int8, zero past k and past n.
// The activations are packed per call the same way, [group][row][4 bytes], rows in blocks of 14.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/core/storage_pool.h"

namespace qkv::kernels {

// One float rounded to bfloat16 (kept as a float: its low 16 bits are zero).
float bf16_round(float x);

// y[i] = bf16_round(x[i]) for i < n; y may equal x. Threaded over large n.
void bf16_round(const float* x, float* y, int64_t n);
// Packed bfloat16 bits and back (exact).
void float_to_bf16(const float* x, uint16_t* y, int64_t n);
void bf16_to_float(const uint16_t* x, float* y, int64_t n);

// Int8 rows as the int8 kernels read them: values in [-127, 127] held in int16 (the packing reads them as bytes;
// every product's int32 sums are exact, none uses the saturating vpmaddubsw), each row padded with zeros to
// ld = cols rounded up to kInt8Group. Each row has one scale per `group` columns: group == ld (one scale per row:
// the weights, per output channel) or kInt8Group (the activations: per token and per 64 input channels, as
// llama.cpp's activation blocks, so that the few outlier channels of a transformer's hidden state coarsen only
// their own block). scale[r * groups + g] = max |row r, block g| / 127 (0 for an all-zero block, NaN for every
// block of a row with a non-finite value, so that the products of that row are NaN rather than silently finite).
// An Int8View is some of those rows without copying: what the int8 product reads.
inline constexpr int64_t kInt8Group = 64;
struct Int8View {
  const int16_t* q = nullptr;
  const float* scale = nullptr;
  int64_t rows = 0, cols = 0, ld = 0, group = 0;
  int64_t groups() const { return group > 0 ? ld / group : 0; }
};
struct Int8Rows {
  int64_t rows = 0, cols = 0, ld = 0, group = 0;
  std::vector<int16_t> q;    // rows * ld
  std::vector<float> scale;  // rows * (ld / group)
  Int8View view(int64_t begin, int64_t end) const;  // rows [begin, end), sharing the data
  Int8View view() const { return view(0, rows); }
};
int64_t int8_ld(int64_t cols);

// Symmetric quantization of x (rows, cols) with row stride ldx: per row (per_row = true: the weights) or per row
// and block of kInt8Group columns (the activations). q = round_to_nearest_even(x / scale), scale = max|x| / 127,
// computed as x · (127 / max|x|). Threaded over rows.
void quantize_rows_int8(const float* x, int64_t rows, int64_t cols, int64_t ldx, Int8Rows& out, bool per_row);

// c (m, n) row-major with ldc: for a (activations, any grouping) and b (weights, one scale per row) with the same
// cols, the int32 sum of each block g of a row pair, exact, is scaled and summed in block order,
//   acc = 0;  acc = fma(float(Σ_{k in g} a.q[i][k] · b.q[j][k]), a.scale[i][g], acc)  for g = 0, 1, ...
//   c[i][j] = acc · b.scale[j] + bias[j]   (bias may be null)
// (cols <= 2^17 is required). Threaded over blocks of c; bit-identical for every thread count and to the packed
// builds (plain loops: from avx2 on, int8 weights are packed and gemm_int8_packed runs).
void gemm_int8_nt(const Int8View& a, const Int8View& b, const float* bias, float* c, int64_t ldc);

// One path by name, for tests (avx2:: only when cpu_supports(Isa::kAvx2)). Ranges of elements / of c's rows
// [m0, m1) and columns [n0, n1).
namespace portable {
// One row of quantize_rows_int8: q (zero-filled, >= blocks * group entries) and scale (blocks entries).
void quantize_row_int8(const float* x, int64_t cols, int64_t group, int64_t blocks, int16_t* q, float* scale);
void bf16_round_range(const float* x, float* y, int64_t n);
void float_to_bf16_range(const float* x, uint16_t* y, int64_t n);
void bf16_to_float_range(const uint16_t* x, float* y, int64_t n);
void gemm_int8_block(const Int8View& a, const Int8View& b, const float* bias, float* c, int64_t ldc, int64_t m0,
                     int64_t m1, int64_t n0, int64_t n1);
}  // namespace portable
namespace avx2 {
void quantize_row_int8(const float* x, int64_t cols, int64_t group, int64_t blocks, int16_t* q, float* scale);
void bf16_round_range(const float* x, float* y, int64_t n);
void float_to_bf16_range(const float* x, uint16_t* y, int64_t n);
void bf16_to_float_range(const uint16_t* x, float* y, int64_t n);
}  // namespace avx2

// A packed weight (see above) and the per-column data of the int8 one; view(begin, end) is the weight of output
// columns [begin, end) without copying (begin need not be a multiple of 32: the kernels skip the first
// begin % 32 columns of the first panel).
inline constexpr int64_t kPanel = 32;
struct PackedBView {
  const uint32_t* data = nullptr;  // the panel holding column `col0`
  const int32_t* colsum = nullptr;  // int8: Σ_{k in block g} w[j][k], [panel][g][32], from the view's first panel
  const float* scale = nullptr;     // int8: the per-column scale, likewise
  int64_t col0 = 0, n = 0, k = 0, groups = 0;
};
struct PackedB {
  int64_t n = 0, k = 0, groups = 0;  // groups = ceil(k / 2) for bf16, ceil(k / 4) for int8
  std::vector<uint32_t, storage_pool::SystemAllocator<uint32_t>> data;  // ceil(n / 32) panels of groups * 32 words
  std::vector<int32_t> colsum;       // int8 only: per panel, block and column (blocks of kInt8Group k)
  std::vector<float> scale;          // int8 only: likewise
  PackedBView view(int64_t begin, int64_t end) const;
  PackedBView view() const { return view(0, n); }
};

// W(j, p) = w[j * stride_n + p * stride_k] for j < n, p < k (so (n, k) row-major is stride_n = ldw, stride_k = 1,
// and a (k, n) row-major B is stride_n = 1, stride_k = ldb), rounded to bfloat16 and packed. With AVX512-BF16
// active (the only path that reads the packing) by vector loads per panel, else a loop per element: the same words.
void pack_bf16(const float* w, int64_t n, int64_t k, int64_t stride_n, int64_t stride_k, PackedB& out);
// Int8 weight rows (one scale per row, one per output column) packed with their per-block column sums (for the
// +128 offset of the activations) and scales; k <= 65536.
void pack_int8(const Int8View& w, PackedB& out);
inline constexpr int64_t kInt8PackedMaxK = 65536;

// c (m, n) row-major with ldc: c[i][j] = Σ_k bf16(x[i][k]) · w[j][k] + bias[j], float32 accumulation, x (m, k)
// at x[i * ldx + k * xks]: rows (xks 1, ldx >= k) or a transposed operand (ldx 1, xks >= m), both read by vector
// loads; other strides one element at a time. Runs the amx build for m >= kAmxMinRows rows of x in rows where
// active_isa() is amx, else the avx512bf16 build (throws std::runtime_error when active_isa() is below it).
// Threaded over blocks of c; the same bits for every thread count (and, on the avx512bf16 build, every layout).
void gemm_bf16_packed(const float* x, int64_t m, int64_t ldx, const PackedBView& w, const float* bias, float* c,
                      int64_t ldc, int64_t xks = 1);
// The int8 product of gemm_int8_nt over a packed weight: the avx512vnni build when active_isa() >= kAvx512Vnni,
// the avxvnni one when active_isa() == kAvx2Vnni, the avx2 one on avx2 and avx512; throws std::runtime_error on the
// portable path
// (gemm_int8_packed_runs() says whether it runs: where it does, int8 linear weights are packed). The same bits as
// gemm_int8_nt on the unpacked rows. gemm_bf16_packed_runs() likewise says whether gemm_bf16_packed runs (where it
// does not, a bf16 product rounds its operands and runs the float32 kernels): the callers ask these, never the ISA.
void gemm_int8_packed(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc);
bool gemm_int8_packed_runs();
bool gemm_bf16_packed_runs();

// One tile of the packed products by name, for tests: rows [m0, m1) of c over the view's columns [n0, n1)
// (the portable builds are the plain references; avx512bf16:: needs Isa::kAvx512Bf16, avx512vnni:: kAvx512Vnni,
// avxvnni:: cpu_supports(Isa::kAvx2Vnni), avx2:: cpu_supports(Isa::kAvx2)).
namespace portable {
void gemm_bf16_packed_block(const float* x, int64_t ldx, const PackedBView& w, const float* bias, float* c,
                            int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t xks = 1);
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1);
}  // namespace portable
// AMX (Isa::kAmx): passes of 32 rows x 32 columns of c on the tiles, bf16 by tdpbf16ps (x in rows, ldx >= k apart;
// float32 accumulation in the tile's own order: within float32 slack of the float64 product of the rounded
// operands, not the vdpbf16ps build's bits) and int8 by tdpbusd (one step per block of kInt8Group k: the bits of
// every other int8 build). gemm_bf16_packed and gemm_int8_packed run them for m >= kAmxMinRows rows (fewer rows,
// and a transposed bf16 x, run the AVX-512 builds). amx:: needs cpu_supports(Isa::kAmx); amx_emulated_tiles:: is
// the same code over an emulated tile unit (needs cpu_supports(Isa::kAvx512Bf16)); amx_emulated:: that walk with
// plain loops for the row work too (every CPU). The three give the same bits where they run, for tests.
inline constexpr int64_t kAmxMinRows = 16;
namespace amx {
void gemm_bf16_packed_block(const float* x, int64_t ldx, const PackedBView& w, const float* bias, float* c,
                            int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1);
}  // namespace amx
namespace amx_emulated_tiles {
void gemm_bf16_packed_block(const float* x, int64_t ldx, const PackedBView& w, const float* bias, float* c,
                            int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1);
}  // namespace amx_emulated_tiles
namespace amx_emulated {
void gemm_bf16_packed_block(const float* x, int64_t ldx, const PackedBView& w, const float* bias, float* c,
                            int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1);
// The whole bf16 product through gemm_bf16_packed's threaded AMX driver (passes of 32 rows), emulated.
void gemm_bf16_packed(const float* x, int64_t m, int64_t ldx, const PackedBView& w, const float* bias, float* c,
                      int64_t ldc);
}  // namespace amx_emulated
namespace avx512bf16 {
void gemm_bf16_packed_block(const float* x, int64_t ldx, const PackedBView& w, const float* bias, float* c,
                            int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t xks = 1);
// Panels [p0, p1) of pack_bf16's layout into data (which holds every panel).
void pack_bf16_panels(const float* w, int64_t n, int64_t k, int64_t stride_n, int64_t stride_k, int64_t p0,
                      int64_t p1, uint32_t* data);
}  // namespace avx512bf16
namespace avx512vnni {
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1);
}  // namespace avx512vnni
namespace avx2 {  // vpdpbusd's quads widened to vpmaddwd pairs (cpu_supports(Isa::kAvx2))
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1);
}  // namespace avx2
namespace avxvnni {
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1);
}  // namespace avxvnni

// What the bf16 and int8 products run on this CPU under the QKV_ISA cap, for `qkv info` and qkv.cpu_info():
//   bf16 "amx tdpbf16ps (weights packed once, float32 accumulation; under 16 rows avx512bf16 vdpbf16ps)", or
//        "converting (no AVX512-BF16/AMX on this CPU): bf16-rounded operands, float32 avx2 kernels"
//   int8 "avx2 vpmaddwd (weights packed once, u8·s8 quads as int16 pairs, exact int32 accumulation; no VNNI on
//        this CPU)", or on an AVX-VNNI CPU without
//        AVX-512 "avx2vnni vpdpbusd ymm (weights packed once, exact int32 accumulation; no AVX-512 on this CPU)"
struct LowpPaths {
  const char* bf16;
  const char* int8;
};
LowpPaths lowp_paths();

}  // namespace qkv::kernels
