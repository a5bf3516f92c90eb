// The quantized product's entry points (qkv/kernels/quant_gemm.h): argument checks, the activations' quantizer, the
// portable reference (plain loops: the definition of the bits), the float32 path, and the dispatch by active_isa().
#include "qkv/kernels/quant_gemm.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <memory>

#include "qkv/core/error.h"
#include "qkv/core/half.h"
#include "qkv/core/storage_pool.h"
#include "qkv/kernels/activations.h"
#include "qkv/kernels/cpu.h"
#include "qkv/kernels/quant.h"
#include "quant_gemm_impl.h"

namespace qkv::kernels {

using quant_detail::block_layout;
using quant_detail::KSuperBlock;
using quant_detail::KType;
using quant_detail::BlockLayout;
using quant_detail::kQK;
using quant_detail::TileArgs;
using quant_detail::TileFn;

uint16_t fp16_from_float(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return sign | 0x7E00u | static_cast<uint16_t>((ax >> 13) & 0x3FFu);  // NaN, quiet
  if (ax >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to inf
  if (ax >= 0x38800000u) {                       // a normal half: drop 13 bits, round to nearest even
    const uint32_t rounded = ax + 0xFFFu + ((ax >> 13) & 1u);
    return sign | static_cast<uint16_t>((rounded >> 13) - (112u << 10));
  }
  // Zero or a subnormal half (units of 2^-24; 1024 units is the smallest normal, as its bits): exact scaling, then
  // the current rounding mode's nearest even.
  const float units = std::nearbyint(std::bit_cast<float>(ax) * 0x1p24f);
  return sign | static_cast<uint16_t>(units);
}

bool quant_gemm_integer(gguf::Type type) {
  using gguf::Type;
  return type == Type::Q4_0 || type == Type::Q4_1 || type == Type::Q5_0 || type == Type::Q5_1 ||
         type == Type::Q8_0 || type == Type::Q4_K || type == Type::Q5_K || type == Type::Q6_K;
}

// --- activations -------------------------------------------------------------------------------------------------

namespace quant_detail {

void quantize_block(const float* xb, int8_t* q, float& d_out, float& s_out, int32_t& sum_out, int32_t& sum_lo) {
  bool finite = true;
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    finite = finite && std::isfinite(xb[j]);
    amax = std::max(amax, std::fabs(xb[j]));
  }
  if (!finite) {  // the row's outputs become NaN through d and s
    std::fill_n(q, kQK, int8_t{0});
    d_out = s_out = std::numeric_limits<float>::quiet_NaN();
    sum_out = sum_lo = 0;
    return;
  }
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int32_t sum = 0;
  for (int j = 0; j < kQK; ++j) {
    q[j] = static_cast<int8_t>(std::roundf(xb[j] * id));
    sum += q[j];
    if (j == kQK / 2 - 1) sum_lo = sum;
  }
  d_out = fp16_to_float(fp16_from_float(d));
  s_out = fp16_to_float(fp16_from_float(static_cast<float>(sum) * d));
  sum_out = sum;
}

}  // namespace quant_detail

namespace {

void quantize_rows(const float* x, int64_t m, int64_t ldx, int64_t k, QuantActivations& out, bool vector) {
  QKV_CHECK_ARG(m >= 0 && k >= 0 && k % kQK == 0 && ldx >= k && (x != nullptr || m * k == 0),
                "[quantize_activations] x (", m, ", ", k, ") with ldx ", ldx, ": k must be a multiple of ", kQK,
                ", ldx >= k, x non-null");
  out.rows = m;
  out.cols = k;
  out.blocks = k / kQK;
  out.q.resize(static_cast<size_t>(m * k));
  out.d.resize(static_cast<size_t>(m * out.blocks));
  out.s.resize(out.d.size());
  out.sum.resize(out.d.size());
  out.sum_lo.resize(out.d.size());
  const int64_t nb = out.blocks;
  const auto row = [&](int64_t i) {
    const size_t o = static_cast<size_t>(i * nb);
    int8_t* q = out.q.data() + i * k;
    if (vector) {
      quant_detail::avx512::quantize_blocks(x + i * ldx, nb, q, &out.d[o], &out.s[o], &out.sum[o], &out.sum_lo[o]);
      return;
    }
    for (int64_t b = 0; b < nb; ++b)
      quant_detail::quantize_block(x + i * ldx + b * kQK, q + b * kQK, out.d[o + b], out.s[o + b], out.sum[o + b],
                                   out.sum_lo[o + b]);
  };
  if (m * k < (int64_t{1} << 16)) {  // a decode row: no parallel region at all (even a one-thread one costs)
    for (int64_t i = 0; i < m; ++i) row(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) row(i);
}

}  // namespace

void quantize_activations(const float* x, int64_t m, int64_t ldx, int64_t k, QuantActivations& out) {
  quantize_rows(x, m, ldx, k, out, active_isa() >= Isa::kAvx512Vnni);
}

void quantize_activations_reference(const float* x, int64_t m, int64_t ldx, int64_t k, QuantActivations& out) {
  quantize_rows(x, m, ldx, k, out, false);
}

// --- the portable reference and the float32 path ----------------------------------------------------------------

namespace quant_detail {

namespace {

// A K-quant column: per super-block its parts (quant_k.h), per block of 32 the exact sums and impl.h's k_term.
void reference_k_column(const TileArgs& t, int64_t j, std::vector<float>& acc) {
  const QuantMatrix& w = *t.w;
  const QuantActivations& a = *t.a;
  const int kind = block_layout(w.type).kind;
  const KType kt = kind == 5 ? KType::kQ4 : kind == 6 ? KType::kQ5 : KType::kQ6;
  const int64_t bs = gguf::type_size(w.type);
  KSuperBlock s;
  for (int64_t b = 0; b < a.blocks; ++b) {
    const int sub = static_cast<int>(b % 8);
    if (sub == 0) k_super_block(kt, w.data + j * w.row_bytes + b / 8 * bs, s);
    const float d = fp16_to_float(s.d), dmin = fp16_to_float(s.dmin);
    const uint8_t* q = s.q + 32 * sub;
    for (int64_t i = 0; i < a.rows; ++i) {
      const int8_t* xq = a.q.data() + i * a.cols + b * kQK;
      const size_t o = static_cast<size_t>(i * a.blocks + b);
      if (kind == 7) {
        int32_t lo = 0, hi = 0;
        for (int e = 0; e < kQK / 2; ++e) lo += (q[e] - 32) * xq[e];
        for (int e = kQK / 2; e < kQK; ++e) hi += (q[e] - 32) * xq[e];
        acc[i] = acc[i] + k6_term(lo, hi, d * static_cast<float>(s.sc[2 * sub]),
                                  d * static_cast<float>(s.sc[2 * sub + 1]), a.d[o]);
      } else {
        int32_t sumi = 0;
        for (int e = 0; e < kQK; ++e) sumi += q[e] * xq[e];
        acc[i] = acc[i] + k_term(sumi, d * static_cast<float>(s.sc[sub]), dmin * static_cast<float>(s.mn[sub]),
                                 a.d[o], a.sum[o]);
      }
    }
  }
}

}  // namespace

void reference_column(const TileArgs& t, int64_t j) {
  const QuantMatrix& w = *t.w;
  const QuantActivations& a = *t.a;
  const BlockLayout layout = block_layout(w.type);
  if (layout.kind >= 5) {
    std::vector<float> acc(static_cast<size_t>(a.rows), 0.0f);
    reference_k_column(t, j, acc);
    for (int64_t i = 0; i < a.rows; ++i) t.y[i * t.ldy + j] = t.bias ? acc[i] + t.bias[j] : acc[i];
    return;
  }
  const int64_t bs = gguf::type_size(w.type);
  const uint8_t* row = w.data + j * w.row_bytes;
  std::vector<float> acc(static_cast<size_t>(a.rows), 0.0f);
  int vals[kQK];
  for (int64_t b = 0; b < a.blocks; ++b) {
    const uint8_t* blk = row + b * bs;
    for (int e = 0; e < kQK; ++e) vals[e] = block_value(layout, blk, e);
    const float dw = fp16_to_float(load_u16(blk));
    const float mw = layout.has_min ? fp16_to_float(load_u16(blk + 2)) : 0.0f;
    for (int64_t i = 0; i < a.rows; ++i) {
      const int8_t* xq = a.q.data() + i * a.cols + b * kQK;
      int32_t sumi = 0;
      for (int e = 0; e < kQK; ++e) sumi += vals[e] * xq[e];
      const size_t o = static_cast<size_t>(i * a.blocks + b);
      acc[i] = acc[i] + block_term(sumi, dw, a.d[o], layout.has_min, mw, a.s[o]);
    }
  }
  for (int64_t i = 0; i < a.rows; ++i) t.y[i * t.ldy + j] = t.bias ? acc[i] + t.bias[j] : acc[i];
}

}  // namespace quant_detail

namespace {

constexpr const char* kOp = "[gemm_quant]";

void check_args(const float* x, int64_t m, int64_t ldx, const QuantMatrix& w, float* y, int64_t ldy) {
  QKV_CHECK_ARG(w.defined() && w.rows >= 0 && w.cols >= 0, kOp, " the weight (", w.rows, ", ", w.cols,
                ") has no data");
  QKV_CHECK_ARG(m >= 0 && ldx >= w.cols && ldy >= w.rows, kOp, " x (", m, ", ", w.cols, ") with ldx ", ldx,
                " and y (", m, ", ", w.rows, ") with ldy ", ldy, " for the ", gguf::type_name(w.type),
                " weight (n, k) = (", w.rows, ", ", w.cols, "): need m >= 0, ldx >= k, ldy >= n");
  QKV_CHECK_ARG((x != nullptr || m * w.cols == 0) && (y != nullptr || m * w.rows == 0),
                kOp, " null x or y for x (", m, ", ", w.cols, ") and the ", gguf::type_name(w.type),
                " weight (n, k) = (", w.rows, ", ", w.cols, ")");
  QKV_CHECK_RUNTIME(quant_gemm_integer(w.type) || can_dequantize(w.type), kOp, " no product for ",
                    gguf::type_name(w.type), " weights (n, k) = (", w.rows, ", ", w.cols, ")");
}

// Fixed-order float32 dot: lane l sums the products of indices l mod 8 in order, then ((0+1)+(2+3))+((4+5)+(6+7)).
float dot8(const float* a, const float* b, int64_t k) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t t = 0;
  for (; t + 8 <= k; t += 8)
    for (int l = 0; l < 8; ++l) s[l] = s[l] + a[t + l] * b[t + l];
  for (int l = 0; t + l < k; ++l) s[l] = s[l] + a[t + l] * b[t + l];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// The types without an integer product: 16 weight rows at a time dequantized to float32, dotted with every row.
void float_path(const float* x, int64_t m, int64_t ldx, const QuantMatrix& w, const float* bias, float* y,
                int64_t ldy) {
  constexpr int64_t kRows = 16;
  const int64_t n = w.rows, k = w.cols, tiles = (n + kRows - 1) / kRows;
#pragma omp parallel if (tiles > 1 && m * n * k >= (int64_t{1} << 18))
  {
    std::vector<float> buf(static_cast<size_t>(kRows * k));
#pragma omp for schedule(static)
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int64_t j0 = tile * kRows, rows = std::min(kRows, n - j0);
      for (int64_t r = 0; r < rows; ++r) dequantize_row(w.type, w.data + (j0 + r) * w.row_bytes, &buf[r * k], k);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t r = 0; r < rows; ++r) {
          const float v = dot8(x + i * ldx, &buf[r * k], k);
          y[i * ldy + j0 + r] = bias ? v + bias[j0 + r] : v;
        }
    }
  }
}

// The tiles of one build: `fn` over whole tiles of `tile` columns (nullptr: every column by the reference).
struct Tiles {
  TileFn fn = nullptr;
  int64_t tile = 1;
  bool vector_quantizer = false;  // the avx512vnni build quantizes activations with its vector loop
};

// Output columns [j0, j1) of t (j0 a multiple of the tile): whole tiles below `done` by the build, the rest by the
// reference. One thread.
void columns(const TileArgs& t, const Tiles& b, int64_t done, int64_t j0, int64_t j1, std::vector<uint8_t>& scratch) {
  int64_t j = j0;
  if (b.fn)
    for (; j + b.tile <= std::min(j1, done); j += b.tile) b.fn(t, j, scratch);
  for (; j < j1; ++j) quant_detail::reference_column(t, j);
}

// Where the whole tiles end: the tiles gather a block's scales from their rows at int32 offsets, so rows too long
// for that run the reference (a repacked matrix reads no offsets).
int64_t tiles_end(const QuantMatrix& w, const Tiles& b) {
  if (!b.fn) return 0;
  if (!w.packed && w.row_bytes * b.tile >= (int64_t{1} << 31)) return 0;
  return w.rows / b.tile * b.tile;
}

// The integer products of one x: activations quantized once; per product its whole tiles by the build and the
// columns past its last whole tile by the reference; one parallel region over the items of all products in order.
void run_integer(const float* x, int64_t m, int64_t ldx, const QuantProduct* p, int64_t count, const Tiles& b) {
  QuantActivations a;
  quantize_rows(x, m, ldx, p[0].w->cols, a, b.vector_quantizer);
  struct Part {
    TileArgs t;
    int64_t done, tiles, first;  // whole tiles end at column done; its items start at `first` of all
  };
  std::vector<Part> parts(static_cast<size_t>(count));
  int64_t items = 0, work = 0;
  for (int64_t i = 0; i < count; ++i) {
    const QuantMatrix& w = *p[i].w;
    const int64_t done = tiles_end(w, b), tiles = done / b.tile;
    parts[i] = Part{TileArgs{&a, &w, p[i].bias, p[i].y, p[i].ldy}, done, tiles, items};
    items += tiles + (w.rows - done);  // whole tiles, then single columns
    work += m * w.rows * w.cols;
  }
  const auto item = [&](int64_t c, std::vector<uint8_t>& scratch) {
    size_t i = 0;
    while (i + 1 < parts.size() && parts[i + 1].first <= c) ++i;
    const Part& q = parts[i];
    const int64_t u = c - q.first, j0 = u < q.tiles ? u * b.tile : q.done + (u - q.tiles);
    columns(q.t, b, q.done, j0, u < q.tiles ? j0 + b.tile : j0 + 1, scratch);
  };
  if (work < (int64_t{1} << 18) || items <= 1) {  // as the int8 product: below, no parallel region at all
    std::vector<uint8_t> scratch;
    for (int64_t c = 0; c < items; ++c) item(c, scratch);
    return;
  }
#pragma omp parallel
  {
    std::vector<uint8_t> scratch;
#pragma omp for schedule(static)
    for (int64_t c = 0; c < items; ++c) item(c, scratch);
  }
}

// A matrix kept as its repacked tiles only (QuantMatrix::packed_only) is read by the builds that read only them.
void check_rows_kept(const QuantMatrix& w, const Tiles& b, const char* op) {
  if (w.data != nullptr || w.rows * w.cols == 0) return;
  const bool tiles_only = b.fn && w.packed && w.rows % quant_detail::kPackRows == 0 &&
                          (b.tile == quant_detail::kPackRows || block_layout(w.type).kind >= 5);
  QKV_CHECK_RUNTIME(tiles_only, op, " the ", gguf::type_name(w.type), " weight (n, k) = (", w.rows, ", ", w.cols,
                    ") was kept as repacked tiles only (packed_only), which this build does not read");
}

void run(const float* x, int64_t m, int64_t ldx, const QuantMatrix& w, const float* bias, float* y, int64_t ldy,
         const Tiles& b) {
  check_args(x, m, ldx, w, y, ldy);
  check_rows_kept(w, b, kOp);
  if (m == 0 || w.rows == 0) return;
  if (!quant_gemm_integer(w.type)) return float_path(x, m, ldx, w, bias, y, ldy);
  const QuantProduct p{&w, bias, y, ldy};
  run_integer(x, m, ldx, &p, 1, b);
}

enum class Build { kPortable, kAvx2, kAvx512Vnni };

Build active_build() {
  const Isa isa = active_isa();
  if (isa >= Isa::kAvx512Vnni) return Build::kAvx512Vnni;
  if (isa >= Isa::kAvx2) return Build::kAvx2;
  return Build::kPortable;
}

}  // namespace

namespace portable {
void gemm_quant(const float* x, int64_t m, int64_t ldx, const QuantMatrix& w, const float* bias, float* y,
                int64_t ldy) {
  run(x, m, ldx, w, bias, y, ldy, Tiles{});
}
}  // namespace portable

namespace avx2 {
void gemm_quant(const float* x, int64_t m, int64_t ldx, const QuantMatrix& w, const float* bias, float* y,
                int64_t ldy) {
  QKV_CHECK_RUNTIME(cpu_supports(Isa::kAvx2), kOp, " the avx2 build needs AVX2 + FMA, which this CPU lacks");
  run(x, m, ldx, w, bias, y, ldy, Tiles{quant_detail::avx2::tile, quant_detail::avx2::kTile, false});
}
}  // namespace avx2

namespace avx512 {
void gemm_quant(const float* x, int64_t m, int64_t ldx, const QuantMatrix& w, const float* bias, float* y,
                int64_t ldy) {
  QKV_CHECK_RUNTIME(cpu_supports(Isa::kAvx512Vnni), kOp,
                    " the avx512vnni build needs AVX-512 F/BW/DQ/VL + VNNI, which this CPU lacks");
  run(x, m, ldx, w, bias, y, ldy, Tiles{quant_detail::avx512::tile, quant_detail::avx512::kTile, true});
}
}  // namespace avx512

void gemm_quant(const float* x, int64_t m, int64_t ldx, const QuantMatrix& w, const float* bias, float* y,
                int64_t ldy) {
  switch (active_build()) {
    case Build::kAvx512Vnni: return avx512::gemm_quant(x, m, ldx, w, bias, y, ldy);
    case Build::kAvx2: return avx2::gemm_quant(x, m, ldx, w, bias, y, ldy);
    case Build::kPortable: break;
  }
  portable::gemm_quant(x, m, ldx, w, bias, y, ldy);
}

namespace {

Tiles active_tiles() {
  switch (active_build()) {
    case Build::kAvx512Vnni: return {quant_detail::avx512::tile, quant_detail::avx512::kTile, true};
    case Build::kAvx2: return {quant_detail::avx2::tile, quant_detail::avx2::kTile, false};
    case Build::kPortable: break;
  }
  return {};
}

constexpr const char* kMlpOp = "[gated_mlp_quant]";
constexpr const char* kManyOp = "[gemm_quant_many]";

void check_mlp(const float* x, int64_t m, int64_t ldx, const QuantMatrix& gate, const QuantMatrix& up,
               const QuantMatrix& down, const float* y, int64_t ldy) {
  const int64_t e = gate.cols, f = gate.rows;
  QKV_CHECK_ARG(gate.defined() && up.defined() && down.defined() && quant_gemm_integer(gate.type) &&
                    quant_gemm_integer(up.type) && quant_gemm_integer(down.type),
                kMlpOp, " gate ", gguf::type_name(gate.type), " (", gate.rows, ", ", gate.cols, "), up ",
                gguf::type_name(up.type), " (", up.rows, ", ", up.cols, ") and down ", gguf::type_name(down.type),
                " (", down.rows, ", ", down.cols, ") must be defined integer-product types (Q4_0, Q4_1, Q5_0, Q5_1, "
                "Q8_0, Q4_K, Q5_K, Q6_K)");
  QKV_CHECK_ARG(up.type == gate.type && up.rows == f && up.cols == e && down.rows == e && down.cols == f &&
                    f % kQK == 0,
                kMlpOp, " gate (", gate.rows, ", ", gate.cols, ") and up (", up.rows, ", ", up.cols,
                ") must be one type and shape (f, e), down (", down.rows, ", ", down.cols, ") must be (e, f), and f a"
                " multiple of ", kQK);
  QKV_CHECK_ARG(m >= 0 && ldx >= e && ldy >= e && ((x != nullptr && y != nullptr) || m == 0), kMlpOp, " x (", m,
                ", ", e, ") with ldx ", ldx, " and y with ldy ", ldy, ": need m >= 0, ldx >= e, ldy >= e, x and y"
                " non-null");
}

}  // namespace

void gemm_quant_many(const float* x, int64_t m, int64_t ldx, const QuantProduct* products, int64_t count) {
  QKV_CHECK_ARG(count >= 0 && (products != nullptr || count == 0), kManyOp, " ", count, " products");
  const Tiles b = active_tiles();
  std::vector<QuantProduct> integer;
  for (int64_t i = 0; i < count; ++i) {
    const QuantProduct& p = products[i];
    QKV_CHECK_ARG(p.w != nullptr, kManyOp, " product ", i, " of ", count, " has no weight");
    QKV_CHECK_ARG(p.w->cols == products[0].w->cols, kManyOp, " the weights (", products[0].w->rows, ", ",
                  products[0].w->cols, ") and (", p.w->rows, ", ", p.w->cols, ") of products 0 and ", i,
                  " take inputs of different lengths");
    check_args(x, m, ldx, *p.w, p.y, p.ldy);
    check_rows_kept(*p.w, b, kManyOp);
    if (m == 0 || p.w->rows == 0) continue;
    if (quant_gemm_integer(p.w->type))
      integer.push_back(p);
    else
      float_path(x, m, ldx, *p.w, p.bias, p.y, p.ldy);
  }
  if (!integer.empty()) run_integer(x, m, ldx, integer.data(), static_cast<int64_t>(integer.size()), b);
}

void gated_mlp_quant_reference(const float* x, int64_t m, int64_t ldx, const QuantMatrix& gate,
                               const float* gate_bias, const QuantMatrix& up, const float* up_bias,
                               const QuantMatrix& down, const float* down_bias, float* y, int64_t ldy) {
  check_mlp(x, m, ldx, gate, up, down, y, ldy);
  const int64_t f = gate.rows;
  std::vector<float> g(static_cast<size_t>(m * f)), u(g.size()), h(g.size());
  portable::gemm_quant(x, m, ldx, gate, gate_bias, g.data(), f);
  portable::gemm_quant(x, m, ldx, up, up_bias, u.data(), f);
  silu_forward(g.data(), h.data(), m * f);
  for (size_t i = 0; i < h.size(); ++i) h[i] = h[i] * u[i];
  portable::gemm_quant(h.data(), m, f, down, down_bias, y, ldy);
}

void gated_mlp_quant(const float* x, int64_t m, int64_t ldx, const QuantMatrix& gate, const float* gate_bias,
                     const QuantMatrix& up, const float* up_bias, const QuantMatrix& down, const float* down_bias,
                     float* y, int64_t ldy) {
  check_mlp(x, m, ldx, gate, up, down, y, ldy);
  if (m == 0) return;
  const Tiles b = active_tiles();
  for (const QuantMatrix* w : {&gate, &up, &down}) check_rows_kept(*w, b, kMlpOp);
  // silu_forward's own build, called here without its OpenMP loop (a nested region per call): the rule of its
  // dispatch (activations.cpp), so h has the bits of silu_forward over all of it.
  const auto silu = active_isa() >= Isa::kAvx2 ? avx2::silu_forward : portable::silu_forward;
  const int64_t e = gate.cols, f = gate.rows;
  QuantActivations ax, ah;
  quantize_rows(x, m, ldx, e, ax, b.vector_quantizer);
  ah.rows = m;
  ah.cols = f;
  ah.blocks = f / kQK;
  ah.q.resize(static_cast<size_t>(m * f));
  ah.d.resize(static_cast<size_t>(m * ah.blocks));
  ah.s.resize(ah.d.size());
  ah.sum.resize(ah.d.size());
  ah.sum_lo.resize(ah.d.size());
  // Gate and up rows from the tensor storage pool, left unzeroed (every element is written before it is read): a
  // prefill's MBs per layer are then neither zeroed nor faulted in again at every call.
  const std::shared_ptr<float> gate_up = storage_pool::allocate(2 * m * f);
  float* const g = gate_up.get();
  float* const u = g + m * f;
  const TileArgs tg{&ax, &gate, gate_bias, g, f}, tu{&ax, &up, up_bias, u, f};
  const TileArgs td{&ah, &down, down_bias, y, ldy};
  const int64_t gate_done = tiles_end(gate, b), up_done = tiles_end(up, b), down_done = tiles_end(down, b);
  // Blocks of 32 columns: one quantization block of h per row, and whole tiles of every build (8, 16).
  const int64_t h_items = f / kQK, y_items = (e + kQK - 1) / kQK;
  const bool parallel = m * 3 * e * f >= (int64_t{1} << 18);
#pragma omp parallel if (parallel)
  {
    std::vector<uint8_t> scratch;
    // This thread's run of h's column blocks (static, contiguous): gate and up, then per row SiLU over the run
    // (one call: the lanes fall as in one call over all of h, f and the run being multiples of 32), the product
    // with up, and the run's quantization blocks of h.
    const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t c0 = h_items * tid / nt, c1 = h_items * (tid + 1) / nt;
    if (c0 < c1) {
      const int64_t j0 = c0 * kQK, j1 = c1 * kQK;
      columns(tg, b, gate_done, j0, j1, scratch);
      columns(tu, b, up_done, j0, j1, scratch);
      for (int64_t i = 0; i < m; ++i) {
        float* gi = g + i * f;
        const float* ui = u + i * f;
        silu(gi + j0, gi + j0, j1 - j0);
        for (int64_t j = j0; j < j1; ++j) gi[j] = gi[j] * ui[j];
        const size_t o = static_cast<size_t>(i * ah.blocks + c0);
        int8_t* q = ah.q.data() + i * f + j0;
        if (b.vector_quantizer) {
          quant_detail::avx512::quantize_blocks(gi + j0, c1 - c0, q, &ah.d[o], &ah.s[o], &ah.sum[o], &ah.sum_lo[o]);
        } else {
          for (int64_t c = 0; c < c1 - c0; ++c)
            quant_detail::quantize_block(gi + j0 + c * kQK, q + c * kQK, ah.d[o + c], ah.s[o + c], ah.sum[o + c],
                                         ah.sum_lo[o + c]);
        }
      }
    }
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t c = 0; c < y_items; ++c) columns(td, b, down_done, c * kQK, std::min(e, (c + 1) * kQK), scratch);
  }
}

const char* quant_gemm_path() {
  switch (active_build()) {
    case Build::kAvx512Vnni: return "avx512vnni";
    case Build::kAvx2: return "avx2";
    case Build::kPortable: break;
  }
  return "portable";
}

std::string quant_gemm_path(gguf::Type type) {
  return quant_gemm_integer(type) ? quant_gemm_path() : "float32 (dequantized rows)";
}

}  // namespace qkv::kernels
