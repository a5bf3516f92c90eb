// The RNN Seq2Seq as a tape forward: src/models/seq2seq.cpp restated on Vars (whole-sequence RNN calls for none
// and Luong, Bahdanau step by step because its input needs α_t).
#include "qkv/train/seq2seq_model.h"

#include <limits>
#include <map>
#include <string>

#include "../ops/functional_internal.h"
#include "qkv/core/error.h"
#include "qkv/nn/additive_attention.h"

namespace qkv::train {
using ad::Parameter;
using ad::ParameterSet;
using ad::Tape;
using ad::Var;

using ad::detail::check_ids;

Var seq2seq_rnn_logits(Graph& g, models::Seq2Seq& m, const Ids& src, const std::vector<int64_t>& src_lengths,
                       const Ids& tgt_in) {
  check_ids(src, "Seq2Seq", "src");
  check_ids(tgt_in, "Seq2Seq", "tgt_in");
  const models::Seq2SeqConfig& cfg = m.config();
  const int64_t B = src.shape[0], Ts = src.shape[1], Tt = tgt_in.shape[1], L = cfg.num_layers;
  QKV_CHECK_ARG(tgt_in.shape[0] == B, "[Seq2Seq] src ", str(src.shape), " and tgt_in ", str(tgt_in.shape),
                " must agree on B");
  QKV_CHECK_ARG(src_lengths.empty() || static_cast<int64_t>(src_lengths.size()) == B, "[Seq2Seq] src_lengths has ",
                src_lengths.size(), " entries for src ", str(src.shape));

  std::map<std::string, Tensor*> named;
  for (auto& [name, t] : m.named_parameters()) named[name] = t;
  auto P = [&](const std::string& name) {
    auto it = named.find(name);
    return it == named.end() ? Var() : g.param(*it->second);
  };
  auto layers = [&](const std::string& prefix) {
    std::vector<RnnLayerVars> out;
    for (int64_t l = 0; l < L; ++l) {
      const std::string k = std::to_string(l);
      out.push_back({P(prefix + ".weight_ih_l" + k), P(prefix + ".weight_hh_l" + k), P(prefix + ".bias_ih_l" + k),
                     P(prefix + ".bias_hh_l" + k)});
    }
    return out;
  };
  const int64_t G = cfg.cell == models::RnnCell::kGRU ? 3 : 4;
  const std::vector<RnnLayerVars> dec_layers = layers("decoder");

  // --- encoder ------------------------------------------------------------------------------------------------
  const RnnVars enc = g.rnn_layers(G, layers("encoder"), embedding(P("src_embed.weight"), src), Var(), Var(),
                                   src_lengths);
  const Var states = enc.output;  // (B, Ts, H)
  Tensor score_mask;              // (B, Ts) additive: 0 kept, -inf padding
  if (!src_lengths.empty()) {
    const Tensor keep = nn::lengths_to_keep_mask(src_lengths, Ts);
    score_mask = Tensor::empty({B, Ts});
    for (int64_t i = 0; i < B * Ts; ++i)
      score_mask.data()[i] = keep.data()[i] != 0.0f ? 0.0f : -std::numeric_limits<float>::infinity();
  }
  const Var emb = embedding(P("tgt_embed.weight"), tgt_in);  // (B, Tt, E)
  const Var out_w = P("out.weight"), out_b = P("out.bias");
  const int64_t H = cfg.hidden_size;

  switch (cfg.attention) {
    case models::Seq2SeqAttention::kNone: {
      Var x = emb;
      if (cfg.feed_context) {
        const Var c = expand(unsqueeze(select(enc.h_n, 0, L - 1), 1), {B, Tt, H});
        x = ad::concat({x, c}, -1);
      }
      const RnnVars dec = g.rnn_layers(G, dec_layers, x, enc.h_n, enc.c_n, {});
      return linear(dec.output, out_w, out_b);
    }
    case models::Seq2SeqAttention::kLuongDot:
    case models::Seq2SeqAttention::kLuongGeneral: {
      const RnnVars dec = g.rnn_layers(G, dec_layers, emb, enc.h_n, enc.c_n, {});
      const Var prepared =
          cfg.attention == models::Seq2SeqAttention::kLuongDot ? states : linear(states, P("attention.W.weight"));
      Var scores = matmul(dec.output, transpose(prepared, 1, 2));  // (B, Tt, Ts)
      if (score_mask.defined()) scores = add(scores, Var(score_mask.unsqueeze(1)));
      const Var ctx = matmul(softmax(scores, -1), states);  // (B, Tt, H)
      const Var combined = tanh(linear(ad::concat({ctx, dec.output}, -1), P("attn_combine.weight")));
      return linear(combined, out_w, out_b);
    }
    case models::Seq2SeqAttention::kBahdanau: {
      const Var W = P("attention.W.weight"), v = P("attention.v.weight");
      const Var prepared = linear(states, P("attention.U.weight"));  // (B, Ts, A)
      std::vector<Var> h(static_cast<size_t>(L)), c(static_cast<size_t>(L));
      for (int64_t l = 0; l < L; ++l) {
        h[static_cast<size_t>(l)] = select(enc.h_n, 0, l);
        if (G == 4) c[static_cast<size_t>(l)] = select(enc.c_n, 0, l);
      }
      std::vector<Var> logits;
      logits.reserve(static_cast<size_t>(Tt));
      for (int64_t t = 0; t < Tt; ++t) {
        // α_t = softmax(vᵀ tanh(W s_{t-1} + U h_i)), c_t = Σ α h_i
        const Var e = tanh(add(unsqueeze(linear(h.back(), W), 1), prepared));  // (B, Ts, A)
        Var sc = squeeze(linear(e, v), 2);                                      // (B, Ts)
        if (score_mask.defined()) sc = add(sc, Var(score_mask));
        const Var ctx = squeeze(matmul(unsqueeze(softmax(sc, -1), 1), states), 1);  // (B, H)
        Var in = ad::concat({select(emb, 1, t), ctx}, -1);
        for (int64_t l = 0; l < L; ++l) {
          const RnnLayerVars& p = dec_layers[static_cast<size_t>(l)];
          const Var gi = linear(in, p.w_ih, p.b_ih);
          const size_t li = static_cast<size_t>(l);
          if (G == 3) {
            h[li] = gru_cell(gi, h[li], p.w_hh, p.b_hh);
          } else {
            ad::LstmVars s = lstm_cell(gi, h[li], c[li], p.w_hh, p.b_hh);
            h[li] = s.h;
            c[li] = s.c;
          }
          in = h[li];
        }
        logits.push_back(linear(ad::concat({h.back(), ctx}, -1), out_w, out_b));
      }
      return stack(logits, 1);
    }
  }
  QKV_CHECK_ARG(false, "[Seq2Seq] unknown attention variant");
  return Var();
}

}  // namespace qkv::train
