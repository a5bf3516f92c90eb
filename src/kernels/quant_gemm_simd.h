// Shared by the quantized product's SIMD builds: 256-bit helpers (a block's 32 integer values as int8 lanes, 8 fp16
// scales to float32 exactly) and the K-quants' kernel written once over lane traits. Included by
// quant_gemm_avx2.cpp and quant_gemm_avx512.cpp only, each compiling its own copy (internal linkage) with its flags.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "quant_gemm_impl.h"
#include "static_dispatch.h"

namespace qkv::kernels::quant_detail {
namespace {

// The 16 nibble bytes as 32 lanes: low nibbles are elements 0..15, high nibbles 16..31.
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

// Bit j of the u32 at qh as 0x10 (set) or 0 in lane j.
inline __m256i fifth_bits(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i m = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, m), m), _mm256_set1_epi8(0x10));
}

// A block's 32 values as the unsigned operand of the u8 x s8 products, lanes 0..31: the integer value
// (quant_gemm_impl.h block_value) plus kOffset[kind] = 8, 0, 16, 0 for Q4_0, Q4_1, Q5_0, Q5_1 (the nibbles, with the
// fifth bit), and for Q8_0 (kind 4) the int8 values themselves (signed; offset 0 here).
inline constexpr int kOffset[5] = {8, 0, 16, 0, 0};
template <int kKind>
inline __m256i block_operand(const uint8_t* blk) {
  if constexpr (kKind == 0) return nibbles(blk + 2);
  if constexpr (kKind == 1) return nibbles(blk + 4);
  if constexpr (kKind == 2) return _mm256_or_si256(nibbles(blk + 6), fifth_bits(blk + 2));
  if constexpr (kKind == 3) return _mm256_or_si256(nibbles(blk + 8), fifth_bits(blk + 4));
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
}

// fp16 bit patterns in the low 16 bits of 8 int32 lanes to float32, exactly as qkv::fp16_to_float (subnormals,
// ±inf, NaN payloads) and with no float32 subnormal on the way (the same under FTZ/DAZ): a normal half is its bits
// moved into float32's place with the exponent rebiased (an integer add), a subnormal half its mantissa converted
// and scaled by 2^-24 (exact), exponent 31 rebuilt as inf / NaN.
inline __m256 fp16_lanes_to_float(__m256i v) {
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x8000)), 16);
  const __m256i em = _mm256_and_si256(v, _mm256_set1_epi32(0x7FFF));
  const __m256i mant = _mm256_and_si256(em, _mm256_set1_epi32(0x3FF));
  const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(em, 13), _mm256_set1_epi32(112 << 23));
  const __m256i subnormal =
      _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(mant), _mm256_set1_ps(0x1p-24f)));
  const __m256i special = _mm256_or_si256(_mm256_set1_epi32(0x7F800000), _mm256_slli_epi32(mant, 13));
  __m256i bits = _mm256_blendv_epi8(normal, subnormal, _mm256_cmpgt_epi32(_mm256_set1_epi32(0x400), em));
  bits = _mm256_blendv_epi8(bits, special, _mm256_cmpgt_epi32(em, _mm256_set1_epi32(0x7BFF)));
  return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}

// The V::kLanes weight rows from j0 (kinds 0..4) unpacked once into scratch column-interleaved: per block, vector g
// holds elements 4g..4g+3 of every row in its 32-bit lane r as the build's operands (V::operand), so that 8 V::dot
// against the activations' broadcast 4-byte groups leave the rows' block sums in lanes (no horizontal reduction);
// then the rows' d and m as float32 per block.
struct Unpacked {
  const uint8_t* vals;
  const float* dw;
  const float* mw;
};
template <class V, int kKind>
Unpacked unpack_interleaved(const QuantMatrix& w, int64_t j0, std::vector<uint8_t>& scratch) {
  constexpr int kLanes = V::kLanes;
  const int64_t nb = w.cols / kQK, bs = gguf::type_size(w.type);
  const size_t vbytes = static_cast<size_t>(nb) * 8 * kLanes * 4, fbytes = static_cast<size_t>(nb) * kLanes * 4;
  if (scratch.size() < vbytes + 2 * fbytes + 64) scratch.resize(vbytes + 2 * fbytes + 64);
  uint8_t* vals = scratch.data() + (-reinterpret_cast<uintptr_t>(scratch.data()) & 63);
  float* dw = reinterpret_cast<float*>(vals + vbytes);
  float* mw = dw + nb * kLanes;
  const uint8_t* row0 = w.data + j0 * w.row_bytes;
  const typename V::I rows = V::offsets(w.row_bytes), transpose = V::offsets(32);
  alignas(64) uint8_t block[kLanes][32];  // one block of the rows as operands, row-major
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < kLanes; ++r) V::template operand<kKind>(row0 + r * w.row_bytes + b * bs, block[r]);
    for (int g = 0; g < 8; ++g) V::store_i(vals + (b * 8 + g) * kLanes * 4, V::gather(&block[0][4 * g], transpose));
    const typename V::I head = V::gather(row0 + b * bs, rows);  // each row's first 4 bytes: d, and m above it
    V::store(dw + b * kLanes, V::half_lo(head));
    if constexpr (kKind == 1 || kKind == 3) V::store(mw + b * kLanes, V::half_hi(head));
  }
  return {vals, dw, mw};
}

// quant_gemm_impl.h's block_term in lanes (kinds 0..4): the rows' exact sums less kOff · Σx, times dw · dx, plus
// mw · sx (Q4_1, Q5_1); activation row and block o.
template <class V, int kKind, int kOff>
typename V::F block_term(typename V::I sumi, typename V::F dw, typename V::F mw, const QuantActivations& a, size_t o) {
  if constexpr (kOff != 0) sumi = V::sub_i(sumi, kOff * a.sum[o]);
  const typename V::F term = V::mul(V::to_float(sumi), V::mul(dw, V::set1(a.d[o])));
  return kKind == 1 || kKind == 3 ? V::add(term, V::mul(mw, V::set1(a.s[o]))) : term;
}

// R rows of sums into y from column j0, plus the bias (the epilogue's last float addition).
template <class V, int R>
void store_rows(const TileArgs& t, int64_t j0, int64_t i0, const typename V::F (&acc)[R]) {
  for (int r = 0; r < R; ++r)
    V::store(t.y + (i0 + r) * t.ldy + j0, t.bias ? V::add(acc[r], V::load(t.bias + j0)) : acc[r]);
}

// R activation rows against an unpack_interleaved tile, with quant_gemm_impl.h's float epilogue in lanes.
template <class V, int kKind, int R>
void rows_interleaved(const TileArgs& t, int64_t j0, int64_t i0, const Unpacked& u) {
  constexpr int kLanes = V::kLanes;
  const QuantActivations& a = *t.a;
  typename V::F acc[R];
  for (int r = 0; r < R; ++r) acc[r] = V::zero();
  for (int64_t b = 0; b < a.blocks; ++b) {
    const typename V::F d = V::load(u.dw + b * kLanes);
    const typename V::F mw = kKind == 1 || kKind == 3 ? V::load(u.mw + b * kLanes) : V::zero();
    for (int r = 0; r < R; ++r) {
      const int64_t i = i0 + r;
      const int8_t* xq = a.q.data() + i * a.cols + b * kQK;
      typename V::I sumi = V::izero();
      for (int g = 0; g < 8; ++g) {
        int32_t group;
        std::memcpy(&group, xq + 4 * g, 4);
        sumi = V::template dot_kind<kKind>(sumi, V::load(u.vals + (b * 8 + g) * kLanes * 4), group);
      }
      const size_t o = static_cast<size_t>(i * a.blocks + b);
      acc[r] = V::add(acc[r], block_term<V, kKind, V::kOffset[kKind]>(sumi, d, mw, a, o));
    }
  }
  store_rows<V>(t, j0, i0, acc);
}

// Every activation row against the kinds 0..4 tile from j0, unpacked column-interleaved.
template <class V, int kKind>
void tile_interleaved(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch) {
  const Unpacked u = unpack_interleaved<V, kKind>(*t.w, j0, scratch);
  detail::for_row_blocks<4>(t.a->rows, [&]<int R>(int64_t i) { rows_interleaved<V, kKind, R>(t, j0, i, u); });
}

// Up to 4 activation rows against the V::kLanes rows from j0 of a matrix without repacked tiles (kinds 0..4), read
// in place: per block the rows' operands built in registers (V::operands) and used at once, each activation row's
// products reduced to the rows' exact sums in lanes (V::block_sums), then block_term in lanes.
template <class V, int kKind, int R>
void rows_fused(const TileArgs& t, int64_t j0, int64_t i0) {
  const QuantActivations& a = *t.a;
  const QuantMatrix& w = *t.w;
  const uint8_t* row0 = w.data + j0 * w.row_bytes;
  const int64_t bs = gguf::type_size(w.type);
  const typename V::I rows = V::offsets(w.row_bytes);
  typename V::F acc[R];
  for (int r = 0; r < R; ++r) acc[r] = V::zero();
  for (int64_t b = 0; b < a.blocks; ++b) {
    typename V::I z[8];
    V::template operands<kKind>(row0 + b * bs, w.row_bytes, z);
    const typename V::I head = V::gather(row0 + b * bs, rows);  // each row's first 4 bytes: d, and m above it
    const typename V::F dw = V::half_lo(head);
    const typename V::F mw = kKind == 1 || kKind == 3 ? V::half_hi(head) : V::zero();
    for (int r = 0; r < R; ++r) {
      const int64_t i = i0 + r;
      typename V::I sumi = V::template block_sums<kKind>(z, a.q.data() + i * a.cols + b * kQK);
      const size_t o = static_cast<size_t>(i * a.blocks + b);
      acc[r] = V::add(acc[r], block_term<V, kKind, V::kOffset[kKind]>(sumi, dw, mw, a, o));
    }
  }
  store_rows<V>(t, j0, i0, acc);
}

// A matrix without repacked tiles (kinds 0..4): up to 4 activation rows fused, more through the interleaved tile.
template <class V, int kKind>
void tile_unpacked(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch) {
  if (t.a->rows > 4) return tile_interleaved<V, kKind>(t, j0, scratch);
  detail::for_row_blocks<4>(t.a->rows, [&]<int R>(int64_t i) { rows_fused<V, kKind, R>(t, j0, i); });
}

// A repacked 16-row tile (QuantMatrix::repacked, quant_gemm_impl.h k_tile_layout), written once over the vector
// width: V, the lane traits of a build, holds V::kLanes weight rows in the 32-bit lanes of a vector (part `part` of
// the tile: rows kLanes · part ..). Per block of 32 the nibble vectors with their high bits (Q8_0: its 8 vectors of
// w + 128), the exact sums of elements 0..15 and 16..31 apart against the activations' broadcast 4-byte groups
// (V::dot, in lanes: no horizontal reduction), then quant_gemm_impl.h's block_term (kinds 0..4, the offset
// kPackedOffset · Σx taken back) or k_term / k6_term (the K-quants) in lanes; R activation rows share each load.
// The avx2 build reads only the K-quants' tiles (its vpmaddubsw would saturate on Q8_0's w + 128).
// kStored (kinds 0..4, V::kLanes == kPackRows): tile is a matrix's stored rows from j0, read in place, no tile packed:
// the same vectors from each block's rows (V::stored_vectors), d and m from their heads and the fifth bits from their
// qh (V::gather, V::with_fifth_bits_of).
inline constexpr int kPackedOffset[5] = {8, 0, 16, 0, 128};
template <class V, int kKind, int R, bool kStored = false>
void rows_packed(const TileArgs& t, int64_t j0, int64_t i0, const uint8_t* tile, int64_t stride, int part) {
  using I = typename V::I;
  using F = typename V::F;
  const QuantActivations& a = *t.a;
  const int64_t nb = a.blocks;
  constexpr bool kQuantK = kKind >= 5, kMin = kKind == 1 || kKind == 3;
  constexpr bool kFifth = kKind == 2 || kKind == 3 || kKind == 6;
  constexpr int64_t kVecBytes = kKind == 4 ? 512 : 256;  // a block's operand vectors
  const KTileLayout l = k_tile_layout(kKind, nb);  // kinds 0..4: the vectors' and the fifth bits' places as Q5_K's
  const uint8_t* d16 = tile + nb * kVecBytes + (kKind == 2 || kKind == 3 ? nb * 64 : 0);  // kinds 0..4: fp16 d, m
  // This part's bytes in a 64-byte vector of the tile (none where one vector holds the whole tile's rows).
  const int64_t at = V::kLanes == kPackRows ? 0 : part * V::kLanes * 4;
  const BlockLayout bl = block_layout(t.w->type);  // kStored: tile is the stored rows from j0
  const int64_t bs = kStored ? gguf::type_size(t.w->type) : 0;
  const I rows = kStored ? V::offsets(t.w->row_bytes) : V::izero();
  const int8_t* xq[R];
  for (int r = 0; r < R; ++r) xq[r] = a.q.data() + (i0 + r) * a.cols;
  F acc[R];
  for (int r = 0; r < R; ++r) acc[r] = V::zero();
  F d = V::zero(), dmin = V::zero();
  for (int64_t b = 0; b < nb; ++b) {
    I head = V::izero(), qh = V::izero();  // kStored: each row's first 4 bytes (d, and m above it), fifth bits
    I sv[kKind == 4 ? 8 : 4];                // kStored: the block's vectors
    if constexpr (kStored) {
      V::stored_vectors(tile + b * bs + bl.qs, t.w->row_bytes, sv);
      head = V::gather(tile + b * bs, rows);
      if constexpr (kFifth) qh = V::gather(tile + b * bs + bl.qh, rows);
    } else {
      V::prefetch(tile, stride, b, nb);
    }
    if (kQuantK && b % 8 == 0) {
      const uint8_t* dp = tile + l.d + b / 8 * (kKind == 7 ? 32 : 64) + at / 2;
      d = V::fp16(dp);
      if constexpr (kKind != 7) dmin = V::fp16(dp + 32);
    }
    I top_lo = V::izero(), top_hi = V::izero();
    if constexpr (kKind == 7) {
      top_lo = V::load(tile + l.hi + b * 128 + at);
      top_hi = V::load(tile + l.hi + b * 128 + 64 + at);
    }
    I s0[R], s1[R];
    for (int r = 0; r < R; ++r) s0[r] = s1[r] = V::izero();
    for (int h = 0; h < 4; ++h) {
      I lo, hi;
      int glo = h, ghi = h + 4;  // the activations' 4-byte groups (elements 4g..4g+3)
      if constexpr (kKind == 4) {
        lo = kStored ? V::flip_sign_bits(sv[2 * h]) : V::load(tile + b * kVecBytes + 2 * h * 64 + at);
        hi = kStored ? V::flip_sign_bits(sv[2 * h + 1]) : V::load(tile + b * kVecBytes + (2 * h + 1) * 64 + at);
        glo = 2 * h;
        ghi = 2 * h + 1;
      } else {
        const I pv = kStored ? sv[h] : V::load(tile + b * kVecBytes + h * 64 + at);
        lo = V::low_nibbles(pv);
        hi = V::high_nibbles(pv);
      }
      if constexpr (kFifth && kStored) {  // the fifth bits of elements 4h.. and 16 + 4h..
        lo = V::with_fifth_bits_of(lo, qh, h);
        hi = V::with_fifth_bits_of(hi, qh, h + 4);
      } else if constexpr (kFifth) {  // the masks' bits of this part, groups h and h + 4
        lo = V::with_fifth_bits(lo, tile + l.hi + b * 64 + h * 8 + at / 8);
        hi = V::with_fifth_bits(hi, tile + l.hi + b * 64 + (h + 4) * 8 + at / 8);
      }
      if constexpr (kKind == 7) {
        lo = V::with_top_bits(lo, top_lo, h);
        hi = V::with_top_bits(hi, top_hi, h);
      }
      for (int r = 0; r < R; ++r) {
        int32_t gl, gh;
        std::memcpy(&gl, xq[r] + b * kQK + 4 * glo, 4);
        std::memcpy(&gh, xq[r] + b * kQK + 4 * ghi, 4);
        s0[r] = V::dot(s0[r], lo, gl);
        s1[r] = V::dot(s1[r], hi, gh);
      }
    }
    F dw = V::zero(), mw = V::zero();
    if constexpr (kStored) {
      dw = V::half_lo(head);
      if constexpr (kMin) mw = V::half_hi(head);
    } else if constexpr (!kQuantK) {
      dw = V::fp16(d16 + b * 32 + at / 2);
      if constexpr (kMin) mw = V::fp16(d16 + nb * 32 + b * 32 + at / 2);
    }
    const uint8_t* sc = tile + l.sc + b * 32 + at / 4;
    for (int r = 0; r < R; ++r) {
      const size_t o = static_cast<size_t>((i0 + r) * a.blocks + b);
      const F dx = V::set1(a.d[o]);
      F term;
      if constexpr (kKind == 7) {  // k6_term: the unsigned values' sums less 32 · Σq of their half
        const F dsc_lo = V::mul(d, V::scales_s8(sc)), dsc_hi = V::mul(d, V::scales_s8(sc + 16));
        const I lo = V::sub_i(s0[r], 32 * a.sum_lo[o]), hi = V::sub_i(s1[r], 32 * (a.sum[o] - a.sum_lo[o]));
        term = V::add(V::mul(V::to_float(lo), V::mul(dsc_lo, dx)), V::mul(V::to_float(hi), V::mul(dsc_hi, dx)));
      } else if constexpr (kQuantK) {  // k_term
        const F dsc = V::mul(d, V::scales_u8(sc)), mm = V::mul(dmin, V::scales_u8(sc + 16));
        term = V::mul(V::to_float(V::add_i(s0[r], s1[r])), V::mul(dsc, dx));
        term = V::sub(term, V::mul(mm, V::set1(a.d[o] * static_cast<float>(a.sum[o]))));
      } else {
        term = block_term<V, kKind, kPackedOffset[kKind]>(V::add_i(s0[r], s1[r]), dw, mw, a, o);
      }
      acc[r] = V::add(acc[r], term);
    }
  }
  store_rows<V>(t, j0, i0, acc);
}

// The V::kLanes columns from j0 on repacked tiles: their part of the matrix's 16-row tile, or (rows without one)
// those rows packed into scratch first.
template <class V, int kKind>
void tile_packed(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch) {
  const QuantMatrix& w = *t.w;
  const uint8_t* tile = nullptr;
  int64_t stride = w.packed_stride;
  int part = 0;
  if (w.packed && j0 / kPackRows < w.rows / kPackRows) {
    tile = w.packed + j0 / kPackRows * stride;
    part = static_cast<int>(j0 % kPackRows / V::kLanes);
  } else {
    stride = (packed_tile_bytes(w.type, w.cols) + 63) / 64 * 64;
    if (scratch.size() < static_cast<size_t>(stride + 64)) scratch.resize(static_cast<size_t>(stride + 64));
    uint8_t* base = scratch.data() + (-reinterpret_cast<uintptr_t>(scratch.data()) & 63);
    pack_tile(w.type, w.data + j0 * w.row_bytes, w.row_bytes, V::kLanes, w.cols, base);
    tile = base;
  }
  detail::for_row_blocks<4>(t.a->rows,
                            [&]<int R>(int64_t i) { rows_packed<V, kKind, R>(t, j0, i, tile, stride, part); });
}

// A build's TileFn (quant_gemm_impl.h) over its lane traits V: kinds 0..4 through rows_packed where V::kReadsPacked
// (on the matrix's repacked tiles, or its stored rows), else tile_unpacked; the K-quants always on repacked tiles.
template <class V>
void tile_for(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch) {
  const auto run = [&]<int kKind>() {
    if constexpr (kKind >= 5) {
      tile_packed<V, kKind>(t, j0, scratch);
    } else if constexpr (V::kReadsPacked) {
      if (t.w->packed) return tile_packed<V, kKind>(t, j0, scratch);
      const uint8_t* rows = t.w->data + j0 * t.w->row_bytes;
      const auto stored = [&]<int R>(int64_t i) __attribute__((noinline)) {
        rows_packed<V, kKind, R, true>(t, j0, i, rows, 0, 0);
      };
      // 8 rows share each block's transposes; out of line (inlined into the row dispatch, one row ran 10-15 %
      // slower).
      detail::for_row_blocks<8>(t.a->rows, stored);
    } else {
      tile_unpacked<V, kKind>(t, j0, scratch);
    }
  };
  detail::with_index<8>(block_layout(t.w->type).kind, run);
}

}  // namespace
}  // namespace qkv::kernels::quant_detail
