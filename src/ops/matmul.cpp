// Batched matmul with broadcasting and PyTorch's linear, both through kernels::sgemm (AVX-512 or OpenBLAS).
// Strided operands whose last two dims form a row- or column-major matrix go to sgemm without a copy.
// Backward halves are restated as matmuls of transposed views, reduced over broadcast dims.
#include "qkv/ops/matmul.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/kernels/lowp.h"
#include "qkv/kernels/sgemm.h"
#include "qkv/ops/lowp.h"
#include "qkv/ops/elementwise.h"
#include "matmul_internal.h"

namespace qkv {
namespace {

// How a (rows, cols) matrix with strides (sr, sc) is handed to row-major sgemm.
struct MatLayout {
  bool ok = false;     // false: needs a contiguous copy first
  bool trans = false;  // true: stored column-major, pass CblasTrans
  int64_t ld = 0;
};

MatLayout layout_of(int64_t rows, int64_t cols, int64_t sr, int64_t sc) {
  MatLayout l;
  // Row-major: unit column stride (irrelevant for one column), rows at least `cols` apart.
  if ((cols == 1 || sc == 1) && (rows == 1 || sr >= std::max<int64_t>(cols, 1))) {
    l.ok = true;
    l.ld = rows == 1 ? std::max<int64_t>(cols, 1) : sr;
    return l;
  }
  // Column-major: unit row stride, columns at least `rows` apart.
  if ((rows == 1 || sr == 1) && (cols == 1 || sc >= std::max<int64_t>(rows, 1))) {
    l.ok = true;
    l.trans = true;
    l.ld = cols == 1 ? std::max<int64_t>(rows, 1) : sc;
    return l;
  }
  return l;
}

void check_blas_int(int64_t v, const char* op, const char* what) {
  QKV_CHECK_RUNTIME(v <= INT_MAX, "[", op, "] ", what, " ", v, " exceeds the BLAS int range");
}

// C (m, n) row-major with ldc = n  =  A (m, k) · B (k, n)  (+ C when accumulate).
// packed: B pre-packed by sgemm_pack_b, B being its columns [col0, col0 + n).
void gemm(const float* a, const MatLayout& la, const float* b, const MatLayout& lb, float* c,
          int64_t m, int64_t n, int64_t k, bool accumulate, const kernels::SgemmPackedB* packed = nullptr,
          int64_t col0 = 0) {
  kernels::sgemm(la.trans, lb.trans, m, n, k, 1.0f, a, la.ld, b, lb.ld, accumulate ? 1.0f : 0.0f, c,
                 std::max<int64_t>(n, 1), packed, col0);
}

// B (k, n) rounded to bf16 and packed for the AVX512-BF16 kernel: W(j, p) = B(p, j).
void pack_b_bf16(const float* b, const MatLayout& lb, int64_t n, int64_t k, kernels::PackedB& w) {
  if (lb.trans) kernels::pack_bf16(b, n, k, lb.ld, 1, w);
  else kernels::pack_bf16(b, n, k, 1, lb.ld, w);
}

// Returns `t` (or a contiguous copy when its last two dims are not a BLAS-able matrix) and its layout.
Tensor blas_ready(const Tensor& t, MatLayout& layout) {
  const int64_t r = t.dim();
  layout = layout_of(t.shape()[r - 2], t.shape()[r - 1], t.strides()[r - 2], t.strides()[r - 1]);
  if (layout.ok) return t;
  Tensor c = t.contiguous();
  layout = layout_of(c.shape()[r - 2], c.shape()[r - 1], c.strides()[r - 2], c.strides()[r - 1]);
  QKV_ASSERT(layout.ok);
  return c;
}

// Storage offsets of each batch matrix of `t` broadcast to `batch` (row-major batch order).
std::vector<int64_t> batch_offsets(const Tensor& t, const Shape& batch) {
  const int64_t r = t.dim();
  Shape own(t.shape().begin(), t.shape().end() - 2);
  Shape own_strides(t.strides().begin(), t.strides().end() - 2);
  // Broadcast strides: 0 on expanded or missing dims.
  Shape strides(batch.size(), 0);
  const size_t lead = batch.size() - own.size();
  for (size_t i = 0; i < own.size(); ++i) strides[lead + i] = own[i] == 1 ? 0 : own_strides[i];
  (void)r;
  std::vector<int64_t> offs(static_cast<size_t>(shape_numel(batch)));
  for_each_offset(batch, strides, [&](int64_t i, int64_t off) { offs[static_cast<size_t>(i)] = off; });
  return offs;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) { return matmul(a, b, Precision::kFloat32); }

Tensor matmul(const Tensor& a, const Tensor& b, Precision precision) {
  QKV_CHECK_ARG(precision != Precision::kInt8, "[matmul] precision int8 is for linear layers only (a ",
                a.defined() ? str(a.shape()) : std::string("(undefined)"), ", b ",
                b.defined() ? str(b.shape()) : std::string("(undefined)"), ")");
  QKV_CHECK_ARG(a.defined() && b.defined(), "[matmul] undefined operand");
  // bf16 without AVX512-BF16: the operands rounded, then the float32 product.
  const bool packed_bf16 = precision == Precision::kBFloat16 && kernels::gemm_bf16_packed_runs();
  if (precision == Precision::kBFloat16 && !packed_bf16) return matmul(round_to_bf16(a), round_to_bf16(b));
  QKV_CHECK_ARG(a.dim() >= 2 && b.dim() >= 2, "[matmul] operands must have rank >= 2, got a ",
                str(a.shape()), " and b ", str(b.shape()));
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  QKV_CHECK_ARG(b.size(-2) == k, "[matmul] a ", str(a.shape()), " and b ", str(b.shape()),
                " have mismatched inner dims (", k, " vs ", b.size(-2), ")");
  const Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                       Shape(b.shape().begin(), b.shape().end() - 2), "matmul");
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  if (shape_numel(out_shape) == 0) return Tensor::empty(out_shape);
  if (k == 0) return Tensor::zeros(out_shape);
  for (int64_t v : {m, n, k}) check_blas_int(v, "matmul", "dimension");

  MatLayout la, lb;
  Tensor A = blas_ready(a, la);
  // The bf16 kernel reads A as rows (ld, 1) or transposed (1, ld)
  const int64_t a_rs = packed_bf16 && la.trans ? 1 : la.ld, a_ks = packed_bf16 && la.trans ? la.ld : 1;
  const Tensor B = blas_ready(b, lb);
  check_blas_int(la.ld, "matmul", "leading dimension");
  check_blas_int(lb.ld, "matmul", "leading dimension");
  Tensor out = Tensor::empty(out_shape);
  const int64_t nb = shape_numel(batch);
  const std::vector<int64_t> oa = batch_offsets(A, batch), ob = batch_offsets(B, batch);

  // b shared by every batch and a's rows evenly spaced across the batch: one tall sgemm.
  const bool b_shared = std::all_of(ob.begin(), ob.end(), [&](int64_t o) { return o == ob[0]; });
  bool a_tall = !la.trans && nb > 1 && m * nb <= INT_MAX;
  for (int64_t i = 1; a_tall && i < nb; ++i) a_tall = oa[i] == oa[0] + i * m * la.ld;
  if (nb == 1 || (b_shared && a_tall)) {
    if (packed_bf16) {
      kernels::PackedB w;
      pack_b_bf16(B.data() + ob[0], lb, n, k, w);
      kernels::gemm_bf16_packed(A.data() + oa[0], m * nb, a_rs, w.view(), nullptr, out.data(), n, a_ks);
    } else {
      gemm(A.data() + oa[0], la, B.data() + ob[0], lb, out.data(), m * nb, n, k, false);
    }
    return out;
  }
  const float* pa = A.data();
  const float* pb = B.data();
  float* pc = out.data();
  if (packed_bf16) {  // B packed once per distinct batch matrix (allocations stay outside parallel regions)
    kernels::PackedB w;
    for (int64_t i = 0; i < nb; ++i) {
      if (i == 0 || ob[i] != ob[i - 1]) pack_b_bf16(pb + ob[i], lb, n, k, w);
      kernels::gemm_bf16_packed(pa + oa[i], m, a_rs, w.view(), nullptr, pc + i * m * n, n, a_ks);
    }
    return out;
  }
  // Many small products: spread the batch over threads (OpenBLAS runs one thread inside the region).
  // Below ~64k multiply-adds in total, starting threads costs more than the work.
  const bool par = nb >= 2 && m * n * k <= (int64_t{1} << 21) && nb * m * n * k >= (int64_t{1} << 16);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t i = 0; i < nb; ++i) gemm(pa + oa[i], la, pb + ob[i], lb, pc + i * m * n, m, n, k, false);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return detail::linear(x, weight, bias, nullptr, 0);
}

Tensor detail::linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const kernels::SgemmPackedB* packed,
                      int64_t col0) {
  QKV_CHECK_ARG(x.defined() && weight.defined(), "[linear] undefined input or weight");
  QKV_CHECK_ARG(x.dim() >= 1, "[linear] x must have rank >= 1, got ", str(x.shape()));
  QKV_CHECK_ARG(weight.dim() == 2, "[linear] weight must be (out, in), got ", str(weight.shape()));
  const int64_t in = x.size(-1), outf = weight.size(0);
  QKV_CHECK_ARG(weight.size(1) == in, "[linear] x ", str(x.shape()), " and weight ",
                str(weight.shape()), " disagree on in_features (", in, " vs ", weight.size(1), ")");
  if (bias.defined())
    QKV_CHECK_ARG(bias.dim() == 1 && bias.size(0) == outf, "[linear] bias ", str(bias.shape()),
                  " must be (", outf, ",) for weight ", str(weight.shape()));
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = shape_numel(out_shape);
  out_shape.push_back(outf);
  Tensor out = Tensor::empty(out_shape);
  if (rows == 0 || outf == 0) return out;
  float* pc = out.data();
  // With a bias, every row starts as the bias and the GEMM accumulates onto it (beta = 1); without one the GEMM
  // overwrites the uninitialised output (beta = 0), so nothing is filled first.
  if (bias.defined()) {
    const Tensor bc = bias.contiguous();
    const float* pb = bc.data();
#pragma omp parallel for schedule(static) if (rows * outf >= (int64_t{1} << 18))
    for (int64_t r = 0; r < rows; ++r) std::memcpy(pc + r * outf, pb, static_cast<size_t>(outf) * sizeof(float));
  } else if (in == 0) {
    std::fill_n(pc, rows * outf, 0.0f);
  }
  if (in == 0) return out;
  for (int64_t v : {rows, outf, in}) check_blas_int(v, "linear", "dimension");
  // x as (rows, in): a view when the leading dims collapse, else a copy.
  MatLayout lx, lw;
  const Tensor X = blas_ready(x.reshape({rows, in}), lx);
  // weightᵀ (in, out): the transposed view of (out, in).
  const Tensor W = blas_ready(weight.transpose(0, 1), lw);
  check_blas_int(lx.ld, "linear", "leading dimension");
  check_blas_int(lw.ld, "linear", "leading dimension");
  gemm(X.data(), lx, W.data(), lw, pc, rows, outf, in, bias.defined(), packed, col0);
  return out;
}

MatmulGrads matmul_backward(const Tensor& a, const Tensor& b, const Tensor& dc) {
  QKV_CHECK_ARG(a.defined() && b.defined() && dc.defined(), "[matmul_backward] undefined input");
  QKV_CHECK_ARG(a.dim() >= 2 && b.dim() >= 2 && a.size(-1) == b.size(-2), "[matmul_backward] a ",
                str(a.shape()), " and b ", str(b.shape()), " are not matmul operands");
  Shape out = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                               Shape(b.shape().begin(), b.shape().end() - 2), "matmul_backward");
  out.push_back(a.size(-2));
  out.push_back(b.size(-1));
  QKV_CHECK_ARG(dc.shape() == out, "[matmul_backward] dc ", str(dc.shape()), " must be ", str(out), " for a ",
                str(a.shape()), " and b ", str(b.shape()));
  MatmulGrads g;
  // dA = dC·Bᵀ, dB = Aᵀ·dC, each summed over the batch dims its operand was broadcast along.
  g.da = sum_to(matmul(dc, b.transpose(-1, -2)), a.shape());
  if (b.dim() == 2) {
    // Every batch shares b (and dc's batch is a's): fold the batch into rows, one (K, rows)·(rows, N) product.
    const int64_t k = a.size(-1), n = b.size(-1);
    const int64_t rows = shape_numel(Shape(out.begin(), out.end() - 1));
    const Tensor a2 = a.reshape({rows, k});
    g.db = matmul(a2.transpose(0, 1), dc.reshape({rows, n}));
  } else {
    g.db = sum_to(matmul(a.transpose(-1, -2), dc), b.shape());
  }
  return g;
}

LinearGrads linear_backward(const Tensor& x, const Tensor& weight, const Tensor& dy) {
  QKV_CHECK_ARG(x.defined() && weight.defined() && dy.defined(), "[linear_backward] undefined input");
  QKV_CHECK_ARG(x.dim() >= 1 && weight.dim() == 2 && weight.size(1) == x.size(-1), "[linear_backward] x ",
                str(x.shape()), " and weight ", str(weight.shape()), " are not linear operands");
  const int64_t in = weight.size(1), outf = weight.size(0);
  Shape yshape(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = shape_numel(yshape);
  yshape.push_back(outf);
  QKV_CHECK_ARG(dy.shape() == yshape, "[linear_backward] dy ", str(dy.shape()), " must be ", str(yshape),
                " for x ", str(x.shape()), " and weight ", str(weight.shape()));
  const Tensor dy2 = dy.reshape({rows, outf});
  LinearGrads g;
  g.dx = matmul(dy2, weight).view(x.shape());                       // (rows, out)·(out, in)
  g.dweight = matmul(dy2.transpose(0, 1), x.reshape({rows, in}));  // (out, rows)·(rows, in)
  std::vector<double> db(static_cast<size_t>(outf), 0.0);
  const Tensor dyc = dy2.contiguous();
  const float* pg = dyc.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < outf; ++j) db[static_cast<size_t>(j)] += pg[r * outf + j];
  g.dbias = Tensor::empty({outf});
  for (int64_t j = 0; j < outf; ++j) g.dbias.data()[j] = static_cast<float>(db[static_cast<size_t>(j)]);
  return g;
}

}  // namespace qkv
