// QuantMatrix (qkv/kernels/quant_gemm.h): the view of a GGUF tensor's stored rows, its slices, and the copy of its
// whole 16-row tiles repacked once for the SIMD builds (the layout quant_gemm.h describes), made where the products
// here read it.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/kernels/cpu.h"
#include "qkv/kernels/quant_gemm.h"
#include "quant_gemm_impl.h"

namespace qkv::kernels {

// --- the matrix view ---------------------------------------------------------------------------------------------

QuantMatrix QuantMatrix::view(gguf::Type type, int64_t rows, int64_t cols, const void* data,
                              std::shared_ptr<const void> owner) {
  QKV_CHECK_ARG(gguf::type_known(static_cast<uint32_t>(type)), "[quant_matrix] unknown ggml type ",
                static_cast<uint32_t>(type));
  const int64_t block = gguf::block_size(type);
  QKV_CHECK_ARG(rows >= 0 && cols >= 0 && cols % block == 0, "[quant_matrix] (rows, cols) = (", rows, ", ", cols,
                ") of ", gguf::type_name(type), ": cols must be a non-negative multiple of ", block);
  QKV_CHECK_ARG(data != nullptr || rows * cols == 0, "[quant_matrix] null data for a (", rows, ", ", cols, ") ",
                gguf::type_name(type), " matrix");
  QuantMatrix m;
  m.type = type;
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = gguf::row_bytes(type, cols);
  m.data = static_cast<const uint8_t*>(data);
  m.owner = std::move(owner);
  return m;
}

QuantMatrix QuantMatrix::from_tensor(const gguf::TensorInfo& tensor, std::shared_ptr<const void> owner) {
  QKV_CHECK_ARG(tensor.ne.size() == 2, "[quant_matrix] tensor '", tensor.name, "' has ", tensor.ne.size(),
                " dims, not the 2 of a (k, n) matrix");
  return view(tensor.type, tensor.ne[1], tensor.ne[0], tensor.data, std::move(owner));
}

QuantMatrix QuantMatrix::slice(int64_t begin, int64_t end) const {
  QKV_CHECK_ARG(0 <= begin && begin <= end && end <= rows, "[quant_matrix] rows [", begin, ", ", end,
                ") outside the matrix's ", rows, " rows");
  QuantMatrix m = *this;
  m.rows = end - begin;
  if (data) m.data = data + begin * row_bytes;
  if (packed && begin % quant_detail::kPackRows == 0) {
    m.packed = packed + begin / quant_detail::kPackRows * packed_stride;
  } else {
    m.packed = nullptr;
    m.packed_stride = 0;
    m.packed_owner.reset();
  }
  return m;
}

namespace quant_detail {

int64_t packed_tile_bytes(gguf::Type type, int64_t cols) {
  const BlockLayout l = block_layout(type);
  const int64_t nb = cols / kQK;
  if (l.kind >= 5) return k_tile_layout(l.kind, nb).bytes;
  const int64_t vbytes = nb * (l.kind == 4 ? 8 : 4) * 64, hbytes = l.qh >= 0 ? nb * 64 : 0, dbytes = nb * kPackRows * 2;
  return vbytes + hbytes + dbytes * (l.has_min ? 2 : 1);
}

namespace {

// The 64-bit masks of fifth bits (Q5_0, Q5_1, Q5_K) of one block: mask g bit 4r + e = bit 4 of element 4g + e of
// row r, from the block's 32 values' fifth bits as a u32 (bit j: element j).
void put_fifth_bits(uint8_t* masks, int64_t r, uint32_t bits) {
  for (int g = 0; g < 8; ++g) {
    uint64_t mask;
    std::memcpy(&mask, masks + g * 8, 8);
    mask |= static_cast<uint64_t>((bits >> (4 * g)) & 0xFu) << (4 * r);
    std::memcpy(masks + g * 8, &mask, 8);
  }
}

// A K-quant tile: per block of 32 the nibble vectors (as the 32-element types: vector h lane r = row r's elements
// 4h..4h+3 in the low nibbles, 16 + 4h.. in the high ones), the high bits (Q5_K: the fifth-bit masks; Q6_K: two
// vectors, byte 4r + e of the first holding the top 2 bits of element 4h + e of row r at bits 2h, 2h + 1 for h =
// 0..3, the second those of elements 16 + 4h + e), the 16 rows' sub-block scales as bytes (then their mins, Q4_K
// and Q5_K; Q6_K: the scales of elements 0..15, then of 16..31), and per super-block the 16 rows' fp16 d (then
// dmin).
void pack_k_tile(int kind, const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols, uint8_t* dst) {
  const KType kt = kind == 5 ? KType::kQ4 : kind == 6 ? KType::kQ5 : KType::kQ6;
  const int64_t nb = cols / kQK, bs = kind == 5 ? 144 : kind == 6 ? 176 : 210;
  const KTileLayout l = k_tile_layout(kind, nb);
  KSuperBlock s;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t sb = 0; sb < nb / 8; ++sb) {
      k_super_block(kt, src + r * row_bytes + sb * bs, s);
      uint8_t* d = dst + l.d + sb * (kind == 7 ? 32 : 64) + r * 2;
      std::memcpy(d, &s.d, 2);
      if (kind != 7) std::memcpy(d + 32, &s.dmin, 2);
      for (int j = 0; j < 8; ++j) {
        const int64_t b = sb * 8 + j;
        const uint8_t* q = s.q + 32 * j;
        uint8_t* v = dst + b * 256 + r * 4;
        for (int h = 0; h < 4; ++h)
          for (int e = 0; e < 4; ++e)
            v[h * 64 + e] = static_cast<uint8_t>((q[4 * h + e] & 0x0F) | (q[16 + 4 * h + e] & 0x0F) << 4);
        uint8_t* sc = dst + l.sc + b * 32 + r;
        if (kind == 7) {
          sc[0] = static_cast<uint8_t>(s.sc[2 * j]);
          sc[16] = static_cast<uint8_t>(s.sc[2 * j + 1]);
          for (int half = 0; half < 2; ++half)
            for (int h = 0; h < 4; ++h)
              for (int e = 0; e < 4; ++e)
                dst[l.hi + b * 128 + half * 64 + r * 4 + e] |=
                    static_cast<uint8_t>((q[16 * half + 4 * h + e] >> 4) << (2 * h));
        } else {
          sc[0] = static_cast<uint8_t>(s.sc[j]);
          sc[16] = static_cast<uint8_t>(s.mn[j]);
          if (kind == 6) {
            uint32_t bits = 0;
            for (int e = 0; e < 32; ++e) bits |= static_cast<uint32_t>(q[e] >> 4) << e;
            put_fifth_bits(dst + l.hi + b * 64, r, bits);
          }
        }
      }
    }
}

}  // namespace

void pack_tile(gguf::Type type, const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols, uint8_t* dst) {
  const BlockLayout l = block_layout(type);
  std::memset(dst, 0, static_cast<size_t>(packed_tile_bytes(type, cols)));
  if (l.kind >= 5) return pack_k_tile(l.kind, src, row_bytes, rows, cols, dst);
  const int64_t nb = cols / kQK, bs = gguf::type_size(type), vecs = l.kind == 4 ? 8 : 4;
  uint8_t* hbits = dst + nb * vecs * 64;
  uint8_t* dst_d = hbits + (l.qh >= 0 ? nb * 64 : 0);
  uint8_t* dst_m = dst_d + nb * kPackRows * 2;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* blk = src + r * row_bytes + b * bs;
      std::memcpy(dst_d + (b * kPackRows + r) * 2, blk, 2);
      if (l.has_min) std::memcpy(dst_m + (b * kPackRows + r) * 2, blk + 2, 2);
      uint8_t* v = dst + b * vecs * 64 + r * 4;
      if (l.kind == 4) {
        for (int64_t g = 0; g < 8; ++g)
          for (int64_t e = 0; e < 4; ++e) v[g * 64 + e] = static_cast<uint8_t>(blk[l.qs + 4 * g + e] ^ 0x80u);
      } else {
        for (int64_t h = 0; h < 4; ++h) std::memcpy(v + h * 64, blk + l.qs + 4 * h, 4);
      }
      if (l.qh >= 0) {
        uint32_t qh;
        std::memcpy(&qh, blk + l.qh, 4);
        put_fifth_bits(hbits + b * 64, r, qh);
      }
    }
}

}  // namespace quant_detail

QuantMatrix QuantMatrix::repacked() const {
  constexpr int64_t kRows = quant_detail::kPackRows;
  if (packed || !quant_gemm_integer(type) || rows < kRows || cols == 0) return *this;
  const int64_t tiles = rows / kRows;
  const int64_t stride = (quant_detail::packed_tile_bytes(type, cols) + 63) / 64 * 64;
  auto buffer = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(tiles * stride + 64));
  uint8_t* base = buffer->data() + (-reinterpret_cast<uintptr_t>(buffer->data()) & 63);
  const uint8_t* src = data;
  const int64_t rb = row_bytes, k = cols;
  const gguf::Type ty = type;
#pragma omp parallel for schedule(static) if (tiles * stride >= (int64_t{1} << 20))
  for (int64_t t = 0; t < tiles; ++t) quant_detail::pack_tile(ty, src + t * kRows * rb, rb, kRows, k, base + t * stride);
  QuantMatrix m = *this;
  m.packed = base;
  m.packed_stride = stride;
  m.packed_owner = std::move(buffer);
  return m;
}

namespace {

// Where the products here read a type's repacked tiles: the avx512vnni build for every integer type, the avx2 build
// for the K-quants.
bool reads_repacked(gguf::Type type) {
  const bool k_quant = quant_detail::block_layout(type).kind >= 5 && quant_gemm_integer(type);
  return active_isa() >= Isa::kAvx512Vnni || (k_quant && active_isa() >= Isa::kAvx2);
}

}  // namespace

QuantMatrix QuantMatrix::for_products() const { return reads_repacked(type) ? repacked() : *this; }

QuantMatrix QuantMatrix::packed_only() const {
  QuantMatrix m = for_products();
  if (!m.packed || m.rows % quant_detail::kPackRows != 0 || !reads_repacked(type)) return m;
  m.data = nullptr;
  m.owner.reset();
  return m;
}

}  // namespace qkv::kernels
