// RnnBase: the parameter store (PyTorch names, packing and init) and input checks shared by GRU and LSTM;
// plus the operand checks of the single-step cells.
#include <cmath>
#include <cstring>
#include <string>

#include "qkv/core/error.h"
#include "qkv/nn/rnn.h"
#include "rnn_common.h"

namespace qkv::nn {

RnnBase::RnnBase(const char* op, int64_t gates, int64_t input_size, int64_t hidden_size, Rng& rng,
                 const RnnOptions& options)
    : op_(op), gates_(gates), input_size_(input_size), hidden_size_(hidden_size), options_(options) {
  QKV_CHECK_ARG(input_size > 0 && hidden_size > 0, "[", op, "] input_size ", input_size,
                " and hidden_size ", hidden_size, " must be positive");
  QKV_CHECK_ARG(options.num_layers >= 1, "[", op, "] num_layers ", options.num_layers, " must be >= 1");
  const float k = 1.0f / std::sqrt(static_cast<float>(hidden_size));
  const int64_t gh = gates * hidden_size;
  layers_.resize(static_cast<size_t>(options.num_layers));
  for (int64_t l = 0; l < options.num_layers; ++l) {
    Layer& p = layers_[static_cast<size_t>(l)];
    const int64_t in = l == 0 ? input_size : hidden_size;
    const std::string s = std::to_string(l);
    // PyTorch's order: weight_ih, weight_hh, bias_ih, bias_hh per layer, all U(-k, k).
    p.w_ih = rng.uniform({gh, in}, -k, k);
    p.w_hh = rng.uniform({gh, hidden_size}, -k, k);
    register_parameter("weight_ih_l" + s, &p.w_ih);
    register_parameter("weight_hh_l" + s, &p.w_hh);
    if (options.bias) {
      p.b_ih = rng.uniform({gh}, -k, k);
      p.b_hh = rng.uniform({gh}, -k, k);
      register_parameter("bias_ih_l" + s, &p.b_ih);
      register_parameter("bias_hh_l" + s, &p.b_hh);
    }
  }
}

namespace {
void check_layer(const char* op, int64_t layer, int64_t n) {
  QKV_CHECK_ARG(layer >= 0 && layer < n, "[", op, "] layer ", layer, " out of range for ", n, " layers");
}
}  // namespace

const Tensor& RnnBase::weight_ih(int64_t layer) const {
  check_layer(op_, layer, num_layers());
  return layers_[static_cast<size_t>(layer)].w_ih;
}
const Tensor& RnnBase::weight_hh(int64_t layer) const {
  check_layer(op_, layer, num_layers());
  return layers_[static_cast<size_t>(layer)].w_hh;
}
const Tensor& RnnBase::bias_ih(int64_t layer) const {
  check_layer(op_, layer, num_layers());
  return layers_[static_cast<size_t>(layer)].b_ih;
}
const Tensor& RnnBase::bias_hh(int64_t layer) const {
  check_layer(op_, layer, num_layers());
  return layers_[static_cast<size_t>(layer)].b_hh;
}

std::pair<int64_t, int64_t> RnnBase::check_input(const Tensor& x, const std::vector<int64_t>& lengths) const {
  QKV_CHECK_ARG(x.defined(), "[", op_, "] input is undefined");
  QKV_CHECK_ARG(x.dim() == 3, "[", op_, "] input ", str(x.shape()), " must be ",
                options_.batch_first ? "(B, T, E)" : "(T, B, E)");
  QKV_CHECK_ARG(x.size(2) == input_size_, "[", op_, "] input ", str(x.shape()), " last dim must be input_size ",
                input_size_);
  const int64_t b = options_.batch_first ? x.size(0) : x.size(1);
  const int64_t t = options_.batch_first ? x.size(1) : x.size(0);
  QKV_CHECK_ARG(b > 0 && t > 0, "[", op_, "] input ", str(x.shape()), " has an empty batch or sequence");
  if (!lengths.empty()) {
    QKV_CHECK_ARG(static_cast<int64_t>(lengths.size()) == b, "[", op_, "] lengths has ", lengths.size(),
                  " entries but input ", str(x.shape()), " has batch ", b);
    for (int64_t len : lengths)
      QKV_CHECK_ARG(len >= 0 && len <= t, "[", op_, "] length ", len, " outside [0, ", t, "] for input ",
                    str(x.shape()));
  }
  return {b, t};
}

void RnnBase::check_state(const Tensor& s, const char* what, int64_t batch) const {
  if (!s.defined()) return;
  const Shape want{num_layers(), batch, hidden_size_};
  QKV_CHECK_ARG(s.shape() == want, "[", op_, "] ", what, " ", str(s.shape()), " must be (L, B, H) = ",
                str(want));
}

namespace detail {

void check_cell(const char* op, int64_t gates, const Tensor& gi, const Tensor& h, const Tensor& w_hh,
                const Tensor& b_hh) {
  QKV_CHECK_ARG(gi.defined() && h.defined() && w_hh.defined(), "[", op, "] gi, h and w_hh must be defined");
  QKV_CHECK_ARG(h.dim() == 2 && h.size(0) > 0 && h.size(1) > 0, "[", op, "] h ", str(h.shape()),
                " must be a non-empty (B, H)");
  const int64_t b = h.size(0), hs = h.size(1);
  QKV_CHECK_ARG(gi.dim() == 2 && gi.size(0) == b && gi.size(1) == gates * hs, "[", op, "] gi ",
                str(gi.shape()), " must be (B, ", gates, "H) for h ", str(h.shape()));
  QKV_CHECK_ARG(w_hh.dim() == 2 && w_hh.size(0) == gates * hs && w_hh.size(1) == hs, "[", op, "] w_hh ",
                str(w_hh.shape()), " must be (", gates, "H, H) for h ", str(h.shape()));
  QKV_CHECK_ARG(!b_hh.defined() || b_hh.shape() == Shape{gates * hs}, "[", op, "] b_hh ", str(b_hh.shape()),
                " must be (", gates, "H) for h ", str(h.shape()));
}

void check_cell_input(const char* op, int64_t gates, const Tensor& x, const Tensor& h, const Tensor& w_ih,
                      const Tensor& b_ih) {
  QKV_CHECK_ARG(x.defined() && h.defined() && w_ih.defined(), "[", op, "] x, h and w_ih must be defined");
  QKV_CHECK_ARG(x.dim() == 2 && h.dim() == 2 && x.size(0) == h.size(0), "[", op, "] x ", str(x.shape()),
                " and h ", str(h.shape()), " must be (B, E) and (B, H)");
  const int64_t hs = h.size(1);
  QKV_CHECK_ARG(w_ih.dim() == 2 && w_ih.size(0) == gates * hs && w_ih.size(1) == x.size(1), "[", op,
                "] w_ih ", str(w_ih.shape()), " must be (", gates, "H, E) for x ", str(x.shape()), " and h ",
                str(h.shape()));
  QKV_CHECK_ARG(!b_ih.defined() || b_ih.shape() == Shape{gates * hs}, "[", op, "] b_ih ", str(b_ih.shape()),
                " must be (", gates, "H) for h ", str(h.shape()));
}

void freeze_finished_rows(Tensor& next, const Tensor& prev, const std::vector<int64_t>& lengths, int64_t t) {
  if (lengths.empty()) return;
  QKV_ASSERT(next.is_contiguous() && prev.is_contiguous() && next.shape() == prev.shape());
  const int64_t hs = next.size(1);
  for (int64_t b = 0; b < next.size(0); ++b)
    if (!row_active(lengths, b, t)) std::memcpy(next.data() + b * hs, prev.data() + b * hs, sizeof(float) * hs);
}

void write_output_step(Tensor& out, bool batch_first, int64_t t, const Tensor& h,
                       const std::vector<int64_t>& lengths) {
  QKV_ASSERT(out.is_contiguous() && h.is_contiguous());
  const int64_t nb = h.size(0), hs = h.size(1);
  const int64_t nt = batch_first ? out.size(1) : out.size(0);
  for (int64_t b = 0; b < nb; ++b) {
    if (!row_active(lengths, b, t)) continue;
    const int64_t row = batch_first ? b * nt + t : t * nb + b;
    std::memcpy(out.data() + row * hs, h.data() + b * hs, sizeof(float) * hs);
  }
}

}  // namespace detail
}  // namespace qkv::nn
