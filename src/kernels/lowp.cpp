// The portable builds of the low-precision kernels (lowp_impl.h), the per-row int8 quantization and the threaded
// dispatchers; the AVX2 builds are lowp_avx2.cpp.
#include "qkv/kernels/lowp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include <omp.h>

#include "attention_flash_kernels.h"
#include "lowp_amx_impl.h"
#include "lowp_impl.h"
#include "qkv/core/error.h"
#include "qkv/core/parallel_for.h"
#include "qkv/kernels/cpu.h"
#include "qkv/kernels/grad.h"
#include "sgemm_kernels.h"

namespace qkv::kernels {
namespace {

constexpr int64_t kParallelMin = int64_t{1} << 16;  // elements per OpenMP region for the element-wise passes
constexpr int64_t kBlockM = 64, kBlockN = 64;       // c blocks of the int8 product (one OpenMP work item each)

// f(b, e) over chunks of [0, n): over the OpenMP team where n is large, else one call on the calling thread (no
// parallel region: a small tile's conversion would pay a team's set-up per call).
template <class F>
void chunked(int64_t n, F f) {
  const int64_t chunks = n >= kParallelMin ? std::max<int64_t>(1, n / (kParallelMin / 4)) : 1;
  parallel_for(chunks > 1, chunks, [&](int64_t ch) {
    // Multiples of 16 so that every chunk but the last runs whole vectors.
    const int64_t b = (n * ch / chunks) & ~int64_t{15}, e = ch + 1 == chunks ? n : (n * (ch + 1) / chunks) & ~int64_t{15};
    f(b, e);
  });
}


// The low-precision kernels of one ISA build; null where that build has none (bf16_packed: the bf16 product rounds
// its operands, then runs float32; int8_packed: int8 weights stay unpacked; pack_bf16: packed one word at a time;
// amx_*: the vector builds at every row count). One row per Isa, picked once by the probe (active_isa()).
struct Kernels {
  decltype(&portable::bf16_round_range) bf16_round = avx2::bf16_round_range;
  decltype(&portable::float_to_bf16_range) to_bf16 = avx2::float_to_bf16_range;
  decltype(&portable::bf16_to_float_range) from_bf16 = avx2::bf16_to_float_range;
  decltype(&portable::quantize_row_int8) quantize_row = avx2::quantize_row_int8;
  decltype(&avx512vnni::gemm_int8_packed_block) int8_packed = nullptr;
  decltype(&avx512bf16::gemm_bf16_packed_block) bf16_packed = nullptr;
  decltype(&avx512bf16::pack_bf16_panels) pack_bf16 = nullptr;
  decltype(&amx::gemm_bf16_packed_block) amx_bf16 = nullptr;
  decltype(&amx::gemm_int8_packed_block) amx_int8 = nullptr;
};
constexpr Kernels kPortable{.bf16_round = portable::bf16_round_range,
                            .to_bf16 = portable::float_to_bf16_range,
                            .from_bf16 = portable::bf16_to_float_range,
                            .quantize_row = portable::quantize_row_int8};
constexpr Kernels kAvx2{.int8_packed = avx2::gemm_int8_packed_block};  // and kAvx512: no build of its own
constexpr Kernels kAvx2Vnni{.int8_packed = avxvnni::gemm_int8_packed_block};
constexpr Kernels kAvx512Vnni{.int8_packed = avx512vnni::gemm_int8_packed_block};
constexpr Kernels kAvx512Bf16{.int8_packed = avx512vnni::gemm_int8_packed_block,
                              .bf16_packed = avx512bf16::gemm_bf16_packed_block,
                              .pack_bf16 = avx512bf16::pack_bf16_panels};
constexpr Kernels kAmx{.int8_packed = avx512vnni::gemm_int8_packed_block,
                       .bf16_packed = avx512bf16::gemm_bf16_packed_block,
                       .pack_bf16 = avx512bf16::pack_bf16_panels,
                       .amx_bf16 = amx::gemm_bf16_packed_block,
                       .amx_int8 = amx::gemm_int8_packed_block};

const Kernels& kernels() {
  static const Kernels* const k = [] {
    switch (active_isa()) {
      case Isa::kPortable: return &kPortable;
      case Isa::kAvx2: return &kAvx2;
      case Isa::kAvx2Vnni: return &kAvx2Vnni;
      case Isa::kAvx512: return &kAvx2;
      case Isa::kAvx512Vnni: return &kAvx512Vnni;
      case Isa::kAvx512Bf16: return &kAvx512Bf16;
      case Isa::kAmx: return &kAmx;
    }
    return &kPortable;
  }();
  return *k;
}
}  // namespace

namespace portable {
void bf16_round_range(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = detail::bf16_round_one(x[i]);
}
void float_to_bf16_range(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<uint16_t>(detail::bf16_round_bits(x[i]) >> 16);
}
void bf16_to_float_range(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t{x[i]} << 16;
    std::memcpy(y + i, &u, sizeof u);
  }
}
void gemm_int8_block(const Int8View& a, const Int8View& b, const float* bias, float* c, int64_t ldc, int64_t m0,
                     int64_t m1, int64_t n0, int64_t n1) {
  const int64_t blocks = a.groups();
  for (int64_t i = m0; i < m1; ++i)
    for (int64_t j = n0; j < n1; ++j)
      c[i * ldc + j] = detail::int8_entry(&a.q[i * a.ld], &a.scale[i * blocks], a.group, blocks, &b.q[j * b.ld],
                                          b.scale[j], bias, j);
}

// The plain references of the packed products: every entry by a loop over k in the packed layout.
void gemm_bf16_packed_block(const float* x, int64_t ldx, const PackedBView& w, const float* bias, float* c,
                            int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t xks) {
  for (int64_t j = n0; j < n1; ++j) {
    const int64_t l = w.col0 + j;
    const uint32_t* panel = w.data + (l / kPanel) * w.groups * kPanel;
    for (int64_t i = m0; i < m1; ++i) {
      float acc = 0.0f;
      for (int64_t g = 0; g < w.groups; ++g) {
        const uint32_t word = panel[g * kPanel + l % kPanel];
        const uint32_t b0 = word << 16, b1 = word & 0xffff0000u;
        float wb[2];
        std::memcpy(&wb[0], &b0, 4);
        std::memcpy(&wb[1], &b1, 4);
        for (int t = 0; t < 2; ++t) {
          const int64_t kk = 2 * g + t;
          if (kk < w.k) acc += detail::bf16_round_one(x[i * ldx + kk * xks]) * wb[t];
        }
      }
      c[i * ldc + j] = bias ? acc + bias[j] : acc;
    }
  }
}

void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  for (int64_t j = n0; j < n1; ++j) {
    const int64_t l = w.col0 + j;
    const uint32_t* panel = w.data + (l / kPanel) * w.groups * kPanel;
    for (int64_t i = m0; i < m1; ++i) {
      const int64_t blocks = a.groups(), words = a.group / 4;  // 4 k per word
      float acc = 0.0f;
      for (int64_t g = 0; g < blocks; ++g) {
        int32_t sum = 0;
        for (int64_t wd = g * words; wd < (g + 1) * words; ++wd) {
          const uint32_t word = panel[wd * kPanel + l % kPanel];
          for (int t = 0; t < 4; ++t) {
            const int32_t wv = static_cast<int8_t>(static_cast<uint8_t>(word >> (8 * t)));
            sum += int32_t{a.q[i * a.ld + 4 * wd + t]} * wv;
          }
        }
        acc = detail::int8_accumulate(acc, sum, a.scale[i * blocks + g]);
      }
      // scale is indexed from the view's first panel, like the packed data
      c[i * ldc + j] = detail::int8_finish(acc, w.scale[l], bias, j);
    }
  }
}

void quantize_row_int8(const float* x, int64_t cols, int64_t group, int64_t blocks, int16_t* q, float* scale) {
  bool finite = true;
  for (int64_t j = 0; j < cols; ++j) finite = finite && std::isfinite(x[j]);
  if (!finite) {
    std::fill(scale, scale + blocks, std::nanf(""));
    return;  // q stays 0; the NaN scales make the row's products NaN
  }
  for (int64_t g = 0; g < blocks; ++g) {
    const int64_t j0 = g * group, j1 = std::min(cols, j0 + group);
    float amax = 0.0f;
    for (int64_t j = j0; j < j1; ++j) amax = std::max(amax, std::fabs(x[j]));
    if (amax == 0.0f) continue;
    const float inv = 127.0f / amax;
    for (int64_t j = j0; j < j1; ++j)
      q[j] = static_cast<int16_t>(std::clamp(std::nearbyint(x[j] * inv), -127.0f, 127.0f));
    scale[g] = amax / 127.0f;
  }
}
}  // namespace portable

float bf16_round(float x) { return detail::bf16_round_one(x); }

void bf16_round(const float* x, float* y, int64_t n) {
  const auto k = kernels().bf16_round;
  chunked(n, [&](int64_t b, int64_t e) { k(x + b, y + b, e - b); });
}

void float_to_bf16(const float* x, uint16_t* y, int64_t n) {
  const auto k = kernels().to_bf16;
  chunked(n, [&](int64_t b, int64_t e) { k(x + b, y + b, e - b); });
}

void bf16_to_float(const uint16_t* x, float* y, int64_t n) {
  const auto k = kernels().from_bf16;
  chunked(n, [&](int64_t b, int64_t e) { k(x + b, y + b, e - b); });
}

Int8View Int8Rows::view(int64_t begin, int64_t end) const {
  QKV_CHECK_ARG(0 <= begin && begin <= end && end <= rows, "[int8] rows [", begin, ", ", end, ") outside ", rows);
  const int64_t blocks = group > 0 ? ld / group : 0;
  return {q.data() + begin * ld, scale.data() + begin * blocks, end - begin, cols, ld, group};
}

int64_t int8_ld(int64_t cols) { return (cols + kInt8Group - 1) / kInt8Group * kInt8Group; }

void quantize_rows_int8(const float* x, int64_t rows, int64_t cols, int64_t ldx, Int8Rows& out, bool per_row) {
  QKV_CHECK_ARG(rows >= 0 && cols >= 0 && ldx >= cols && (rows == 0 || cols == 0 || x != nullptr),
                "[quantize_int8] rows ", rows, ", cols ", cols, ", ldx ", ldx, " (ldx >= cols, x non-null)");
  QKV_CHECK_ARG(cols <= (int64_t{1} << 17), "[quantize_int8] cols ", cols,
                " exceeds 131072 (the int32 sums of the int8 product must stay exact)");
  out.rows = rows;
  out.cols = cols;
  out.ld = int8_ld(cols);
  out.group = per_row ? std::max<int64_t>(out.ld, 1) : kInt8Group;
  const int64_t blocks = out.ld / out.group, group = out.group;
  out.q.assign(static_cast<size_t>(rows * out.ld), 0);
  out.scale.assign(static_cast<size_t>(rows * blocks), 0.0f);
  const auto k = kernels().quantize_row;
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r)
    k(x + r * ldx, cols, group, blocks, &out.q[r * out.ld], &out.scale[r * blocks]);
}

void gemm_int8_nt(const Int8View& a, const Int8View& b, const float* bias, float* c, int64_t ldc) {
  QKV_CHECK_ARG(a.cols == b.cols && a.ld == b.ld, "[gemm_int8] a (", a.rows, ", ", a.cols, ") and b (", b.rows, ", ",
                b.cols, ") must have the same number of columns");
  QKV_CHECK_ARG(b.group == b.ld && a.group > 0 && a.ld % a.group == 0 && a.group % 16 == 0, "[gemm_int8] b (", b.rows,
                ", ", b.cols, ") must have one scale per row and a blocks of a multiple of 16 columns (a group ",
                a.group, ", ld ", a.ld, ")");
  QKV_CHECK_ARG(ldc >= b.rows && (a.rows == 0 || b.rows == 0 || c != nullptr), "[gemm_int8] ldc ", ldc,
                " must be >= n = ", b.rows, " and c non-null");
  const auto k = portable::gemm_int8_block;  // every other path packs its int8 weights
  const int64_t bm = (a.rows + kBlockM - 1) / kBlockM, bn = (b.rows + kBlockN - 1) / kBlockN;
#pragma omp parallel for schedule(dynamic) if (bm * bn > 1 && a.rows * b.rows * a.ld >= (int64_t{1} << 18))
  for (int64_t t = 0; t < bm * bn; ++t) {
    const int64_t i = t / bn, j = t % bn;
    k(a, b, bias, c, ldc, i * kBlockM, std::min(a.rows, (i + 1) * kBlockM), j * kBlockN,
      std::min(b.rows, (j + 1) * kBlockN));
  }
}

PackedBView PackedB::view(int64_t begin, int64_t end) const {
  QKV_CHECK_ARG(0 <= begin && begin <= end && end <= n, "[packed weight] columns [", begin, ", ", end, ") outside ",
                n);
  const int64_t p = begin / kPanel;
  PackedBView v;
  v.data = data.data() + p * groups * kPanel;
  v.colsum = colsum.empty() ? nullptr : colsum.data() + p * (groups * 4 / kInt8Group) * kPanel;
  v.scale = scale.empty() ? nullptr : scale.data() + p * kPanel;
  v.col0 = begin - p * kPanel;
  v.n = end - begin;
  v.k = k;
  v.groups = groups;
  return v;
}

void pack_bf16(const float* w, int64_t n, int64_t k, int64_t stride_n, int64_t stride_k, PackedB& out) {
  QKV_CHECK_ARG(n >= 0 && k >= 0 && (n == 0 || k == 0 || w != nullptr), "[pack_bf16] n ", n, ", k ", k,
                " (w non-null)");
  out.n = n;
  out.k = k;
  out.groups = (k + 1) / 2;
  const int64_t panels = (n + kPanel - 1) / kPanel;
  out.data.assign(static_cast<size_t>(panels * out.groups * kPanel), 0u);
  out.colsum.clear();
  out.scale.clear();
  if (const auto pack = kernels().pack_bf16) {  // the vector packing: the same words, panels in parallel
#pragma omp parallel for schedule(static) if (n * k >= kParallelMin)
    for (int64_t p = 0; p < panels; ++p) pack(w, n, k, stride_n, stride_k, p, p + 1, out.data.data());
    return;
  }
#pragma omp parallel for schedule(static) if (n * k >= kParallelMin)
  for (int64_t j = 0; j < n; ++j) {
    uint32_t* panel = out.data.data() + (j / kPanel) * out.groups * kPanel + j % kPanel;
    for (int64_t g = 0; g < out.groups; ++g) {
      const uint32_t lo = detail::bf16_round_bits(w[j * stride_n + 2 * g * stride_k]) >> 16;
      const uint32_t hi = 2 * g + 1 < k ? detail::bf16_round_bits(w[j * stride_n + (2 * g + 1) * stride_k]) >> 16 : 0u;
      panel[g * kPanel] = lo | (hi << 16);
    }
  }
}

void pack_int8(const Int8View& w, PackedB& out) {
  QKV_CHECK_ARG(w.cols <= kInt8PackedMaxK, "[pack_int8] k ", w.cols, " exceeds ", kInt8PackedMaxK,
                " (the offset-activation sums must stay exact in int32)");
  QKV_CHECK_ARG(w.group == w.ld && w.ld % kInt8Group == 0, "[pack_int8] the weight rows must have one scale per row");
  out.n = w.rows;
  out.k = w.cols;
  out.groups = w.ld / 4;  // whole blocks of kInt8Group, as the activations are quantized
  const int64_t blocks = w.ld / kInt8Group, words = kInt8Group / 4;
  const int64_t panels = (w.rows + kPanel - 1) / kPanel;
  out.data.assign(static_cast<size_t>(panels * out.groups * kPanel), 0u);
  out.colsum.assign(static_cast<size_t>(panels * blocks * kPanel), 0);
  out.scale.assign(static_cast<size_t>(panels * kPanel), 0.0f);
  for (int64_t j = 0; j < w.rows; ++j) {
    const int64_t p = j / kPanel, lane = j % kPanel;
    uint32_t* panel = out.data.data() + p * out.groups * kPanel + lane;
    const int16_t* q = w.q + j * w.ld;
    for (int64_t g = 0; g < blocks; ++g) {
      int32_t sum = 0;
      for (int64_t wd = g * words; wd < (g + 1) * words; ++wd) {
        uint32_t word = 0;
        for (int t = 0; t < 4; ++t) {
          const int32_t v = q[4 * wd + t];
          sum += v;
          word |= static_cast<uint32_t>(static_cast<uint8_t>(static_cast<int8_t>(v))) << (8 * t);
        }
        panel[wd * kPanel] = word;
      }
      out.colsum[static_cast<size_t>((p * blocks + g) * kPanel + lane)] = sum;
    }
    out.scale[static_cast<size_t>(j)] = w.scale[j];
  }
}

namespace amx_emulated {
void gemm_bf16_packed_block(const float* x, int64_t ldx, const PackedBView& w, const float* bias, float* c,
                            int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  detail::amx_bf16_block<detail::EmulatedTiles, detail::ScalarRows>(x, ldx, w, bias, c, ldc, m0, m1, n0, n1);
}
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  detail::amx_int8_block<detail::EmulatedTiles, detail::ScalarRows>(a, w, bias, c, ldc, m0, m1, n0, n1);
}
}  // namespace amx_emulated

// The fused attention's bf16 products over the emulated tile unit with plain-loop copies and stores: the reference
// that the amx and amx-emulated sets' products (lowp_amx.cpp, AVX-512 copies) are tested against.
void flash::gemm_bf16_amx_reference(const flash::GemmBf16& g) {
  detail::amx_pairs_product<detail::EmulatedTiles, detail::ScalarRows>(
      g.rows, g.cols, g.depth, g.a, g.a_rs, g.a_ks, g.b, g.b_ks, g.c, g.c_rs, g.row_scale, g.accumulate, g.scale);
}

namespace {

// The threaded driver of both packed products: items of (M block, share of the panels), cut by sgemm's rule.
// row_tile: the rows of c one pass of the block's kernel computes (14 for the vector builds, 32 for AMX): M blocks
// are whole passes.
template <class Block>
void run_packed(int64_t m, int64_t k, const PackedBView& w, Block block, int64_t row_tile = 14) {
  if (m == 0 || w.n == 0) return;
  const int64_t panels = (w.col0 + w.n + kPanel - 1) / kPanel;
  // Few rows (decoding) are memory-bound: a large weight keeps the threads even for one row, as in ad::linear.
  const double weights = double(w.n) * double(std::max<int64_t>(k, 1));
  const double work = std::max(double(m) * weights, kWeightReadWork * weights);
  int threads = 1;
  if (!omp_in_parallel())
    threads = static_cast<int>(std::clamp<double>(work / kWorkPerThread, 1.0, double(omp_get_max_threads())));
  // M blocks of packed rows (4 bytes per k-group) of about 256 KB at most, so they stay in L2.
  // sgemm's rule cuts rows in its 14-row panels: each stands for one pass of row_tile rows here.
  const int64_t passes = (m + row_tile - 1) / row_tile;
  const int64_t unit_bytes = std::max<int64_t>(4 * w.groups * row_tile / 14, 1);  // packed bytes per unit row
  const int64_t mc_max = std::max<int64_t>(14, (int64_t{1} << 18) / unit_bytes / 14 * 14);
  Split split = choose_split(passes * 14, panels, threads, mc_max);
  split.mc = split.mc / 14 * row_tile;
  const int64_t m_blocks = (m + split.mc - 1) / split.mc, per_split = (panels + split.n_splits - 1) / split.n_splits;
  const int64_t items = m_blocks * split.n_splits;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && items > 1)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t ib = item / split.n_splits, sp = item % split.n_splits;
    const int64_t i0 = ib * split.mc, i1 = std::min(m, i0 + split.mc);
    // Panels [s0, s1) as view columns (the first panel starts at -col0).
    const int64_t j0 = std::max<int64_t>(0, sp * per_split * kPanel - w.col0);
    const int64_t j1 = std::min<int64_t>(w.n, (sp + 1) * per_split * kPanel - w.col0);
    if (j0 < j1) block(i0, i1, j0, j1);
  }
}

// The AMX products' driver: run_packed in whole 32-row passes.
template <class Block>
void run_amx(int64_t m, const PackedBView& w, Block block) {
  run_packed(m, w.k, w, block, detail::kAmxRows);
}

}  // namespace

void amx_emulated::gemm_bf16_packed(const float* x, int64_t m, int64_t ldx, const PackedBView& w, const float* bias,
                                    float* c, int64_t ldc) {
  run_amx(m, w, [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    amx_emulated::gemm_bf16_packed_block(x, ldx, w, bias, c, ldc, i0, i1, j0, j1);
  });
}

void gemm_bf16_packed(const float* x, int64_t m, int64_t ldx, const PackedBView& w, const float* bias, float* c,
                      int64_t ldc, int64_t xks) {
  QKV_CHECK_ARG(m >= 0 && xks >= 1 && ldx >= 1 && (xks == 1 ? ldx >= w.k : ldx == 1 ? xks >= m : true) &&
                    ldc >= w.n && (m == 0 || w.n == 0 || (x && c)),
                "[gemm_bf16] m ", m, ", ldx ", ldx, ", k stride ", xks, " (rows ldx >= k = ", w.k,
                " apart, or k stride >= m when ldx is 1), ldc ", ldc, " (>= n = ", w.n, ")");
  const Kernels& ks = kernels();
  QKV_CHECK_RUNTIME(ks.bf16_packed != nullptr, "[gemm_bf16] the packed bf16 product needs AVX512-BF16 (",
                    isa_name(active_isa()), " is active)");
  // AMX from a few rows on (activations in rows): one pass computes 32; fewer rows, and decoding's one, stay on
  // vdpbf16ps, which reads the weight once for them at the same cost.
  if (ks.amx_bf16 && xks == 1 && m >= kAmxMinRows) {
    run_amx(m, w, [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
      ks.amx_bf16(x, ldx, w, bias, c, ldc, i0, i1, j0, j1);
    });
    return;
  }
  run_packed(m, w.k, w, [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    ks.bf16_packed(x, ldx, w, bias, c, ldc, i0, i1, j0, j1, xks);
  });
}

void gemm_int8_packed(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc) {
  QKV_CHECK_ARG(a.cols == w.k && a.ld == 4 * w.groups && ldc >= w.n && (a.rows == 0 || w.n == 0 || c),
                "[gemm_int8] a (", a.rows, ", ", a.cols, ") and the packed weight (", w.n, ", ", w.k,
                ") must have the same k; ldc ", ldc);
  QKV_CHECK_ARG(a.group == kInt8Group, "[gemm_int8] the packed product takes activations in blocks of ", kInt8Group,
                " (group ", a.group, ")");
  const Kernels& ks = kernels();
  QKV_CHECK_RUNTIME(ks.int8_packed != nullptr, "[gemm_int8] the packed int8 product needs AVX512-VNNI or AVX-VNNI (",
                    isa_name(active_isa()), " is active)");
  if (ks.amx_int8 && a.rows >= kAmxMinRows) {  // the same bits as the VNNI builds (exact int32 sums)
    run_amx(a.rows, w, [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
      ks.amx_int8(a, w, bias, c, ldc, i0, i1, j0, j1);
    });
    return;
  }
  run_packed(a.rows, w.k, w, [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    ks.int8_packed(a, w, bias, c, ldc, i0, i1, j0, j1);
  });
}

bool gemm_int8_packed_runs() { return kernels().int8_packed != nullptr; }

bool gemm_bf16_packed_runs() { return kernels().bf16_packed != nullptr; }

LowpPaths lowp_paths() {
  // Where the CPU reports AMX but the OS or the kernel refused it, the probe's reason replaces "no AMX".
  const CpuFeatures& f = cpu_features();
  const Isa isa = active_isa();
  static const std::string refused =
      std::string("avx512bf16 vdpbf16ps (weights packed once, float32 accumulation; ") + f.amx_refused + ")";
  const char* bf16 =
      isa >= Isa::kAmx ? "amx tdpbf16ps (weights packed once, float32 accumulation; under 16 rows avx512bf16 vdpbf16ps)"
      : isa >= Isa::kAvx512Bf16
          ? (f.amx ? "avx512bf16 vdpbf16ps (weights packed once, float32 accumulation; QKV_ISA caps AMX)"
             : *f.amx_refused ? refused.c_str()
                              : "avx512bf16 vdpbf16ps (weights packed once, float32 accumulation; no AMX on this CPU)")
      : f.avx512_bf16
          ? (isa >= Isa::kAvx2 ? "converting (QKV_ISA caps AVX512-BF16): bf16-rounded operands, float32 avx2 kernels"
                               : "converting (QKV_ISA caps AVX512-BF16): bf16-rounded operands, float32 portable kernels")
      : isa >= Isa::kAvx2 ? "converting (no AVX512-BF16/AMX on this CPU): bf16-rounded operands, float32 avx2 kernels"
                          : "converting (no AVX512-BF16/AMX on this CPU): bf16-rounded operands, float32 portable kernels";
  const char* int8 =
      isa >= Isa::kAmx
          ? "amx tdpbusd (weights packed once, exact int32 accumulation; under 16 rows avx512vnni vpdpbusd)"
      : isa >= Isa::kAvx512Vnni
          ? (f.amx ? "avx512vnni vpdpbusd (weights packed once, exact int32 accumulation; QKV_ISA caps AMX)"
                   : "avx512vnni vpdpbusd (weights packed once, exact int32 accumulation; no AMX on this CPU)")
      : isa == Isa::kAvx2Vnni
          ? (f.avx512
                 ? "avx2vnni vpdpbusd ymm (weights packed once, exact int32 accumulation; QKV_ISA caps AVX-512)"
                 : "avx2vnni vpdpbusd ymm (weights packed once, exact int32 accumulation; no AVX-512 on this CPU)")
      : isa >= Isa::kAvx2
          ? (f.avx512_vnni || f.avx_vnni
                 ? "avx2 vpmaddwd (weights packed once, u8·s8 quads as int16 pairs, exact int32 accumulation; QKV_ISA "
                   "caps VNNI)"
                 : "avx2 vpmaddwd (weights packed once, u8·s8 quads as int16 pairs, exact int32 accumulation; no VNNI "
                   "on this CPU)")
          : "portable (exact int32 accumulation)";
  return {bf16, int8};
}

}  // namespace qkv::kernels
