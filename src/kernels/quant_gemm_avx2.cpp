// The quantized product's AVX2 build: tiles of 8 weight rows unpacked once to u8 operands (int8 for Q8_0) and
// float32 scales (the K-quants: half of a repacked 16-row tile); per activation row and block the exact int32 sums (up to 4 rows: each row's products reduced;
// more rows: the tile column-interleaved, sums in lanes), and quant_gemm_impl.h's float epilogue in 8 lanes.
// vpmaddubsw never saturates here: nibble types 2 · 31 · 127 < 32767 (the offset taken back as offset · Σx), Q8_0
// on |w| and sign(x, w): 2 · 128 · 127 < 32767.
#include "quant_gemm_simd.h"

namespace qkv::kernels::quant_detail::avx2 {
namespace {

// R activation rows against a column-interleaved tile (8 rows' block sums in the lanes), with the epilogue.
template <int kKind, int R>
void rows_interleaved(const TileArgs& t, int64_t j0, int64_t i0, const uint8_t* vals, const float* dw,
                      const float* mw) {
  const QuantActivations& a = *t.a;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.blocks; ++b) {
    const __m256 d = _mm256_load_ps(dw + b * 8);
    for (int r = 0; r < R; ++r) {
      const int64_t i = i0 + r;
      const int8_t* xq = a.q.data() + i * a.cols + b * kQK;
      __m256i sumi = _mm256_setzero_si256();
      for (int g = 0; g < 8; ++g) {
        int32_t group;
        std::memcpy(&group, xq + 4 * g, 4);
        const __m256i xb = _mm256_set1_epi32(group);
        const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(vals + (b * 8 + g) * 32));
        const __m256i pairs = kKind == 4 ? _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xb, wv))
                                         : _mm256_maddubs_epi16(wv, xb);
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, ones));
      }
      const size_t o = static_cast<size_t>(i * a.blocks + b);
      if constexpr (kOffset[kKind] != 0) sumi = _mm256_sub_epi32(sumi, _mm256_set1_epi32(kOffset[kKind] * a.sum[o]));
      __m256 term = _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(d, _mm256_set1_ps(a.d[o])));
      if constexpr (kKind == 1 || kKind == 3)
        term = _mm256_add_ps(term, _mm256_mul_ps(_mm256_load_ps(mw + b * 8), _mm256_set1_ps(a.s[o])));
      acc[r] = _mm256_add_ps(acc[r], term);
    }
  }
  for (int r = 0; r < R; ++r) {
    __m256 v = acc[r];
    if (t.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(t.bias + j0));
    _mm256_storeu_ps(t.y + (i0 + r) * t.ldy + j0, v);
  }
}

template <int kKind>
void tile_kind(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch) {
  const QuantMatrix& w = *t.w;
  const QuantActivations& a = *t.a;
  const int64_t nb = w.cols / kQK, bs = gguf::type_size(w.type);
  constexpr bool kMin = kKind == 1 || kKind == 3;
  // Unpacked tile: per block, 8 rows x 32 operand bytes, then the rows' d and m as float32.
  const size_t vbytes = static_cast<size_t>(nb) * 8 * 32, fbytes = static_cast<size_t>(nb) * 8 * sizeof(float);
  if (scratch.size() < vbytes + 2 * fbytes + 64) scratch.resize(vbytes + 2 * fbytes + 64);
  uint8_t* base = scratch.data() + (-reinterpret_cast<uintptr_t>(scratch.data()) & 31);
  uint8_t* vals = base;
  float* dw = reinterpret_cast<float*>(base + vbytes);
  float* mw = dw + nb * 8;
  const uint8_t* row0 = w.data + j0 * w.row_bytes;
  const __m256i rows = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                          _mm256_set1_epi32(static_cast<int>(w.row_bytes)));
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  // Up to 4 activation rows read the operands row by row (8 rows x 32 bytes per block) and reduce each row's
  // products; more rows read them column-interleaved (per block, vector g holds elements 4g..4g+3 of the 8 rows in
  // its 32-bit lanes), so the 8 block sums come out of 8 vpmaddubsw / vpmaddwd in lanes with no reduction.
  const bool interleaved = a.rows > 4;
  alignas(32) uint8_t block[8][32];
  const __m256i transpose = _mm256_setr_epi32(0, 32, 64, 96, 128, 160, 192, 224);
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < 8; ++r) {
      const __m256i v = block_operand<kKind>(row0 + r * w.row_bytes + b * bs);
      _mm256_store_si256(reinterpret_cast<__m256i*>(interleaved ? block[r] : vals + (b * 8 + r) * 32), v);
    }
    if (interleaved)
      for (int g = 0; g < 8; ++g)
        _mm256_store_si256(reinterpret_cast<__m256i*>(vals + (b * 8 + g) * 32),
                           _mm256_i32gather_epi32(reinterpret_cast<const int*>(&block[0][4 * g]), transpose, 1));
    // The first 4 bytes of each row's block: d, and m where the type has one.
    const __m256i head = _mm256_i32gather_epi32(reinterpret_cast<const int*>(row0 + b * bs), rows, 1);
    _mm256_store_ps(dw + b * 8, fp16_lanes_to_float(_mm256_and_si256(head, low16)));
    if constexpr (kMin) _mm256_store_ps(mw + b * 8, fp16_lanes_to_float(_mm256_srli_epi32(head, 16)));
  }

  if (interleaved) {
    int64_t i = 0;
    for (; i + 4 <= a.rows; i += 4) rows_interleaved<kKind, 4>(t, j0, i, vals, dw, mw);
    switch (a.rows - i) {
      case 3: rows_interleaved<kKind, 3>(t, j0, i, vals, dw, mw); break;
      case 2: rows_interleaved<kKind, 2>(t, j0, i, vals, dw, mw); break;
      case 1: rows_interleaved<kKind, 1>(t, j0, i, vals, dw, mw); break;
      default: break;
    }
    return;
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < a.rows; ++i) {
    const int8_t* xq = a.q.data() + i * a.cols;
    const float* dx = a.d.data() + i * a.blocks;
    const float* sx = a.s.data() + i * a.blocks;
    const int32_t* xs = a.sum.data() + i * a.blocks;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * kQK));
      __m256i p[8];
      for (int r = 0; r < 8; ++r) {
        const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(vals + (b * 8 + r) * 32));
        const __m256i pairs = kKind == 4 ? _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv))
                                         : _mm256_maddubs_epi16(wv, xv);
        p[r] = _mm256_madd_epi16(pairs, ones);
      }
      const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
      const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
      __m256i sumi = _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                                      _mm256_permute2x128_si256(h0123, h4567, 0x31));
      if constexpr (kOffset[kKind] != 0) sumi = _mm256_sub_epi32(sumi, _mm256_set1_epi32(kOffset[kKind] * xs[b]));
      __m256 term = _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(_mm256_load_ps(dw + b * 8),
                                                                          _mm256_set1_ps(dx[b])));
      if constexpr (kMin) term = _mm256_add_ps(term, _mm256_mul_ps(_mm256_load_ps(mw + b * 8), _mm256_set1_ps(sx[b])));
      acc = _mm256_add_ps(acc, term);
    }
    if (t.bias) acc = _mm256_add_ps(acc, _mm256_loadu_ps(t.bias + j0));
    _mm256_storeu_ps(t.y + i * t.ldy + j0, acc);
  }
}

// Q6_K's top 2 bits of group h (bits 2h, 2h + 1 of each byte) at bits 4, 5 (as the avx512vnni build's top_bits).
inline __m256i top_bits(__m256i v, int h) {
  switch (h) {
    case 0: return _mm256_slli_epi16(v, 4);
    case 1: return _mm256_slli_epi16(v, 2);
    case 2: return v;
    default: return _mm256_srli_epi16(v, 2);
  }
}

// The K-quants on one half (8 rows) of a repacked 16-row tile (quant_gemm_impl.h k_tile_layout): the 32-bit lanes
// of the half's 32 bytes are its 8 rows, so vpmaddubsw / vpmaddwd against the activations' broadcast 4-byte groups
// leave the rows' sums in lanes (elements 0..15 and 16..31 apart), then quant_gemm_impl.h's k_term / k6_term in 8
// lanes. vpmaddubsw never saturates: 2 · 63 · 127 < 32767.
template <int kKind, int R>
void rows_k(const TileArgs& t, int64_t j0, int64_t i0, const uint8_t* tile, int half) {
  const QuantActivations& a = *t.a;
  const int64_t nb = a.blocks;
  const KTileLayout l = k_tile_layout(kKind, nb);
  const __m256i nibble = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30), ones = _mm256_set1_epi16(1);
  const int8_t* xq[R];
  for (int r = 0; r < R; ++r) xq[r] = a.q.data() + (i0 + r) * a.cols;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  __m256 d = _mm256_setzero_ps(), dmin = _mm256_setzero_ps();
  const auto fp16x8 = [](const uint8_t* p) {
    return fp16_lanes_to_float(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  };
  for (int64_t b = 0; b < nb; ++b) {
    if (b % 8 == 0) {
      const uint8_t* dp = tile + l.d + b / 8 * (kKind == 7 ? 32 : 64) + 16 * half;
      d = fp16x8(dp);
      if constexpr (kKind != 7) dmin = fp16x8(dp + 32);
    }
    const uint8_t* v = tile + b * 256 + 32 * half;
    __m256i top_lo = _mm256_setzero_si256(), top_hi = _mm256_setzero_si256();
    if constexpr (kKind == 7) {
      top_lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(tile + l.hi + b * 128 + 32 * half));
      top_hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(tile + l.hi + b * 128 + 64 + 32 * half));
    }
    __m256i s0[R], s1[R];
    for (int r = 0; r < R; ++r) s0[r] = s1[r] = _mm256_setzero_si256();
    for (int h = 0; h < 4; ++h) {
      const __m256i pv = _mm256_load_si256(reinterpret_cast<const __m256i*>(v + h * 64));
      __m256i lo = _mm256_and_si256(pv, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(pv, 4), nibble);
      if constexpr (kKind == 6) {  // the masks' bits 32 half .. of groups h and h + 4
        lo = _mm256_or_si256(lo, fifth_bits(tile + l.hi + b * 64 + h * 8 + 4 * half));
        hi = _mm256_or_si256(hi, fifth_bits(tile + l.hi + b * 64 + (h + 4) * 8 + 4 * half));
      }
      if constexpr (kKind == 7) {
        lo = _mm256_or_si256(lo, _mm256_and_si256(top_bits(top_lo, h), top));
        hi = _mm256_or_si256(hi, _mm256_and_si256(top_bits(top_hi, h), top));
      }
      for (int r = 0; r < R; ++r) {
        int32_t gl, gh;
        std::memcpy(&gl, xq[r] + b * kQK + 4 * h, 4);
        std::memcpy(&gh, xq[r] + b * kQK + 16 + 4 * h, 4);
        s0[r] = _mm256_add_epi32(s0[r], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(gl)), ones));
        s1[r] = _mm256_add_epi32(s1[r], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_set1_epi32(gh)), ones));
      }
    }
    const __m128i sc = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(tile + l.sc + b * 32 + 8 * half));
    const __m128i sc2 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(tile + l.sc + b * 32 + 16 + 8 * half));
    for (int r = 0; r < R; ++r) {
      const size_t o = static_cast<size_t>((i0 + r) * a.blocks + b);
      const __m256 dx = _mm256_set1_ps(a.d[o]);
      __m256 term;
      if constexpr (kKind == 7) {  // k6_term
        const __m256 dsc_lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
        const __m256 dsc_hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc2)));
        const __m256i lo = _mm256_sub_epi32(s0[r], _mm256_set1_epi32(32 * a.sum_lo[o]));
        const __m256i hi = _mm256_sub_epi32(s1[r], _mm256_set1_epi32(32 * (a.sum[o] - a.sum_lo[o])));
        term = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(dsc_lo, dx)),
                             _mm256_mul_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(dsc_hi, dx)));
      } else {  // k_term
        const __m256 dsc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)));
        const __m256 mm = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc2)));
        term = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s0[r], s1[r])), _mm256_mul_ps(dsc, dx));
        term = _mm256_sub_ps(term, _mm256_mul_ps(mm, _mm256_set1_ps(a.d[o] * static_cast<float>(a.sum[o]))));
      }
      acc[r] = _mm256_add_ps(acc[r], term);
    }
  }
  for (int r = 0; r < R; ++r) {
    __m256 y = acc[r];
    if (t.bias) y = _mm256_add_ps(y, _mm256_loadu_ps(t.bias + j0));
    _mm256_storeu_ps(t.y + (i0 + r) * t.ldy + j0, y);
  }
}

// A K-quant tile of 8 columns: its half of the matrix's repacked 16-row tile, or (no repacked copy) its 8 rows
// packed into scratch first.
template <int kKind>
void tile_k(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch) {
  const QuantMatrix& w = *t.w;
  const uint8_t* tile = nullptr;
  int half = 0;
  if (w.packed && j0 / kPackRows < w.rows / kPackRows) {  // rows past the last whole 16-row tile have none
    tile = w.packed + j0 / kPackRows * w.packed_stride;
    half = static_cast<int>(j0 / kTile % 2);
  } else {
    const int64_t bytes = packed_tile_bytes(w.type, w.cols);
    if (scratch.size() < static_cast<size_t>(bytes + 64)) scratch.resize(static_cast<size_t>(bytes + 64));
    uint8_t* base = scratch.data() + (-reinterpret_cast<uintptr_t>(scratch.data()) & 63);
    pack_tile(w.type, w.data + j0 * w.row_bytes, w.row_bytes, kTile, w.cols, base);
    tile = base;
  }
  int64_t i = 0;
  for (; i + 4 <= t.a->rows; i += 4) rows_k<kKind, 4>(t, j0, i, tile, half);
  switch (t.a->rows - i) {
    case 3: return rows_k<kKind, 3>(t, j0, i, tile, half);
    case 2: return rows_k<kKind, 2>(t, j0, i, tile, half);
    case 1: return rows_k<kKind, 1>(t, j0, i, tile, half);
    default: return;
  }
}

}  // namespace

void tile(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch) {
  switch (block_layout(t.w->type).kind) {
    case 0: return tile_kind<0>(t, j0, scratch);
    case 1: return tile_kind<1>(t, j0, scratch);
    case 2: return tile_kind<2>(t, j0, scratch);
    case 3: return tile_kind<3>(t, j0, scratch);
    case 4: return tile_kind<4>(t, j0, scratch);
    case 5: return tile_k<5>(t, j0, scratch);
    case 6: return tile_k<6>(t, j0, scratch);
    default: return tile_k<7>(t, j0, scratch);
  }
}

}  // namespace qkv::kernels::quant_detail::avx2
