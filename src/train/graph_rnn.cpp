// Graph's recurrent layers: GRU / LSTM through time as nn::GRU / nn::LSTM do it (one input-projection GEMM per
// layer, one fused cell node per step, padded steps frozen and zeroed in the output).
#include <string>

#include "qkv/core/error.h"
#include "qkv/train/graph.h"

namespace qkv::train {
using ad::Parameter;
using ad::ParameterSet;
using ad::Tape;
using ad::Var;


RnnVars Graph::rnn_layers(int64_t gates, const std::vector<RnnLayerVars>& layers, const Var& x, const Var& h0,
                          const Var& c0, const std::vector<int64_t>& lengths) {
  const char* op = gates == 3 ? "GRU" : "LSTM";
  QKV_CHECK_ARG(gates == 3 || gates == 4, "[rnn_layers] gates must be 3 (GRU) or 4 (LSTM), got ", gates);
  QKV_CHECK_ARG(!layers.empty(), "[", op, "] needs at least one layer");
  QKV_CHECK_ARG(x.defined() && x.dim() == 3 && x.size(0) > 0 && x.size(1) > 0, "[", op, "] input ",
                x.defined() ? str(x.shape()) : std::string("(undefined)"), " must be a non-empty (B, T, E)");
  const int64_t nb = x.size(0), nt = x.size(1), nl = static_cast<int64_t>(layers.size());
  const int64_t hs = layers[0].w_hh.size(1);
  for (const Var* s : {&h0, &c0})
    QKV_CHECK_ARG(!s->defined() || s->shape() == Shape({nl, nb, hs}), "[", op, "] initial state ", str(s->shape()),
                  " must be (L, B, H) = ", str(Shape{nl, nb, hs}));
  QKV_CHECK_ARG(lengths.empty() || static_cast<int64_t>(lengths.size()) == nb, "[", op, "] lengths has ",
                lengths.size(), " entries but input ", str(x.shape()), " has batch ", nb);
  for (int64_t len : lengths)
    QKV_CHECK_ARG(len >= 0 && len <= nt, "[", op, "] length ", len, " outside [0, ", nt, "] for input ",
                  str(x.shape()));

  // Per-step row flags and the output keep-mask (B, T, 1) when lengths are given.
  std::vector<std::vector<uint8_t>> active(lengths.empty() ? 0 : static_cast<size_t>(nt));
  Tensor keep;
  if (!lengths.empty()) {
    keep = Tensor::zeros({nb, nt, 1});
    for (int64_t t = 0; t < nt; ++t) {
      active[static_cast<size_t>(t)].resize(static_cast<size_t>(nb));
      for (int64_t b = 0; b < nb; ++b) {
        const bool on = t < lengths[static_cast<size_t>(b)];
        active[static_cast<size_t>(t)][static_cast<size_t>(b)] = on;
        keep.data()[b * nt + t] = on ? 1.0f : 0.0f;
      }
    }
  }
  static const std::vector<uint8_t> kAll;

  RnnVars res;
  std::vector<Var> hn, cn;
  Var in = x;
  for (int64_t l = 0; l < nl; ++l) {
    const RnnLayerVars& p = layers[static_cast<size_t>(l)];
    const Var gi = ad::linear(in, p.w_ih, p.b_ih);  // (B, T, G·H): every step's input projection in one GEMM
    Var h = h0.defined() ? select(h0, 0, l) : Var(Tensor::zeros({nb, hs}));
    Var c = gates == 4 ? (c0.defined() ? select(c0, 0, l) : Var(Tensor::zeros({nb, hs}))) : Var();
    std::vector<Var> outs;
    outs.reserve(static_cast<size_t>(nt));
    for (int64_t t = 0; t < nt; ++t) {
      const std::vector<uint8_t>& act = lengths.empty() ? kAll : active[static_cast<size_t>(t)];
      const Var g = select(gi, 1, t);
      if (gates == 3) {
        h = gru_cell(g, h, p.w_hh, p.b_hh, act);
      } else {
        ad::LstmVars s = lstm_cell(g, h, c, p.w_hh, p.b_hh, act);
        h = s.h;
        c = s.c;
      }
      outs.push_back(h);
    }
    Var out = stack(outs, 1);  // (B, T, H)
    if (keep.defined()) out = mul(out, Var(keep));
    hn.push_back(h);
    if (gates == 4) cn.push_back(c);
    in = out;
  }
  res.output = in;
  res.h_n = stack(hn, 0);
  if (gates == 4) res.c_n = stack(cn, 0);
  return res;
}

namespace {

std::vector<RnnLayerVars> layer_vars(const Graph& g, const nn::RnnBase& m) {
  std::vector<RnnLayerVars> out;
  for (int64_t l = 0; l < m.num_layers(); ++l)
    out.push_back({g.param(m.weight_ih(l)), g.param(m.weight_hh(l)), g.param(m.bias_ih(l)), g.param(m.bias_hh(l))});
  return out;
}

void check_rnn_input(const nn::RnnBase& m, const Var& x, const char* op) {
  QKV_CHECK_ARG(x.defined() && x.dim() == 3 && x.size(2) == m.input_size(), "[", op, "] input ",
                x.defined() ? str(x.shape()) : std::string("(undefined)"), " must be ",
                m.options().batch_first ? "(B, T, E)" : "(T, B, E)", " with E = input_size ", m.input_size());
}

}  // namespace

RnnVars Graph::gru(const nn::GRU& m, const Var& x, const Var& h0, const std::vector<int64_t>& lengths) {
  check_rnn_input(m, x, "GRU");
  const bool bf = m.options().batch_first;
  RnnVars r = rnn_layers(3, layer_vars(*this, m), bf ? x : transpose(x, 0, 1), h0, Var(), lengths);
  if (!bf) r.output = transpose(r.output, 0, 1);
  return r;
}

RnnVars Graph::lstm(const nn::LSTM& m, const Var& x, const Var& h0, const Var& c0,
                    const std::vector<int64_t>& lengths) {
  check_rnn_input(m, x, "LSTM");
  QKV_CHECK_ARG(h0.defined() == c0.defined(), "[LSTM] h0 and c0 must both be given or both be omitted");
  const bool bf = m.options().batch_first;
  RnnVars r = rnn_layers(4, layer_vars(*this, m), bf ? x : transpose(x, 0, 1), h0, c0, lengths);
  if (!bf) r.output = transpose(r.output, 0, 1);
  return r;
}

}  // namespace qkv::train
