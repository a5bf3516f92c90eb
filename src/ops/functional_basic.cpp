// Differentiable products, elementwise ops, reductions, softmax, layer_norm, embedding and dropout:
// each forward calls the qkv op, each backward its backward half (linear accumulates straight into the grads).
#include <algorithm>
#include <cmath>
#include <memory>
#include <span>

#include "qkv/kernels/activations.h"
#include "functional_internal.h"
#include "qkv/kernels/grad.h"
#include "qkv/kernels/layer_norm.h"
#include "qkv/core/error.h"
#include "qkv/ops/dropout.h"
#include "qkv/ops/lowp.h"
#include "qkv/ops/matmul.h"
#include "qkv/ops/softmax.h"
#include "qkv/ops/functional.h"
#include "qkv/ops/layer_norm.h"

namespace qkv::ad {

using detail::record;
using Douts = std::span<const Tensor>;

// --- products --------------------------------------------------------------------------------------------------

namespace {

// Batched products whose operands share one batch shape (no broadcasting) run here as a loop of sgemms on
// contiguous operands: tiny products stay on one thread (an OpenMP region costs more than they do), large batches
// of small products spread over threads.
constexpr int64_t kParallelBatchWork = int64_t{1} << 21;  // multiply-adds

bool same_batch(const Tensor& a, const Tensor& b) {
  return a.dim() == b.dim() && a.dim() >= 3 && std::equal(a.shape().begin(), a.shape().end() - 2, b.shape().begin());
}

// out[i] (+)= op(A[i]) · op(B[i]) for contiguous (nb, ., .) operands; ta / tb transpose A / B's matrices.
void batched_gemm(bool ta, bool tb, int64_t nb, int64_t m, int64_t n, int64_t k, const float* A, const float* B,
                  float beta, float* C) {
  const int64_t sa = m * k, sb = k * n, sc = m * n;
  const int64_t lda = ta ? m : k, ldb = tb ? k : n;
#pragma omp parallel for schedule(static) if (nb >= 2 && nb * m * n * k >= kParallelBatchWork)
  for (int64_t i = 0; i < nb; ++i)
    kernels::gemm(ta, tb, m, n, k, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc, n);
}

}  // namespace

Var matmul(const Var& a, const Var& b) {
  detail::check_defined(a, "matmul", "a");
  detail::check_defined(b, "matmul", "b");
  if (!same_batch(a.value, b.value) || a.size(-1) != b.size(-2) || a.numel() == 0 || b.numel() == 0) {
    // Broadcasting (or a mistake, reported by qkv::matmul): the general op and its backward half.
    const Tensor out = qkv::matmul(a.value, b.value);
    return record(out, {&a, &b}, [&] { return [a, b](Tape& t, Douts d) {
      const Tensor& dc = d[0];
      if (t.needs(a) && t.needs(b)) {
        MatmulGrads g = matmul_backward(a.value, b.value, dc);
        t.accumulate_owned(a, g.da);
        t.accumulate_owned(b, g.db);
      } else if (t.needs(a)) {
        t.accumulate_owned(a, detail::sum_to(qkv::matmul(dc, b.value.transpose(-1, -2)), a.shape()));
      } else {
        t.accumulate_owned(b, detail::sum_to(qkv::matmul(a.value.transpose(-1, -2), dc), b.shape()));
      }
    }; });
  }
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1), nb = a.numel() / std::max<int64_t>(m * k, 1);
  const Tensor A = a.value.contiguous(), B = b.value.contiguous();
  Shape out_shape = a.shape();
  out_shape.back() = n;
  Tensor out = Tensor::empty(out_shape);
  batched_gemm(false, false, nb, m, n, k, A.data(), B.data(), 0.0f, out.data());
  return record(out, {&a, &b}, [&] { return [a, b, A, B, nb, m, n, k](Tape& t, Douts d) {
    const Tensor dc = d[0].contiguous();
    if (t.needs(a)) {  // dA = dC·Bᵀ
      bool fresh = false;
      Tensor g = t.accumulator(a, fresh);
      batched_gemm(false, true, nb, m, k, n, dc.data(), B.data(), fresh ? 0.0f : 1.0f, g.data());
    }
    if (t.needs(b)) {  // dB = Aᵀ·dC
      bool fresh = false;
      Tensor g = t.accumulator(b, fresh);
      batched_gemm(true, false, nb, k, n, m, A.data(), dc.data(), fresh ? 0.0f : 1.0f, g.data());
    }
  }; });
}

Var linear(const Var& x, const Var& weight, const Var& bias) {
  detail::check_defined(x, "linear", "x");
  detail::check_defined(weight, "linear", "weight");
  Tensor out;
  {
    // Few rows (decoding) make the product memory-bound: a large weight keeps the threads even for one row (a
    // 768 x 768 weight is 2.4 MB: ~120 µs on one core).
    const int64_t in = weight.size(1), rows = in ? x.numel() / in : 0;
    const kernels::SmallBlasGuard guard(kernels::blas_work(rows, weight.size(0), in));
    out = qkv::linear(x.value, weight.value, bias.value);
  }
  return record(out, {&x, &weight, &bias}, [&] { return [x, weight, bias](Tape& t, Douts d) {
    const int64_t in = weight.size(1), outf = weight.size(0);
    const Tensor dy = d[0].contiguous();
    const int64_t rows = outf ? dy.numel() / outf : 0;
    if (t.needs(x)) {
      int64_t wr = 0, ldw = 0;
      const Tensor W = kernels::as_rows(weight.value, wr, ldw);
      bool fresh = false;
      Tensor gx = t.accumulator(x, fresh);
      kernels::gemm(false, false, rows, in, outf, dy.data(), outf, W.data(), ldw, fresh ? 0.0f : 1.0f, gx.data(),
                    in);
    }
    if (t.needs(weight)) {
      int64_t xr = 0, ldx = 0;
      const Tensor X = kernels::as_rows(x.value, xr, ldx);
      bool fresh = false;
      Tensor gw = t.accumulator(weight, fresh);
      kernels::gemm(true, false, outf, in, rows, dy.data(), outf, X.data(), ldx, fresh ? 0.0f : 1.0f, gw.data(),
                    in);
    }
    if (t.needs(bias)) {
      bool fresh = false;
      Tensor gb = t.accumulator(bias, fresh);
      kernels::column_sums(dy.data(), rows, outf, gb.data(), fresh);
    }
  }; });
}

Var linear(const Var& x, const Var& weight, const Var& bias, Precision precision) {
  if (precision == Precision::kFloat32) return linear(x, weight, bias);
  detail::check_defined(x, "linear", "x");
  detail::check_defined(weight, "linear", "weight");
  QKV_CHECK_ARG(precision == Precision::kBFloat16, "[linear] precision ", precision_name(precision),
                " is for inference (a LinearWeight); on a tape linear runs in fp32 or bf16 (x ", str(x.shape()),
                ", weight ", str(weight.shape()), ")");
  // The weight as it is now (a training step changes it in place): rounded or packed here, never cached.
  const Tensor out = qkv::linear(x.value, LinearWeight(weight.value, precision), bias.value);
  return record(out, {&x, &weight, &bias}, [&] { return [x, weight, bias](Tape& t, Douts d) {
    const int64_t in = weight.size(1), outf = weight.size(0);
    const Tensor dy = d[0].contiguous();
    const int64_t rows = outf ? dy.numel() / outf : 0;
    const Tensor dy2 = dy.view({rows, outf});
    if (t.needs(x))  // bf16(dy)·bf16(W): (rows, in)
      t.accumulate_owned(x, qkv::matmul(dy2, weight.value, Precision::kBFloat16).view(x.shape()));
    if (t.needs(weight))  // bf16(dy)ᵀ·bf16(x): (out, in)
      t.accumulate_owned(weight,
                         qkv::matmul(dy2.transpose(0, 1), x.value.reshape({rows, in}), Precision::kBFloat16));
    if (t.needs(bias)) {
      bool fresh = false;
      Tensor gb = t.accumulator(bias, fresh);
      kernels::column_sums(dy.data(), rows, outf, gb.data(), fresh);
    }
  }; });
}

Var round_to_bf16(const Var& x) {
  detail::check_defined(x, "round_to_bf16", "x");
  return record(qkv::round_to_bf16(x.value), {&x}, [&] { return [x](Tape& t, Douts d) { t.accumulate(x, d[0]); }; });
}

// --- elementwise -----------------------------------------------------------------------------------------------

Var add(const Var& a, const Var& b) {
  detail::check_defined(a, "add", "a");
  detail::check_defined(b, "add", "b");
  return record(qkv::add(a.value, b.value), {&a, &b}, [&] { return [a, b](Tape& t, Douts d) {
    if (t.needs(a)) t.accumulate(a, detail::sum_to(d[0], a.shape()));
    if (t.needs(b)) t.accumulate(b, detail::sum_to(d[0], b.shape()));
  }; });
}

Var sub(const Var& a, const Var& b) {
  detail::check_defined(a, "sub", "a");
  detail::check_defined(b, "sub", "b");
  return record(qkv::sub(a.value, b.value), {&a, &b}, [&] { return [a, b](Tape& t, Douts d) {
    if (t.needs(a)) t.accumulate(a, detail::sum_to(d[0], a.shape()));
    if (t.needs(b)) t.accumulate_owned(b, qkv::scale(detail::sum_to(d[0], b.shape()), -1.0f));
  }; });
}

Var mul(const Var& a, const Var& b) {
  detail::check_defined(a, "mul", "a");
  detail::check_defined(b, "mul", "b");
  return record(qkv::mul(a.value, b.value), {&a, &b}, [&] { return [a, b](Tape& t, Douts d) {
    if (t.needs(a)) t.accumulate_owned(a, detail::sum_to(qkv::mul(d[0], b.value), a.shape()));
    if (t.needs(b)) t.accumulate_owned(b, detail::sum_to(qkv::mul(d[0], a.value), b.shape()));
  }; });
}

Var scale(const Var& x, float s) {
  detail::check_defined(x, "scale", "x");
  return record(qkv::scale(x.value, s), {&x}, [&] {
    return [x, s](Tape& t, Douts d) { t.accumulate_owned(x, qkv::scale(d[0], s)); };
  });
}

Var relu(const Var& x) {
  detail::check_defined(x, "relu", "x");
  return record(qkv::relu(x.value), {&x}, [&] {
    return [x](Tape& t, Douts d) { t.accumulate_owned(x, relu_backward(x.value, d[0])); };
  });
}

// GELU through the vectorised kernels of src/kernels/activations.cpp (libm's erf per element costs more than the GEMMs
// around it); values within 2e-7 of qkv::gelu.
Var gelu(const Var& x, GeluApprox approx) {
  detail::check_defined(x, "gelu", "x");
  const bool th = approx == GeluApprox::kTanh;
  const Tensor xc = x.value.contiguous();
  Tensor y = Tensor::empty(xc.shape());
  kernels::gelu_forward(xc.data(), y.data(), xc.numel(), th);
  return record(y, {&x}, [&] { return [x, xc, th](Tape& t, Douts d) {
    const Tensor dy = d[0].contiguous();
    bool fresh = false;
    Tensor acc = t.accumulator(x, fresh);
    if (fresh) {
      kernels::gelu_backward(xc.data(), dy.data(), acc.data(), xc.numel(), th);
      return;
    }
    Tensor g = Tensor::empty(xc.shape());
    kernels::gelu_backward(xc.data(), dy.data(), g.data(), xc.numel(), th);
    kernels::add_into(acc, g);
  }; });
}

// tanh and sigmoid through the vectorised kernels of src/kernels/activations.cpp (~2 ulp; libm's tanhf per element dominated
// the Bahdanau score).
Var tanh(const Var& x) {
  detail::check_defined(x, "tanh", "x");
  const Tensor xc = x.value.contiguous();
  Tensor y = Tensor::empty(xc.shape());
  kernels::tanh_forward(xc.data(), y.data(), xc.numel());
  return record(y, {&x}, [&] { return [x, y](Tape& t, Douts d) { t.accumulate_owned(x, tanh_backward(y, d[0])); }; });
}

Var sigmoid(const Var& x) {
  detail::check_defined(x, "sigmoid", "x");
  const Tensor xc = x.value.contiguous();
  Tensor y = Tensor::empty(xc.shape());
  kernels::sigmoid_forward(xc.data(), y.data(), xc.numel());
  return record(y, {&x}, [&] {
    return [x, y](Tape& t, Douts d) { t.accumulate_owned(x, sigmoid_backward(y, d[0])); };
  });
}

// --- reductions ------------------------------------------------------------------------------------------------

Var sum(const Var& x) {
  detail::check_defined(x, "sum", "x");
  double acc = 0.0;
  const Tensor c = x.value.contiguous();
  const float* p = c.data();
  for (int64_t i = 0; i < c.numel(); ++i) acc += p[i];
  return record(Tensor::scalar(static_cast<float>(acc)), {&x}, [&] { return [x](Tape& t, Douts d) {
    t.accumulate_owned(x, Tensor::full(x.shape(), d[0].item()));
  }; });
}

Var mean(const Var& x) {
  detail::check_defined(x, "mean", "x");
  QKV_CHECK_ARG(x.numel() > 0, "[mean] x ", str(x.shape()), " is empty");
  return scale(sum(x), 1.0f / static_cast<float>(x.numel()));
}

// --- softmax and normalisation ---------------------------------------------------------------------------------

Var softmax(const Var& x, int64_t axis) {
  detail::check_defined(x, "softmax", "x");
  const Tensor y = qkv::softmax(x.value, axis);
  return record(y, {&x}, [&] {
    return [x, y, axis](Tape& t, Douts d) { t.accumulate_owned(x, softmax_backward(y, d[0], axis)); };
  });
}

Var log_softmax(const Var& x, int64_t axis) {
  detail::check_defined(x, "log_softmax", "x");
  const Tensor y = qkv::log_softmax(x.value, axis);
  return record(y, {&x}, [&] {
    return [x, y, axis](Tape& t, Douts d) { t.accumulate_owned(x, log_softmax_backward(y, d[0], axis)); };
  });
}

// Validation and shapes as qkv::layer_norm; the math is the float32 kernels of qkv/kernels/layer_norm.h (the forward
// agrees with qkv::layer_norm to ~1e-7 relative).
Var silu(const Var& x) {
  detail::check_defined(x, "silu", "x");
  return record(qkv::silu(x.value), {&x}, [&] {
    return [x](Tape& t, Douts d) { t.accumulate_owned(x, silu_backward(x.value, d[0])); };
  });
}

Var rms_norm(const Var& x, const Var& weight, float eps, bool unit_offset) {
  detail::check_defined(x, "rms_norm", "x");
  RmsNormResult r = qkv::rms_norm(x.value, weight.value, eps, unit_offset);
  return record(r.y, {&x, &weight}, [&] { return [x, weight, rstd = r.rstd, unit_offset](Tape& t, Douts d) {
    RmsNormGrads g = rms_norm_backward(x.value, weight.value, rstd, d[0], unit_offset);
    if (t.needs(x)) t.accumulate_owned(x, g.dx);
    if (t.needs(weight)) t.accumulate_owned(weight, g.dweight);
  }; });
}

Var layer_norm(const Var& x, const Var& weight, const Var& bias, float eps) {
  detail::check_defined(x, "layer_norm", "x");
  QKV_CHECK_ARG(x.dim() >= 1 && x.size(-1) > 0, "[layer_norm] x ", str(x.shape()),
                " must have rank >= 1 and a non-empty last dim");
  const int64_t e = x.size(-1);
  QKV_CHECK_ARG(eps >= 0.0f && std::isfinite(eps), "[layer_norm] eps must be finite and >= 0, got ", eps);
  for (const Var* p : {&weight, &bias})
    QKV_CHECK_ARG(!p->defined() || p->shape() == Shape{e}, "[layer_norm] weight/bias ", str(p->shape()),
                  " must be (", e, ",) for x ", str(x.shape()));
  // Nothing to record: the op's own forward (what inference always ran), without saving mean and rstd.
  if (!detail::tape_of({&x, &weight, &bias})) return Var(qkv::layer_norm(x.value, weight.value, bias.value, eps).y);
  const Tensor xc = x.value.contiguous();
  const Tensor w = weight.defined() ? weight.value.contiguous() : Tensor();
  const Tensor b = bias.defined() ? bias.value.contiguous() : Tensor();
  const int64_t rows = xc.numel() / e;
  Tensor y = Tensor::empty(xc.shape());
  Tensor mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
  kernels::layer_norm_rows(xc.data(), w.defined() ? w.data() : nullptr, b.defined() ? b.data() : nullptr, eps, rows,
                           e, y.data(), mean.data(), rstd.data());
  return record(y, {&x, &weight, &bias}, [&] { return [x, xc, weight, w, bias, mean, rstd, rows, e](Tape& t, Douts d) {
    const Tensor dy = d[0].contiguous();
    Tensor dw = t.needs(weight) ? Tensor::empty({e}) : Tensor();
    Tensor db = t.needs(bias) ? Tensor::empty({e}) : Tensor();
    bool fresh = false;
    Tensor base;  // a shared gradient of x so far (a residual branch): summed in by the kernel, not copied first
    Tensor dx = t.needs(x) ? t.accumulator_or_base(x, fresh, base) : Tensor::empty(xc.shape());
    const float* dx_in = base.defined() ? base.data() : (t.needs(x) && !fresh ? dx.data() : nullptr);
    kernels::layer_norm_rows_backward(xc.data(), w.defined() ? w.data() : nullptr, mean.data(), rstd.data(),
                                      dy.data(), rows, e, dx.data(), dx_in, dw.defined() ? dw.data() : nullptr,
                                      db.defined() ? db.data() : nullptr);
    if (dw.defined()) t.accumulate(weight, dw);
    if (db.defined()) t.accumulate(bias, db);
  }; });
}

// --- lookup and dropout ----------------------------------------------------------------------------------------

Var embedding(const Var& weight, const Ids& ids, std::optional<int64_t> padding_idx) {
  detail::check_defined(weight, "embedding", "weight");
  const Tensor out = qkv::embedding(weight.value, ids);
  int64_t pad = -1;
  if (padding_idx) {
    const int64_t V = weight.size(0);
    QKV_CHECK_ARG(*padding_idx >= -V && *padding_idx < V, "[embedding] padding_idx ", *padding_idx,
                  " is outside [-V, V) for weight ", str(weight.shape()));
    pad = *padding_idx < 0 ? *padding_idx + V : *padding_idx;
  }
  auto saved = std::make_shared<const Ids>(ids);
  return record(out, {&weight}, [&] { return [weight, saved, pad](Tape& t, Douts d) {
    Tensor g = t.accumulator_zeroed(weight);
    if (pad < 0) {
      embedding_backward(g, *saved, d[0]);
      return;
    }
    Tensor dy = d[0].clone();  // padding positions contribute nothing
    const int64_t e = weight.size(1);
    for (size_t i = 0; i < saved->data.size(); ++i)
      if (saved->data[i] == pad) std::fill(dy.data() + i * e, dy.data() + (i + 1) * e, 0.0f);
    embedding_backward(g, *saved, dy);
  }; });
}

Var dropout(const Var& x, float p, bool training, Rng& rng) {
  detail::check_defined(x, "dropout", "x");
  DropoutResult r = qkv::dropout(x.value, p, training, rng);
  if (!r.mask.defined()) return x;  // identity: no node
  return record(r.y, {&x}, [&] { return [x, mask = r.mask, p](Tape& t, Douts d) {
    t.accumulate_owned(x, dropout_backward(d[0], mask, p));
  }; });
}

}  // namespace qkv::ad
