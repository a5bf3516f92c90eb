// Linear layers on ggml-quantized weights read in their stored blocks (GGUF tensors): y = x·Wᵀ + bias with the
// activations quantized per 32 as llama.cpp does and exact integer sums per block (the K-quants Q4_K, Q5_K, Q6_K
// per sub-block); a float32 path for other types.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qkv/core/gguf.h"

namespace qkv::kernels {

// A weight matrix W (rows n = output features, cols k = input features) in ggml's stored layout: row j is
// gguf::row_bytes(type, k) bytes at data + j * row_bytes, its k elements in blocks of gguf::block_size(type).
// A GGUF tensor with ne = (k, n) is such a matrix. `owner` keeps the bytes alive (the mapping, a buffer); the view
// copies nothing, and slice(begin, end) is the rows [begin, end) (a pointer offset).
struct QuantMatrix {
  gguf::Type type = gguf::Type::F32;
  int64_t rows = 0;  // n
  int64_t cols = 0;  // k
  int64_t row_bytes = 0;
  const uint8_t* data = nullptr;
  std::shared_ptr<const void> owner;
  // The SIMD builds' copy of the rows' whole 16-row tiles (repacked(); nullptr: none, products read `data`):
  // tile t (rows 16t..16t+15) is packed_stride bytes at packed + t * packed_stride, 64-byte aligned. Per tile, for
  // blocks b in order: the u8 operands of vpdpbusd with 32-bit lane r = row r (Q4_0 / Q4_1 / Q5_0 / Q5_1: 4 vectors
  // of 64 bytes, vector h lane r = the row's nibble bytes 4h..4h+3, so low nibbles are elements 4h.. and high
  // nibbles 16 + 4h..; Q8_0: 8 vectors, vector g lane r = elements 4g..4g+3 as w + 128); then (Q5_0 / Q5_1) per
  // block 8 u64 masks, mask g bit 4r + e = the fifth bit of element 4g + e of row r; then the 16 rows' fp16 d per
  // block; then (Q4_1 / Q5_1) their fp16 m. The same bytes as the stored blocks, rearranged. K-quants (Q4_K, Q5_K,
  // Q6_K; src/kernels/quant_gemm_impl.h k_tile_layout): per block of 32 the same 4 nibble vectors (of the low 4
  // bits), then per block the high bits (Q5_K: the 8 masks as Q5_0; Q6_K: 2 vectors of 2-bit fields), the 16 rows'
  // sub-block scales one byte each (and Q4_K / Q5_K mins; Q6_K: the scales of elements 0..15, then 16..31), and per
  // super-block the rows' fp16 d (and dmin): the file's bytes plus 4 per row and super-block for Q4_K / Q5_K (their
  // 6-bit scales and mins unpacked), none for Q6_K, each tile padded to 64 bytes.
  const uint8_t* packed = nullptr;
  int64_t packed_stride = 0;
  std::shared_ptr<const void> packed_owner;

  // Checks: cols >= 0 a multiple of the type's block size, rows >= 0, data non-null when rows * cols > 0, a type
  // ggml defines; std::invalid_argument "[quant_matrix] ..." otherwise.
  static QuantMatrix view(gguf::Type type, int64_t rows, int64_t cols, const void* data,
                          std::shared_ptr<const void> owner = {});
  // A 2-D GGUF tensor (ne = (k, n)); `owner` should keep its File alive (e.g. std::make_shared<gguf::File>(file)).
  static QuantMatrix from_tensor(const gguf::TensorInfo& tensor, std::shared_ptr<const void> owner);

  // rows [begin, end); std::invalid_argument outside. The packed tiles stay where begin is a multiple of 16.
  QuantMatrix slice(int64_t begin, int64_t end) const;
  // This matrix with its whole 16-row tiles repacked into an owned buffer (the layout above; integer types, rows >=
  // 16; other matrices are returned as they are). for_products(): repacked() where gemm_quant runs the avx512vnni
  // build, and for the K-quants where it runs the avx2 one, else the matrix as it is. The products' bits do not
  // depend on it.
  QuantMatrix repacked() const;
  QuantMatrix for_products() const;
  // for_products() without the stored rows where the products here read the repacked tiles only (every row in a
  // whole tile, and the avx512vnni build, or the avx2 build on a K type): the rows' bytes (a permuted copy made at
  // load) need not stay. Otherwise for_products() as it is. A product that would read the dropped rows (another
  // build, the reference, embedding_rows, a slice off the tiles) throws std::runtime_error rather than read them.
  QuantMatrix packed_only() const;
  bool defined() const { return data != nullptr || packed != nullptr || rows * cols == 0; }
};

// True for the weight types with an integer product (activations quantized per 32, exact int32 sums per block):
// Q4_0, Q5_0, Q8_0 (activations as ggml's Q8_0), Q4_1, Q5_1 (as ggml's Q8_1, with the block sum) and the K-quants
// Q4_K, Q5_K, Q6_K (per 32-element sub-block, or pair of 16-element ones). Q2_K, Q3_K run the float32 path.
bool quant_gemm_integer(gguf::Type type);

// y (m, n) = x (m, k) · Wᵀ + bias (n, or nullptr); rows of x ldx apart, of y ldy apart.
//   Integer types: each row of x is quantized per block of 32 as ggml's quantize_row_q8_0_ref / q8_1_ref
//   (d = amax / 127 stored as fp16, q = roundf(x / d) computed as x * (1 / d), and for Q8_1 s = fp16(d · Σq)); per
//   block the exact int32 sum Σ w·q, then acc += sumi · (dw · dx) (+ mw · sx for Q4_1 / Q5_1) in float32, blocks in
//   order from acc = 0, and y = acc + bias. The K-quants, w their element values (q, Q6_K q - 32) per block of 32:
//   Q4_K / Q5_K acc += sumi · ((d · sc) · dx) - (dmin · m) · (dx · Σq); Q6_K acc += lo · ((d · sc_lo) · dx) +
//   hi · ((d · sc_hi) · dx) with lo, hi the sums over elements 0..15 and 16..31 (each term computed, then added).
//   A block of x with a non-finite value makes its row's outputs NaN.
//   Other types (F32, F16, BF16, Q8_1, Q2_K, Q3_K, Q8_K): each weight row dequantized to float32 (kernels::
//   dequantize_row) and dotted with x in float32 in a fixed order (8 lanes by index mod 8, then a fixed tree).
// Every path gives the portable reference's bits (NaN outputs are NaN in all, their payloads aside); a row's
// outputs do not depend on m, on the row's place in the batch or on the thread count. Threads: OpenMP over fixed blocks of output columns.
// Errors (std::invalid_argument "[gemm_quant] ..." naming the shapes): m < 0, ldx < k, ldy < n, null pointers
// where rows are read or written, an undefined matrix; a type without a dequantizer throws std::runtime_error.
void gemm_quant(const float* x, int64_t m, int64_t ldx, const QuantMatrix& w, const float* bias, float* y,
                int64_t ldy);

// Several products of one x (m, k), each y_i (m, n_i) = x · W_iᵀ + bias_i (an attention layer's Q, K and V): x
// quantized once and one OpenMP region over the column tiles of all of them (a decode step's small K and V run beside
// Q instead of on one thread after it). Every output has gemm_quant's bits. The weights must share k; a product whose
// type has no integer product runs gemm_quant on its own. Errors: gemm_quant's, "[gemm_quant_many] ..." naming the
// shapes where the weights' k differ.
struct QuantProduct {
  const QuantMatrix* w = nullptr;
  const float* bias = nullptr;  // (n) or nullptr
  float* y = nullptr;           // rows ldy apart
  int64_t ldy = 0;
};
void gemm_quant_many(const float* x, int64_t m, int64_t ldx, const QuantProduct* products, int64_t count);

// The gated MLP (SwiGLU) of a Llama layer on integer-type weights, y (m, e) = h · Dᵀ + bd with
// h (m, f) = silu(x · Gᵀ + bg) ⊙ (x · Uᵀ + bu): x (m, e) rows ldx apart, gate and up (f, e), down (e, f), biases
// (or nullptr) of their outputs; y rows ldy apart. The same bits as its reference, the composition gemm_quant(gate),
// gemm_quant(up), silu_forward (qkv/kernels/activations.h), the product, gemm_quant(down), and so batch invariant
// and thread-count invariant as gemm_quant. Fast path of a decode step: x quantized once for gate and up, and one
// OpenMP region over fixed blocks of 32 columns: each thread's gate / up columns, their SiLU · up and h's block of
// 32 quantized at once, a barrier, then its blocks of down's columns.
// Errors: std::invalid_argument "[gated_mlp_quant] ..." naming the shapes where a weight is not an integer type
// (quant_gemm_integer), gate and up differ in type or shape, down is not (e, f), f is not a multiple of 32, or
// m < 0, ldx < e, ldy < e, null pointers.
void gated_mlp_quant(const float* x, int64_t m, int64_t ldx, const QuantMatrix& gate, const float* gate_bias,
                     const QuantMatrix& up, const float* up_bias, const QuantMatrix& down, const float* down_bias,
                     float* y, int64_t ldy);
void gated_mlp_quant_reference(const float* x, int64_t m, int64_t ldx, const QuantMatrix& gate,
                               const float* gate_bias, const QuantMatrix& up, const float* up_bias,
                               const QuantMatrix& down, const float* down_bias, float* y, int64_t ldy);

// What gemm_quant runs here: "avx512vnni", "avx2" or "portable" (the integer product's build, by active_isa());
// with a type, the same for an integer type, else "float32 (dequantized rows)".
const char* quant_gemm_path();
std::string quant_gemm_path(gguf::Type type);

// out (count, k) = the rows ids[0..count) of W dequantized to float32 (a quantized token embedding). An id outside
// [0, rows) throws std::invalid_argument "[embedding_rows] ...".
void embedding_rows(const QuantMatrix& w, const int64_t* ids, int64_t count, float* out);

// Activations quantized per block of 32 as above (for the tests and the per-path entry points): row i's block b is
// q[i * cols + 32 b ..], scale d[i * blocks + b] (the fp16 value as float; NaN for a non-finite block), s (Q8_1's
// fp16(d · Σq) as float; NaN likewise) and sum (Σq, int).
struct QuantActivations {
  int64_t rows = 0, cols = 0, blocks = 0;
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int32_t> sum, sum_lo;  // Σq of the block, and of its first 16 (0 for a non-finite block)
};
// quantize_activations runs the avx512vnni build's vector quantizer where gemm_quant runs that build (the same
// bits); quantize_activations_reference is the plain loop that defines them.
void quantize_activations(const float* x, int64_t m, int64_t ldx, int64_t k, QuantActivations& out);
void quantize_activations_reference(const float* x, int64_t m, int64_t ldx, int64_t k, QuantActivations& out);

// float32 -> IEEE half bits, round to nearest even (overflow to inf, NaN kept quiet): ggml's GGML_FP32_TO_FP16.
uint16_t fp16_from_float(float f);

// The builds, for the tests: each checks its arguments as gemm_quant does; avx2:: and avx512:: throw
// std::runtime_error "[gemm_quant] ..." where the CPU lacks AVX2 / AVX512-VNNI. Types without an integer product
// run the float32 path (one build) in all three. The K-quants' tiles read the repacked copy, or pack a tile of the
// stored rows into scratch per call where the matrix has none.
namespace portable {
void gemm_quant(const float* x, int64_t m, int64_t ldx, const QuantMatrix& w, const float* bias, float* y,
                int64_t ldy);
}  // namespace portable
namespace avx2 {
void gemm_quant(const float* x, int64_t m, int64_t ldx, const QuantMatrix& w, const float* bias, float* y,
                int64_t ldy);
}  // namespace avx2
namespace avx512 {  // the avx512vnni build (vpdpbusd)
void gemm_quant(const float* x, int64_t m, int64_t ldx, const QuantMatrix& w, const float* bias, float* y,
                int64_t ldy);
}  // namespace avx512

}  // namespace qkv::kernels
