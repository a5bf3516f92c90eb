// RnnBase: the parameter store (PyTorch names, packing and init), the input checks and the one forward of GRU
// and LSTM through time (and its single step), on a Context; plus the operand checks of the single-step cells.
#include <cmath>
#include <string>

#include "qkv/core/error.h"
#include "qkv/nn/init.h"
#include "qkv/nn/rnn.h"
#include "qkv/ops/functional.h"
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
    p.w_ih = init_uniform(rng, {gh, in}, -k, k);
    p.w_hh = init_uniform(rng, {gh, hidden_size}, -k, k);
    register_parameter("weight_ih_l" + s, &p.w_ih);
    register_parameter("weight_hh_l" + s, &p.w_hh);
    if (options.bias) {
      p.b_ih = init_uniform(rng, {gh}, -k, k);
      p.b_hh = init_uniform(rng, {gh}, -k, k);
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

RnnVars rnn_layers(int64_t gates, const std::vector<RnnLayerVars>& layers, const ad::Var& x, const ad::Var& h0,
                   const ad::Var& c0, const std::vector<int64_t>& lengths, bool batch_first) {
  const char* op = gates == 3 ? "GRU" : "LSTM";
  QKV_CHECK_ARG(gates == 3 || gates == 4, "[rnn_layers] gates must be 3 (GRU) or 4 (LSTM), got ", gates);
  QKV_CHECK_ARG(!layers.empty() && layers[0].w_hh.defined() && layers[0].w_hh.dim() == 2, "[", op,
                "] needs at least one layer with a (G·H, H) w_hh");
  QKV_CHECK_ARG(x.defined() && x.dim() == 3 && x.size(0) > 0 && x.size(1) > 0, "[", op, "] input ",
                x.defined() ? str(x.shape()) : std::string("(undefined)"), " must be a non-empty ",
                batch_first ? "(B, T, E)" : "(T, B, E)");
  const bool lstm = gates == 4;
  const int64_t time_axis = batch_first ? 1 : 0;
  const int64_t nb = x.size(1 - time_axis), nt = x.size(time_axis), nl = static_cast<int64_t>(layers.size());
  const int64_t hs = layers[0].w_hh.size(1);
  QKV_CHECK_ARG(lstm || !c0.defined(), "[", op, "] has no cell state c0");
  QKV_CHECK_ARG(!lstm || h0.defined() == c0.defined(), "[", op, "] h0 and c0 must both be given or both be omitted");
  for (const ad::Var* s : {&h0, &c0})
    QKV_CHECK_ARG(!s->defined() || s->shape() == Shape({nl, nb, hs}), "[", op, "] initial state ", str(s->shape()),
                  " must be (L, B, H) = ", str(Shape{nl, nb, hs}));
  QKV_CHECK_ARG(lengths.empty() || static_cast<int64_t>(lengths.size()) == nb, "[", op, "] lengths has ",
                lengths.size(), " entries but input ", str(x.shape()), " has batch ", nb);
  for (int64_t len : lengths)
    QKV_CHECK_ARG(len >= 0 && len <= nt, "[", op, "] length ", len, " outside [0, ", nt, "] for input ",
                  str(x.shape()));

  // Per-step row flags and the output keep-mask (B, T, 1) (or (T, B, 1)), only when some sequence is short.
  bool padded = false;
  for (int64_t len : lengths) padded = padded || len < nt;
  std::vector<std::vector<uint8_t>> active(padded ? static_cast<size_t>(nt) : 0);
  Tensor keep;
  if (padded) {
    keep = batch_first ? Tensor::zeros({nb, nt, 1}) : Tensor::zeros({nt, nb, 1});
    for (int64_t t = 0; t < nt; ++t) {
      active[static_cast<size_t>(t)].resize(static_cast<size_t>(nb));
      for (int64_t b = 0; b < nb; ++b) {
        const bool on = detail::row_active(lengths, b, t);
        active[static_cast<size_t>(t)][static_cast<size_t>(b)] = on;
        keep.data()[batch_first ? b * nt + t : t * nb + b] = on ? 1.0f : 0.0f;
      }
    }
  }
  static const std::vector<uint8_t> kAll;

  RnnVars res;
  std::vector<ad::Var> hn, cn;
  ad::Var in = x;
  for (int64_t l = 0; l < nl; ++l) {
    const RnnLayerVars& p = layers[static_cast<size_t>(l)];
    const ad::Var gi = ad::linear(in, p.w_ih, p.b_ih);  // (B, T, G·H): every step's input projection in one GEMM
    ad::Var h = h0.defined() ? ad::select(h0, 0, l) : ad::Var(Tensor::zeros({nb, hs}));
    ad::Var c = lstm ? (c0.defined() ? ad::select(c0, 0, l) : ad::Var(Tensor::zeros({nb, hs}))) : ad::Var();
    std::vector<ad::Var> outs;
    outs.reserve(static_cast<size_t>(nt));
    for (int64_t t = 0; t < nt; ++t) {
      const std::vector<uint8_t>& act = padded ? active[static_cast<size_t>(t)] : kAll;
      const ad::Var g = ad::select(gi, time_axis, t);
      if (lstm) {
        ad::LstmVars s = ad::lstm_cell_step(g, h, c, p.w_hh, p.b_hh, act);
        h = s.h;
        c = s.c;
      } else {
        h = ad::gru_cell_step(g, h, p.w_hh, p.b_hh, act);
      }
      outs.push_back(h);
    }
    ad::Var out = ad::stack(outs, time_axis);
    if (padded) out = ad::mul(out, ad::Var(keep));  // padded steps give 0 (their state stays frozen)
    hn.push_back(h);
    if (lstm) cn.push_back(c);
    in = out;
  }
  res.output = in;
  res.h_n = ad::stack(hn, 0);
  if (lstm) res.c_n = ad::stack(cn, 0);
  return res;
}

std::vector<RnnLayerVars> RnnBase::layer_vars(const Context& c) const {
  std::vector<RnnLayerVars> out;
  for (const Layer& p : layers_) out.push_back({c.param(p.w_ih), c.param(p.w_hh), c.param(p.b_ih), c.param(p.b_hh)});
  return out;
}

RnnVars RnnBase::forward_any(const Context& c, const ad::Var& x, const ad::Var& h0, const ad::Var& c0,
                             const std::vector<int64_t>& lengths) const {
  const auto [nb, nt] = check_input(x.value, lengths);
  (void)nt;
  QKV_CHECK_ARG(gates_ == 4 || !c0.defined(), "[", op_, "] has no cell state c0");
  QKV_CHECK_ARG(gates_ == 3 || h0.defined() == c0.defined(), "[", op_,
                "] h0 and c0 must both be given or both be omitted");
  check_state(h0.value, "h0", nb);
  check_state(c0.value, "c0", nb);
  return rnn_layers(gates_, layer_vars(c), x, h0, c0, lengths, options_.batch_first);
}

RnnVars RnnBase::step_any(const Context& c, const ad::Var& x, const ad::Var& h, const ad::Var& cell) const {
  QKV_CHECK_ARG(x.defined() && x.dim() == 2 && x.size(0) > 0 && x.size(1) == input_size_, "[", op_, "] step x ",
                x.defined() ? str(x.shape()) : std::string("(undefined)"),
                " must be a non-empty (B, E) with E = input_size ", input_size_);
  const int64_t nb = x.size(0);
  const bool lstm = gates_ == 4;
  QKV_CHECK_ARG(h.defined() && (cell.defined() == lstm), "[", op_, "] step needs h",
                lstm ? " and c" : " (and no c)");
  check_state(h.value, "h", nb);
  check_state(cell.value, "c", nb);
  std::vector<ad::Var> hn, cn;
  ad::Var in = x;
  for (int64_t l = 0; l < num_layers(); ++l) {
    const Layer& p = layers_[static_cast<size_t>(l)];
    const ad::Var gi = ad::linear(in, c.param(p.w_ih), c.param(p.b_ih));
    if (lstm) {
      ad::LstmVars s = ad::lstm_cell_step(gi, ad::select(h, 0, l), ad::select(cell, 0, l), c.param(p.w_hh),
                                     c.param(p.b_hh));
      hn.push_back(s.h);
      cn.push_back(s.c);
    } else {
      hn.push_back(ad::gru_cell_step(gi, ad::select(h, 0, l), c.param(p.w_hh), c.param(p.b_hh)));
    }
    in = hn.back();
  }
  RnnVars res;
  res.output = in;
  res.h_n = ad::stack(hn, 0);
  if (lstm) res.c_n = ad::stack(cn, 0);
  return res;
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

}  // namespace detail
}  // namespace qkv::nn
