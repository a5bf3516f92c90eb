// Linear and matmul at bf16 / int8 precision (qkv/ops/lowp.h) over kernels/lowp and the float32 sgemm path.
#include "qkv/ops/lowp.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "qkv/core/error.h"
#include "qkv/ops/matmul.h"
#include "matmul_internal.h"

namespace qkv {

Tensor round_to_bf16(const Tensor& x) {
  QKV_CHECK_ARG(x.defined(), "[round_to_bf16] undefined tensor");
  const Tensor c = x.contiguous();
  Tensor out = Tensor::empty(x.shape());
  kernels::bf16_round(c.data(), out.data(), c.numel());
  return out;
}

static_assert(std::endian::native == std::endian::little, "bf16 pairs: element 2i is the low half of word i");

Tensor to_bf16_pairs(const Tensor& x) {
  QKV_CHECK_ARG(x.defined() && x.dim() >= 1 && x.size(-1) % 2 == 0, "[to_bf16_pairs] x ",
                x.defined() ? str(x.shape()) : std::string("(undefined)"), " needs an even last dim");
  const Tensor c = x.contiguous();
  Shape shape = x.shape();
  shape.back() /= 2;
  Tensor out = Tensor::empty(shape);
  kernels::float_to_bf16(c.data(), reinterpret_cast<uint16_t*>(out.data()), c.numel());
  return out;
}

Tensor from_bf16_pairs(const Tensor& words) {
  QKV_CHECK_ARG(words.defined() && words.dim() >= 1, "[from_bf16_pairs] words must have rank >= 1");
  const Tensor c = words.contiguous();
  Shape shape = words.shape();
  shape.back() *= 2;
  Tensor out = Tensor::empty(shape);
  kernels::bf16_to_float(reinterpret_cast<const uint16_t*>(c.data()), out.data(), out.numel());
  return out;
}

LinearWeight::LinearWeight(const Tensor& weight, Precision precision) : precision_(precision) {
  QKV_CHECK_ARG(weight.defined() && weight.dim() == 2, "[linear] weight must be (out, in), got ",
                weight.defined() ? str(weight.shape()) : std::string("(undefined)"));
  begin_ = 0;
  end_ = weight.size(0);
  in_ = weight.size(1);
  switch (precision) {
    case Precision::kFloat32:
      weight_ = weight;
      if (weight.is_contiguous()) {  // weightᵀ (in, out) packed once for sgemm's own kernel (where it runs)
        kernels::SgemmPackedB p;
        kernels::sgemm_pack_b(true, in_, end_, weight.data(), in_, p);
        if (p.packed()) packed32_ = std::make_shared<const kernels::SgemmPackedB>(std::move(p));
      }
      break;
    case Precision::kBFloat16:
      if (kernels::gemm_bf16_packed_runs()) {
        const Tensor c = weight.contiguous();
        auto p = std::make_shared<kernels::PackedB>();
        kernels::pack_bf16(c.data(), end_, in_, in_, 1, *p);
        packed_ = std::move(p);
      } else {
        weight_ = round_to_bf16(weight);
      }
      break;
    case Precision::kInt8: {
      const Tensor c = weight.contiguous();
      auto q = std::make_shared<kernels::Int8Rows>();
      kernels::quantize_rows_int8(c.data(), end_, in_, in_, *q, /*per_row=*/true);
      if (kernels::gemm_int8_packed_runs() && in_ <= kernels::kInt8PackedMaxK) {  // avx512vnni or avx2vnni
        auto p = std::make_shared<kernels::PackedB>();
        kernels::pack_int8(q->view(), *p);
        packed_ = std::move(p);
      } else {
        int8_ = std::move(q);
      }
      break;
    }
  }
}

LinearWeight LinearWeight::quantized(kernels::QuantMatrix weight) {
  QKV_CHECK_ARG(weight.defined(), "[linear] the quantized weight (", weight.rows, ", ", weight.cols,
                ") has no data");
  LinearWeight w;
  w.precision_ = kernels::quant_gemm_integer(weight.type) ? Precision::kInt8 : Precision::kFloat32;
  w.begin_ = 0;
  w.end_ = weight.rows;
  w.in_ = weight.cols;
  w.quant_ = std::make_shared<const kernels::QuantMatrix>(weight.for_products());  // tiles repacked once
  return w;
}

LinearWeight LinearWeight::rows(int64_t begin, int64_t end) const {
  QKV_CHECK_ARG(defined() && 0 <= begin && begin <= end && end <= out_features(), "[linear] rows [", begin, ", ",
                end, ") outside the weight's ", out_features(), " output features");
  LinearWeight w = *this;
  if (weight_.defined()) w.weight_ = weight_.slice(0, begin, end);
  w.begin_ = begin_ + begin;
  w.end_ = begin_ + end;
  return w;
}

Tensor linear(const Tensor& x, const LinearWeight& w, const Tensor& bias) {
  QKV_CHECK_ARG(w.defined(), "[linear] the LinearWeight is empty (default-constructed)");
  if (w.precision_ == Precision::kFloat32 && !w.quant_) {
    const bool aligned = w.begin_ % kernels::kSgemmPanel == 0;  // a row slice read from the packed panels
    return detail::linear(x, w.weight_, bias, aligned ? w.packed32_.get() : nullptr, w.begin_);
  }
  if (w.precision_ == Precision::kBFloat16 && !w.packed_) {
    QKV_CHECK_ARG(x.defined(), "[linear] undefined input");
    return linear(round_to_bf16(x), w.weight_, bias);
  }
  const std::string kind = w.quant_ ? gguf::type_name(w.quant_->type)
                                   : w.precision_ == Precision::kInt8 ? "int8" : "bf16";
  QKV_CHECK_ARG(x.defined() && x.dim() >= 1 && x.size(-1) == w.in_, "[linear] x ",
                x.defined() ? str(x.shape()) : std::string("(undefined)"), " must have last dim in_features = ", w.in_,
                " (", kind, " weight (", w.out_features(), ", ", w.in_, "))");
  const int64_t outf = w.out_features();
  QKV_CHECK_ARG(!bias.defined() || (bias.dim() == 1 && bias.size(0) == outf), "[linear] bias ", str(bias.shape()),
                " must be (", outf, ",) for the ", kind, " weight (", outf, ", ", w.in_, ")");
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = shape_numel(out_shape);
  out_shape.push_back(outf);
  Tensor out = Tensor::empty(out_shape);
  if (rows == 0 || outf == 0) return out;
  const Tensor xc = x.contiguous();
  const Tensor bc = bias.defined() ? bias.contiguous() : Tensor();
  const float* b = bc.defined() ? bc.data() : nullptr;
  if (w.quant_) {  // the stored blocks of rows [begin_, end_)
    kernels::gemm_quant(xc.data(), rows, w.in_, w.quant_->slice(w.begin_, w.end_), b, out.data(), outf);
    return out;
  }
  if (w.precision_ == Precision::kBFloat16) {
    kernels::gemm_bf16_packed(xc.data(), rows, w.in_, w.packed_->view(w.begin_, w.end_), b, out.data(), outf);
    return out;
  }
  kernels::Int8Rows xq;
  kernels::quantize_rows_int8(xc.data(), rows, w.in_, w.in_, xq, /*per_row=*/false);
  if (w.packed_) kernels::gemm_int8_packed(xq.view(), w.packed_->view(w.begin_, w.end_), b, out.data(), outf);
  else kernels::gemm_int8_nt(xq.view(), w.int8_->view(w.begin_, w.end_), b, out.data(), outf);
  return out;
}

}  // namespace qkv
