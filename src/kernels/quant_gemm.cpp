// The quantized product's entry points (qkv/kernels/quant_gemm.h): argument checks, the activations' quantizer, the
// portable reference (plain loops: the definition of the bits), the float32 path, and the dispatch by active_isa().
#include "qkv/kernels/quant_gemm.h"

#include <bit>
#include <cmath>
#include <limits>

#include "qkv/core/error.h"
#include "qkv/core/half.h"
#include "qkv/kernels/cpu.h"
#include "qkv/kernels/quant.h"
#include "quant_gemm_impl.h"

namespace qkv::kernels {

using quant_detail::block_layout;
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

QuantMatrix QuantMatrix::repacked() const {
  constexpr int64_t kRows = quant_detail::kPackRows;
  if (!quant_gemm_integer(type) || rows < kRows || cols == 0) return *this;
  const BlockLayout l = block_layout(type);
  const int64_t nb = cols / kQK, bs = gguf::type_size(type), tiles = rows / kRows;
  const int64_t vecs = l.kind == 4 ? 8 : 4;
  const int64_t vbytes = nb * vecs * 64, hbytes = l.qh >= 0 ? nb * 64 : 0, dbytes = nb * kRows * 2;
  const int64_t stride = (vbytes + hbytes + dbytes * (l.has_min ? 2 : 1) + 63) / 64 * 64;
  auto buffer = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(tiles * stride + 64));
  uint8_t* base = buffer->data() + (-reinterpret_cast<uintptr_t>(buffer->data()) & 63);
  const uint8_t* src = data;
  const int64_t rb = row_bytes;
#pragma omp parallel for schedule(static) if (tiles * stride >= (int64_t{1} << 20))
  for (int64_t t = 0; t < tiles; ++t) {
    uint8_t* vals = base + t * stride;
    uint8_t* hbits = vals + vbytes;
    uint8_t* dst_d = hbits + hbytes;
    uint8_t* dst_m = dst_d + dbytes;
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t r = 0; r < kRows; ++r) {
        const uint8_t* blk = src + (t * kRows + r) * rb + b * bs;
        std::memcpy(dst_d + (b * kRows + r) * 2, blk, 2);
        if (l.has_min) std::memcpy(dst_m + (b * kRows + r) * 2, blk + 2, 2);
        uint8_t* v = vals + b * vecs * 64 + r * 4;
        if (l.kind == 4) {
          for (int64_t g = 0; g < 8; ++g)
            for (int64_t e = 0; e < 4; ++e) v[g * 64 + e] = static_cast<uint8_t>(blk[l.qs + 4 * g + e] ^ 0x80u);
        } else {
          for (int64_t h = 0; h < 4; ++h) std::memcpy(v + h * 64, blk + l.qs + 4 * h, 4);
        }
        if (l.qh >= 0) {
          uint32_t qh;
          std::memcpy(&qh, blk + l.qh, 4);
          for (int g = 0; g < 8; ++g) {
            uint64_t mask;
            uint8_t* at = hbits + b * 64 + g * 8;
            std::memcpy(&mask, at, 8);
            mask |= static_cast<uint64_t>((qh >> (4 * g)) & 0xFu) << (4 * r);
            std::memcpy(at, &mask, 8);
          }
        }
      }
  }
  QuantMatrix m = *this;
  m.packed = base;
  m.packed_stride = stride;
  m.packed_owner = std::move(buffer);
  return m;
}

QuantMatrix QuantMatrix::for_products() const {
  return active_isa() >= Isa::kAvx512Vnni ? repacked() : *this;
}

bool quant_gemm_integer(gguf::Type type) {
  using gguf::Type;
  return type == Type::Q4_0 || type == Type::Q4_1 || type == Type::Q5_0 || type == Type::Q5_1 ||
         type == Type::Q8_0;
}

// --- activations -------------------------------------------------------------------------------------------------

void quantize_activations(const float* x, int64_t m, int64_t ldx, int64_t k, QuantActivations& out) {
  QKV_CHECK_ARG(m >= 0 && k >= 0 && k % kQK == 0 && ldx >= k && (x != nullptr || m * k == 0),
                "[quantize_activations] x (", m, ", ", k, ") with ldx ", ldx, ": k must be a multiple of ", kQK,
                ", ldx >= k, x non-null");
  out.rows = m;
  out.cols = k;
  out.blocks = k / kQK;
  out.q.assign(static_cast<size_t>(m * k), 0);
  out.d.assign(static_cast<size_t>(m * out.blocks), 0.0f);
  out.s.assign(out.d.size(), 0.0f);
  out.sum.assign(out.d.size(), 0);
  const int64_t nb = out.blocks;
#pragma omp parallel for schedule(static) if (m * k >= (int64_t{1} << 16))
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + i * ldx + b * kQK;
      int8_t* q = out.q.data() + i * k + b * kQK;
      const size_t o = static_cast<size_t>(i * nb + b);
      bool finite = true;
      float amax = 0.0f;
      for (int j = 0; j < kQK; ++j) {
        finite = finite && std::isfinite(xb[j]);
        amax = std::max(amax, std::fabs(xb[j]));
      }
      if (!finite) {  // the row's outputs become NaN through d and s
        out.d[o] = out.s[o] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      int32_t sum = 0;
      for (int j = 0; j < kQK; ++j) {
        q[j] = static_cast<int8_t>(std::roundf(xb[j] * id));
        sum += q[j];
      }
      out.d[o] = fp16_to_float(fp16_from_float(d));
      out.s[o] = fp16_to_float(fp16_from_float(static_cast<float>(sum) * d));
      out.sum[o] = sum;
    }
  }
}

// --- the portable reference and the float32 path ----------------------------------------------------------------

namespace quant_detail {

void reference_column(const TileArgs& t, int64_t j) {
  const QuantMatrix& w = *t.w;
  const QuantActivations& a = *t.a;
  const BlockLayout layout = block_layout(w.type);
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

// The integer product: activations quantized once, tiles of `tile` columns by `fn` (nullptr: every column by the
// reference), the columns past the last whole tile by the reference.
void run_integer(const float* x, int64_t m, int64_t ldx, const QuantMatrix& w, const float* bias, float* y,
                 int64_t ldy, TileFn fn, int64_t tile) {
  QuantActivations a;
  quantize_activations(x, m, ldx, w.cols, a);
  const TileArgs t{&a, &w, bias, y, ldy};
  // The tiles gather a block's scales from their rows at int32 offsets: rows too long for that run the reference.
  const bool offsets_fit = w.row_bytes * tile < (int64_t{1} << 31);
  const int64_t n = w.rows, tiles = fn && offsets_fit ? n / tile : 0, done = tiles * tile;
  const bool parallel = m * n * w.cols >= (int64_t{1} << 18);  // as the int8 product: below, one thread
#pragma omp parallel if (parallel && tiles > 1)
  {
    std::vector<uint8_t> scratch;
#pragma omp for schedule(static)
    for (int64_t c = 0; c < tiles; ++c) fn(t, c * tile, scratch);
  }
#pragma omp parallel for schedule(static) if (parallel && n - done > 1)
  for (int64_t j = done; j < n; ++j) quant_detail::reference_column(t, j);
}

void run(const float* x, int64_t m, int64_t ldx, const QuantMatrix& w, const float* bias, float* y, int64_t ldy,
         TileFn fn, int64_t tile) {
  check_args(x, m, ldx, w, y, ldy);
  if (m == 0 || w.rows == 0) return;
  if (!quant_gemm_integer(w.type)) return float_path(x, m, ldx, w, bias, y, ldy);
  run_integer(x, m, ldx, w, bias, y, ldy, fn, tile);
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
  run(x, m, ldx, w, bias, y, ldy, nullptr, 1);
}
}  // namespace portable

namespace avx2 {
void gemm_quant(const float* x, int64_t m, int64_t ldx, const QuantMatrix& w, const float* bias, float* y,
                int64_t ldy) {
  QKV_CHECK_RUNTIME(cpu_supports(Isa::kAvx2), kOp, " the avx2 build needs AVX2 + FMA, which this CPU lacks");
  run(x, m, ldx, w, bias, y, ldy, quant_detail::avx2::tile, quant_detail::avx2::kTile);
}
}  // namespace avx2

namespace avx512 {
void gemm_quant(const float* x, int64_t m, int64_t ldx, const QuantMatrix& w, const float* bias, float* y,
                int64_t ldy) {
  QKV_CHECK_RUNTIME(cpu_supports(Isa::kAvx512Vnni), kOp,
                    " the avx512vnni build needs AVX-512 F/BW/DQ/VL + VNNI, which this CPU lacks");
  run(x, m, ldx, w, bias, y, ldy, quant_detail::avx512::tile, quant_detail::avx512::kTile);
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

void embedding_rows(const QuantMatrix& w, const int64_t* ids, int64_t count, float* out) {
  QKV_CHECK_ARG(w.defined() && count >= 0 && ((ids != nullptr && out != nullptr) || count == 0),
                "[embedding_rows] ", count, " ids of the ", gguf::type_name(w.type), " table (", w.rows, ", ",
                w.cols, "): null ids or out, or a negative count");
  for (int64_t i = 0; i < count; ++i)
    QKV_CHECK_ARG(ids[i] >= 0 && ids[i] < w.rows, "[embedding_rows] id ", ids[i], " at position ", i,
                  " outside the table's ", w.rows, " rows (", gguf::type_name(w.type), " (", w.rows, ", ", w.cols,
                  "))");
  for (int64_t i = 0; i < count; ++i) dequantize_row(w.type, w.data + ids[i] * w.row_bytes, out + i * w.cols, w.cols);
}

}  // namespace qkv::kernels
