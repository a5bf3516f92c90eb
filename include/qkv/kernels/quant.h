// ggml's block formats (GGUF tensor types) to float32: one plain reference dequantizer per type, written as
// ggml-quants.c's dequantize_row_* defines it, and the entry points the loaders call.
#pragma once

#include <cstdint>

#include "qkv/core/gguf.h"
#include "qkv/core/tensor.h"

namespace qkv::kernels {

// Block layouts (little-endian; d, m, dmin are fp16 unless noted; QK_K = 256), value of element j of a block:
//   F32, F16, BF16  one element per "block"
//   Q4_0  {d, qs[16]}               x = d * (q - 8), q = nibble: low nibbles are elements 0..15, high 16..31
//   Q4_1  {d, m, qs[16]}            x = d * q + m
//   Q5_0  {d, qh[4], qs[16]}        x = d * (q - 16), q = nibble | bit j of the u32 qh << 4
//   Q5_1  {d, m, qh[4], qs[16]}     x = d * q + m
//   Q8_0  {d, qs[32] int8}          x = q * d
//   Q8_1  {d, s, qs[32] int8}       x = q * d (s = d * sum(q) is for the dot products only)
//   Q2_K  {scales[16], qs[64], d, dmin}               x = (d * sc) * q - (dmin * m), 4-bit sc and m per 16
//   Q3_K  {hmask[32], qs[64], scales[12], d}          x = (d * (sc - 32)) * (q - (hbit ? 0 : 4)), 6-bit sc per 16
//   Q4_K  {d, dmin, scales[12], qs[128]}              x = (d * sc) * q - (dmin * m), 6-bit sc and m per 32
//   Q5_K  {d, dmin, scales[12], qh[32], qs[128]}      the same with a fifth bit from qh
//   Q6_K  {ql[128], qh[64], scales[16] int8, d}       x = (d * sc) * (q - 32), q 6 bits, sc per 16
//   Q8_K  {d float32, qs[256] int8, bsums[16] int16}  x = d * q
// Each product is one float32 multiply (and one subtract or add) in that order, as ggml and gguf-py compute it,
// so every reference gives the same bits as gguf.quants.dequantize.

// True for the types above.
bool can_dequantize(gguf::Type type);

// out[0, n) = the n elements stored in `blocks` (n / block_size(type) blocks of type_size(type) bytes; blocks need
// no alignment). n must be a non-negative multiple of block_size(type) (std::invalid_argument otherwise); a type
// without a dequantizer throws std::runtime_error "[dequantize] no dequantizer for IQ2_XXS".
void dequantize_row(gguf::Type type, const void* blocks, float* out, int64_t n);

// A whole tensor as a float32 Tensor in row-major shape (ne reversed: a (ne0, ne1) matrix becomes (ne1, ne0)).
Tensor dequantize(const gguf::TensorInfo& tensor);

namespace portable {
// The plain loops, one per type; dequantize_row's reference.
void dequantize_row(gguf::Type type, const void* blocks, float* out, int64_t n);
}  // namespace portable

}  // namespace qkv::kernels
