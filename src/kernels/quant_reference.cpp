// The plain dequantizers of ggml's block formats, one loop per type, element by element as ggml-quants.c's
// dequantize_row_* computes them. These are the references the fast paths are tested against.
#include <cstring>
#include <stdexcept>

#include "qkv/core/error.h"
#include "qkv/core/half.h"
#include "qkv/kernels/quant.h"
#include "quant_k.h"

namespace qkv::kernels::portable {
namespace {

using gguf::Type;
constexpr int QK = 32;
constexpr int QK_K = 256;

uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
float f16(const uint8_t* p) { return fp16_to_float(u16(p)); }

// --- 32-element blocks ------------------------------------------------------------------------------------------

void q4_0(const uint8_t* b, float* y) {  // {d, qs[16]}
  const float d = f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + QK / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void q4_1(const uint8_t* b, float* y) {  // {d, m, qs[16]}
  const float d = f16(b), m = f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + QK / 2] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

void q5_0(const uint8_t* b, float* y) {  // {d, qh[4], qs[16]}
  const float d = f16(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < QK / 2; ++j) {
    const int h0 = ((qh >> j) & 1) << 4;
    const int h1 = ((qh >> (j + 16)) & 1) << 4;
    y[j] = static_cast<float>(((qs[j] & 0x0F) | h0) - 16) * d;
    y[j + QK / 2] = static_cast<float>(((qs[j] >> 4) | h1) - 16) * d;
  }
}

void q5_1(const uint8_t* b, float* y) {  // {d, m, qh[4], qs[16]}
  const float d = f16(b), m = f16(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < QK / 2; ++j) {
    const int h0 = ((qh >> j) & 1) << 4;
    const int h1 = ((qh >> (j + 16)) & 1) << 4;
    y[j] = static_cast<float>((qs[j] & 0x0F) | h0) * d + m;
    y[j + QK / 2] = static_cast<float>((qs[j] >> 4) | h1) * d + m;
  }
}

void q8_0(const uint8_t* b, float* y) {  // {d, qs[32]}
  const float d = f16(b);
  for (int j = 0; j < QK; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

void q8_1(const uint8_t* b, float* y) {  // {d, s, qs[32]}
  const float d = f16(b);
  for (int j = 0; j < QK; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[4 + j])) * d;
}

// --- 256-element super-blocks -----------------------------------------------------------------------------------

void q2_k(const uint8_t* b, float* y) {  // {scales[16], qs[64], d, dmin}
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = f16(b + 80), dmin = f16(b + 82);
  // Element k: 2 bits at shift 2 * ((k % 128) / 32) of qs[32 * (k / 128) + k % 32]; scale byte k / 16 holds the
  // scale (low nibble) and the min (high nibble) of its 16 elements.
  for (int k = 0; k < QK_K; ++k) {
    const uint8_t sc = scales[k / 16];
    const float dl = d * static_cast<float>(sc & 0x0F);
    const float ml = dmin * static_cast<float>(sc >> 4);
    const int q = (qs[32 * (k / 128) + k % 32] >> (2 * ((k % 128) / 32))) & 3;
    y[k] = dl * static_cast<float>(q) - ml;
  }
}

void q3_k(const uint8_t* b, float* y) {  // {hmask[32], qs[64], scales[12], d}
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* s = b + 96;
  const float d = f16(b + 108);
  // 16 six-bit scales: the low 4 bits are the nibbles of s[0..7] (low nibbles first), the high 2 bits the
  // bit pairs of s[8..11] (scale i: pair i / 4 of byte 8 + i % 4).
  int scale[16];
  for (int i = 0; i < 16; ++i) {
    const int lo = i < 8 ? (s[i] & 0x0F) : (s[i - 8] >> 4);
    const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    scale[i] = (lo | (hi << 4)) - 32;
  }
  // Element k: 2 low bits as in Q2_K; the high bit is bit k / 32 of hmask[k % 32], and a clear bit subtracts 4.
  for (int k = 0; k < QK_K; ++k) {
    const float dl = d * static_cast<float>(scale[k / 16]);
    const int lo = (qs[32 * (k / 128) + k % 32] >> (2 * ((k % 128) / 32))) & 3;
    const int h = (hmask[k % 32] >> (k / 32)) & 1;
    y[k] = dl * static_cast<float>(lo - (h ? 0 : 4));
  }
}

// Q4_K, Q5_K, Q6_K through the one super-block decoder (quant_k.h): (d * sc) * q - (dmin * m), or
// (d * sc) * (q - 32) for Q6_K.
template <quant_detail::KType kType>
void k_quant(const uint8_t* b, float* y) {
  quant_detail::KSuperBlock s;
  quant_detail::k_super_block(kType, b, s);
  const float d = fp16_to_float(s.d), dmin = fp16_to_float(s.dmin);
  for (int k = 0; k < QK_K; ++k) {
    if constexpr (kType == quant_detail::KType::kQ6) {
      y[k] = d * static_cast<float>(s.sc[k / 16]) * static_cast<float>(static_cast<int>(s.q[k]) - 32);
    } else {
      const float d1 = d * static_cast<float>(s.sc[k / 32]);
      const float m1 = dmin * static_cast<float>(s.mn[k / 32]);
      y[k] = d1 * static_cast<float>(s.q[k]) - m1;
    }
  }
}

void q8_k(const uint8_t* b, float* y) {  // {d float32, qs[256] int8, bsums[16]}
  float d;
  std::memcpy(&d, b, 4);
  for (int k = 0; k < QK_K; ++k) y[k] = d * static_cast<float>(static_cast<int8_t>(b[4 + k]));
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(Type type) {
  switch (type) {
    case Type::Q4_0: return q4_0;
    case Type::Q4_1: return q4_1;
    case Type::Q5_0: return q5_0;
    case Type::Q5_1: return q5_1;
    case Type::Q8_0: return q8_0;
    case Type::Q8_1: return q8_1;
    case Type::Q2_K: return q2_k;
    case Type::Q3_K: return q3_k;
    case Type::Q4_K: return k_quant<quant_detail::KType::kQ4>;
    case Type::Q5_K: return k_quant<quant_detail::KType::kQ5>;
    case Type::Q6_K: return k_quant<quant_detail::KType::kQ6>;
    case Type::Q8_K: return q8_k;
    default: return nullptr;
  }
}

}  // namespace

void dequantize_row(Type type, const void* blocks, float* out, int64_t n) {
  const auto* src = static_cast<const uint8_t*>(blocks);
  switch (type) {
    case Type::F32: std::memcpy(out, src, static_cast<size_t>(n) * 4); return;
    case Type::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16(src + 2 * i);
      return;
    case Type::BF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits_to_float(u16(src + 2 * i));
      return;
    default: break;
  }
  const BlockFn fn = block_fn(type);
  QKV_CHECK_RUNTIME(fn != nullptr, "[dequantize] no dequantizer for ", gguf::type_name(type));
  const int64_t block = gguf::block_size(type), bytes = gguf::type_size(type);
  for (int64_t i = 0; i < n / block; ++i) fn(src + i * bytes, out + i * block);
}

}  // namespace qkv::kernels::portable
