// Seq2Seq construction, encoder, one decoder step per attention variant, and the teacher-forced decoder
// (whole-sequence RNN calls where the variant allows it; Bahdanau steps because its input needs α_t), each once on
// a Context: training records them on the tape, the Tensor calls run them with an inference Context.
#include "qkv/models/seq2seq.h"

#include <string>

#include "qkv/core/error.h"
#include "qkv/ops/functional.h"

namespace qkv::models {
namespace {

const Seq2SeqConfig& checked(const Seq2SeqConfig& c) {
  QKV_CHECK_ARG(c.src_vocab > 0 && c.tgt_vocab > 0 && c.embed_dim > 0 && c.hidden_size > 0 && c.num_layers >= 1,
                "[Seq2Seq] config needs positive src_vocab (", c.src_vocab, "), tgt_vocab (", c.tgt_vocab,
                "), embed_dim (", c.embed_dim, "), hidden_size (", c.hidden_size, ") and num_layers >= 1 (",
                c.num_layers, ")");
  QKV_CHECK_ARG(c.attention_size >= 0, "[Seq2Seq] attention_size ", c.attention_size, " must be >= 0");
  return c;
}

bool is_luong(Seq2SeqAttention a) {
  return a == Seq2SeqAttention::kLuongDot || a == Seq2SeqAttention::kLuongGeneral;
}

std::unique_ptr<nn::RnnBase> make_rnn(RnnCell cell, int64_t in, int64_t hidden, int64_t layers, Rng& rng) {
  nn::RnnOptions o;
  o.num_layers = layers;
  o.batch_first = true;
  if (cell == RnnCell::kGRU) return std::make_unique<nn::GRU>(in, hidden, rng, o);
  return std::make_unique<nn::LSTM>(in, hidden, rng, o);
}

// Column t of (B, T) ids.
std::vector<int64_t> column(const Ids& ids, int64_t t) {
  const int64_t nb = ids.shape[0], nt = ids.shape[1];
  std::vector<int64_t> col(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) col[static_cast<size_t>(b)] = ids.data[static_cast<size_t>(b * nt + t)];
  return col;
}

// The decoder's top layer: state (L, B, H) -> (B, H).
ad::Var top(const ad::Var& h) { return ad::select(h, 0, h.size(0) - 1); }

Seq2SeqEncodedVars constants(const Seq2SeqEncoded& e) { return {e.states, e.h_n, e.c_n, e.keep_mask, e.prepared}; }
Seq2SeqEncoded values(const Seq2SeqEncodedVars& e) {
  return {e.states.value, e.h_n.value, e.c_n.value, e.keep_mask, e.prepared.value};
}

}  // namespace

Seq2Seq::Seq2Seq(const Seq2SeqConfig& config, Rng& rng)
    : config_(checked(config)),
      src_embed_(config.src_vocab, config.embed_dim, rng),
      tgt_embed_(config.tgt_vocab, config.embed_dim, rng) {
  const int64_t e = config.embed_dim, h = config.hidden_size;
  register_module("src_embed", &src_embed_);
  register_module("tgt_embed", &tgt_embed_);
  encoder_ = make_rnn(config.cell, e, h, config.num_layers, rng);
  register_module("encoder", encoder_.get());

  int64_t dec_in = e, out_in = h;
  switch (config.attention) {
    case Seq2SeqAttention::kNone:
      dec_in = config.feed_context ? e + h : e;
      break;
    case Seq2SeqAttention::kBahdanau:
      dec_in = e + h;
      out_in = 2 * h;
      break;
    case Seq2SeqAttention::kLuongDot:
    case Seq2SeqAttention::kLuongGeneral:
      break;
  }
  decoder_ = make_rnn(config.cell, dec_in, h, config.num_layers, rng);
  register_module("decoder", decoder_.get());

  if (config.attention == Seq2SeqAttention::kBahdanau) {
    attention_ = std::make_unique<nn::BahdanauAttention>(h, h, config.attention_size > 0 ? config.attention_size : h,
                                                         rng);
  } else if (is_luong(config.attention)) {
    attention_ = std::make_unique<nn::LuongAttention>(
        config.attention == Seq2SeqAttention::kLuongDot ? nn::LuongScore::kDot : nn::LuongScore::kGeneral, h, h,
        rng);
    attn_combine_ = std::make_unique<nn::Linear>(2 * h, h, false, rng);
  }
  if (attention_) register_module("attention", attention_.get());
  if (attn_combine_) register_module("attn_combine", attn_combine_.get());
  out_ = std::make_unique<nn::Linear>(out_in, config.tgt_vocab, true, rng);
  register_module("out", out_.get());
}

Seq2Seq::~Seq2Seq() = default;

void Seq2Seq::check_ids(const Ids& ids, const char* what) const {
  QKV_CHECK_ARG(ids.shape.size() == 2 && ids.shape[0] > 0 && ids.shape[1] > 0, "[Seq2Seq] ", what, " ids ",
                str(ids.shape), " must be a non-empty (B, T)");
  QKV_CHECK_ARG(static_cast<int64_t>(ids.data.size()) == ids.shape[0] * ids.shape[1], "[Seq2Seq] ", what,
                " ids hold ", ids.data.size(), " values for shape ", str(ids.shape));
}

Seq2SeqStateVars Seq2Seq::step_rnn(const nn::Context& c, const ad::Var& x, const Seq2SeqStateVars& s) const {
  const nn::RnnVars r = decoder_->step_any(c, x, s.h, config_.cell == RnnCell::kLSTM ? s.c : ad::Var());
  return {r.h_n, r.c_n};
}

Seq2SeqEncodedVars Seq2Seq::encode(const nn::Context& c, const Ids& src,
                                   const std::vector<int64_t>& src_lengths) const {
  check_ids(src, "src");
  const int64_t nb = src.shape[0], ts = src.shape[1];
  QKV_CHECK_ARG(src_lengths.empty() || static_cast<int64_t>(src_lengths.size()) == nb, "[Seq2Seq] src_lengths has ",
                src_lengths.size(), " entries for src ", str(src.shape));
  for (int64_t len : src_lengths)
    QKV_CHECK_ARG(len >= 0 && len <= ts, "[Seq2Seq] src length ", len, " outside [0, ", ts, "] for src ",
                  str(src.shape));
  const nn::RnnVars r = encoder_->forward_any(c, src_embed_.forward(c, src), {}, {}, src_lengths);
  Seq2SeqEncodedVars enc;
  enc.states = r.output;
  enc.h_n = r.h_n;
  enc.c_n = r.c_n;
  if (!src_lengths.empty()) enc.keep_mask = nn::lengths_to_keep_mask(src_lengths, ts);
  if (attention_) enc.prepared = attention_->prepare(c, enc.states);
  return enc;
}

Seq2SeqStateVars Seq2Seq::initial_state(const Seq2SeqEncodedVars& enc) const {
  QKV_CHECK_ARG(enc.h_n.defined() && enc.h_n.dim() == 3 && enc.h_n.size(0) == config_.num_layers &&
                    enc.h_n.size(2) == config_.hidden_size,
                "[Seq2Seq] encoded h_n ", str(enc.h_n.shape()), " must be (L, B, H) from encode()");
  QKV_CHECK_ARG(config_.cell == RnnCell::kGRU || enc.c_n.shape() == enc.h_n.shape(), "[Seq2Seq] encoded c_n ",
                str(enc.c_n.shape()), " must match h_n ", str(enc.h_n.shape()), " for an LSTM");
  return {enc.h_n, config_.cell == RnnCell::kLSTM ? enc.c_n : ad::Var()};
}

Seq2SeqStepVars Seq2Seq::decode_step(const nn::Context& c, const Seq2SeqEncodedVars& enc,
                                     const Seq2SeqStateVars& state, const std::vector<int64_t>& prev_tokens) const {
  QKV_CHECK_ARG(state.h.defined() && state.h.dim() == 3 && state.h.size(1) == static_cast<int64_t>(prev_tokens.size()),
                "[Seq2Seq] decoder state h ", str(state.h.shape()), " and ", prev_tokens.size(),
                " prev_tokens must agree on B");
  QKV_CHECK_ARG(enc.states.defined() && enc.states.size(0) == state.h.size(1), "[Seq2Seq] encoded states ",
                str(enc.states.shape()), " and decoder state ", str(state.h.shape()), " must agree on B");
  const int64_t nb = state.h.size(1);
  const ad::Var emb = tgt_embed_.forward(c, Ids{prev_tokens, {nb}});  // (B, E)
  Seq2SeqStepVars out;
  switch (config_.attention) {
    case Seq2SeqAttention::kNone: {
      const ad::Var x = config_.feed_context ? ad::concat({emb, top(enc.h_n)}, -1) : emb;
      out.state = step_rnn(c, x, state);
      out.logits = out_->forward(c, top(out.state.h));
      break;
    }
    case Seq2SeqAttention::kBahdanau: {
      const nn::AlignmentVars a = attention_->forward(c, top(state.h), enc.states, enc.prepared, enc.keep_mask);
      out.state = step_rnn(c, ad::concat({emb, a.context}, -1), state);
      out.logits = out_->forward(c, ad::concat({top(out.state.h), a.context}, -1));
      out.weights = a.weights;
      break;
    }
    case Seq2SeqAttention::kLuongDot:
    case Seq2SeqAttention::kLuongGeneral: {
      out.state = step_rnn(c, emb, state);
      const ad::Var s = top(out.state.h);
      const nn::AlignmentVars a = attention_->forward(c, s, enc.states, enc.prepared, enc.keep_mask);
      out.logits = out_->forward(c, ad::tanh(attn_combine_->forward(c, ad::concat({a.context, s}, -1))));
      out.weights = a.weights;
      break;
    }
  }
  return out;
}

Seq2SeqOutputVars Seq2Seq::decode(const nn::Context& c, const Seq2SeqEncodedVars& enc, const Ids& tgt_in) const {
  check_ids(tgt_in, "tgt_in");
  const Seq2SeqStateVars s0 = initial_state(enc);
  const int64_t nb = tgt_in.shape[0], tt = tgt_in.shape[1];
  QKV_CHECK_ARG(nb == enc.h_n.size(1), "[Seq2Seq] tgt_in ", str(tgt_in.shape), " and encoded h_n ",
                str(enc.h_n.shape()), " must agree on B");
  Seq2SeqOutputVars out;
  if (config_.attention == Seq2SeqAttention::kBahdanau) {  // the input at t needs α_t: step by step
    std::vector<ad::Var> logits, weights;
    Seq2SeqStateVars s = s0;
    for (int64_t t = 0; t < tt; ++t) {
      Seq2SeqStepVars st = decode_step(c, enc, s, column(tgt_in, t));
      logits.push_back(st.logits);
      weights.push_back(st.weights);
      s = st.state;
    }
    out.logits = ad::stack(logits, 1);
    out.alignments = ad::stack(weights, 1);
    return out;
  }
  // kNone and Luong: the RNN input does not depend on attention, so one whole-sequence call.
  ad::Var x = tgt_embed_.forward(c, tgt_in);  // (B, Tt, E)
  if (config_.attention == Seq2SeqAttention::kNone && config_.feed_context)
    x = ad::concat({x, ad::expand(ad::unsqueeze(top(enc.h_n), 1), {nb, tt, config_.hidden_size})}, -1);
  const ad::Var dec = decoder_->forward_any(c, x, s0.h, s0.c).output;  // (B, Tt, H)
  if (config_.attention == Seq2SeqAttention::kNone) {
    out.logits = out_->forward(c, dec);
    return out;
  }
  const nn::AlignmentVars a = attention_->forward(c, dec, enc.states, enc.prepared, enc.keep_mask);
  out.logits = out_->forward(c, ad::tanh(attn_combine_->forward(c, ad::concat({a.context, dec}, -1))));
  out.alignments = a.weights;  // (B, Tt, Ts)
  return out;
}

Seq2SeqOutputVars Seq2Seq::forward(const nn::Context& c, const Ids& src, const std::vector<int64_t>& src_lengths,
                                   const Ids& tgt_in) const {
  check_ids(tgt_in, "tgt_in");
  QKV_CHECK_ARG(src.shape.size() == 2 && src.shape[0] == tgt_in.shape[0], "[Seq2Seq] src ", str(src.shape),
                " and tgt_in ", str(tgt_in.shape), " must agree on B");
  return decode(c, encode(c, src, src_lengths), tgt_in);
}

// --- the Tensor calls: the forwards above with an inference Context -------------------------------------------

Seq2SeqEncoded Seq2Seq::encode(const Ids& src, const std::vector<int64_t>& src_lengths) const {
  return values(encode(nn::Context(), src, src_lengths));
}

Seq2SeqState Seq2Seq::initial_state(const Seq2SeqEncoded& enc) const {
  const Seq2SeqStateVars s = initial_state(constants(enc));
  return {s.h.value, s.c.value};
}

Seq2SeqStep Seq2Seq::decode_step(const Seq2SeqEncoded& enc, const Seq2SeqState& state,
                                 const std::vector<int64_t>& prev_tokens) const {
  const Seq2SeqStepVars st = decode_step(nn::Context(), constants(enc), {state.h, state.c}, prev_tokens);
  return {st.logits.value, st.weights.value, {st.state.h.value, st.state.c.value}};
}

Seq2SeqOutput Seq2Seq::decode(const Seq2SeqEncoded& enc, const Ids& tgt_in) const {
  const Seq2SeqOutputVars o = decode(nn::Context(), constants(enc), tgt_in);
  return {o.logits.value, o.alignments.value};
}

Seq2SeqOutput Seq2Seq::forward(const Ids& src, const std::vector<int64_t>& src_lengths, const Ids& tgt_in) const {
  const Seq2SeqOutputVars o = forward(nn::Context(), src, src_lengths, tgt_in);
  return {o.logits.value, o.alignments.value};
}

}  // namespace qkv::models
