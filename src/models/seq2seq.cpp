// Seq2Seq construction, encoder, one decoder step per attention variant, and the teacher-forced decoder
// (whole-sequence RNN calls where the variant allows it; Bahdanau steps because its input needs α_t).
#include "qkv/models/seq2seq.h"

#include <string>

#include "qkv/core/error.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/shape_ops.h"

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
Tensor top(const Tensor& h) { return h.select(0, h.size(0) - 1); }

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

nn::RnnOutput Seq2Seq::run_rnn(const nn::RnnBase& rnn, const Tensor& x, const Tensor& h0, const Tensor& c0,
                               const std::vector<int64_t>& lengths) const {
  if (config_.cell == RnnCell::kGRU) return static_cast<const nn::GRU&>(rnn).forward(x, h0, lengths);
  return static_cast<const nn::LSTM&>(rnn).forward(x, h0, c0, lengths);
}

Seq2SeqState Seq2Seq::step_rnn(const Tensor& x, const Seq2SeqState& s) const {
  if (config_.cell == RnnCell::kGRU) return {static_cast<const nn::GRU&>(*decoder_).step(x, s.h), {}};
  nn::LSTM::State n = static_cast<const nn::LSTM&>(*decoder_).step(x, s.h, s.c);
  return {n.h, n.c};
}

Seq2SeqEncoded Seq2Seq::encode(const Ids& src, const std::vector<int64_t>& src_lengths) const {
  check_ids(src, "src");
  const int64_t nb = src.shape[0], ts = src.shape[1];
  QKV_CHECK_ARG(src_lengths.empty() || static_cast<int64_t>(src_lengths.size()) == nb, "[Seq2Seq] src_lengths has ",
                src_lengths.size(), " entries for src ", str(src.shape));
  for (int64_t len : src_lengths)
    QKV_CHECK_ARG(len >= 0 && len <= ts, "[Seq2Seq] src length ", len, " outside [0, ", ts, "] for src ",
                  str(src.shape));
  nn::RnnOutput r = run_rnn(*encoder_, src_embed_.forward(src), {}, {}, src_lengths);
  Seq2SeqEncoded enc;
  enc.states = r.output;
  enc.h_n = r.h_n;
  enc.c_n = r.c_n;
  if (!src_lengths.empty()) enc.keep_mask = nn::lengths_to_keep_mask(src_lengths, ts);
  if (attention_) enc.prepared = attention_->prepare(enc.states);
  return enc;
}

Seq2SeqState Seq2Seq::initial_state(const Seq2SeqEncoded& enc) const {
  QKV_CHECK_ARG(enc.h_n.defined() && enc.h_n.dim() == 3 && enc.h_n.size(0) == config_.num_layers &&
                    enc.h_n.size(2) == config_.hidden_size,
                "[Seq2Seq] encoded h_n ", str(enc.h_n.shape()), " must be (L, B, H) from encode()");
  QKV_CHECK_ARG(config_.cell == RnnCell::kGRU || enc.c_n.shape() == enc.h_n.shape(), "[Seq2Seq] encoded c_n ",
                str(enc.c_n.shape()), " must match h_n ", str(enc.h_n.shape()), " for an LSTM");
  return {enc.h_n, config_.cell == RnnCell::kLSTM ? enc.c_n : Tensor()};
}

Seq2SeqStep Seq2Seq::decode_step(const Seq2SeqEncoded& enc, const Seq2SeqState& state,
                                 const std::vector<int64_t>& prev_tokens) const {
  QKV_CHECK_ARG(state.h.defined() && state.h.dim() == 3 && state.h.size(1) == static_cast<int64_t>(prev_tokens.size()),
                "[Seq2Seq] decoder state h ", str(state.h.shape()), " and ", prev_tokens.size(),
                " prev_tokens must agree on B");
  QKV_CHECK_ARG(enc.states.defined() && enc.states.size(0) == state.h.size(1), "[Seq2Seq] encoded states ",
                str(enc.states.shape()), " and decoder state ", str(state.h.shape()), " must agree on B");
  const int64_t nb = state.h.size(1);
  const Tensor emb = tgt_embed_.forward(Ids{prev_tokens, {nb}});  // (B, E)
  Seq2SeqStep out;
  switch (config_.attention) {
    case Seq2SeqAttention::kNone: {
      const Tensor x = config_.feed_context ? concat({emb, top(enc.h_n)}, -1) : emb;
      out.state = step_rnn(x, state);
      out.logits = out_->forward(top(out.state.h));
      break;
    }
    case Seq2SeqAttention::kBahdanau: {
      const nn::AlignmentResult a = attention_->forward(top(state.h), enc.states, enc.prepared, enc.keep_mask);
      out.state = step_rnn(concat({emb, a.context}, -1), state);
      out.logits = out_->forward(concat({top(out.state.h), a.context}, -1));
      out.weights = a.weights;
      break;
    }
    case Seq2SeqAttention::kLuongDot:
    case Seq2SeqAttention::kLuongGeneral: {
      out.state = step_rnn(emb, state);
      const Tensor s = top(out.state.h);
      const nn::AlignmentResult a = attention_->forward(s, enc.states, enc.prepared, enc.keep_mask);
      out.logits = out_->forward(qkv::tanh(attn_combine_->forward(concat({a.context, s}, -1))));
      out.weights = a.weights;
      break;
    }
  }
  return out;
}

Seq2SeqOutput Seq2Seq::decode(const Seq2SeqEncoded& enc, const Ids& tgt_in) const {
  check_ids(tgt_in, "tgt_in");
  const Seq2SeqState s0 = initial_state(enc);
  const int64_t nb = tgt_in.shape[0], tt = tgt_in.shape[1];
  QKV_CHECK_ARG(nb == enc.h_n.size(1), "[Seq2Seq] tgt_in ", str(tgt_in.shape), " and encoded h_n ",
                str(enc.h_n.shape()), " must agree on B");
  Seq2SeqOutput out;
  if (config_.attention == Seq2SeqAttention::kBahdanau) {  // the input at t needs α_t: step by step
    std::vector<Tensor> logits, weights;
    Seq2SeqState s = s0;
    for (int64_t t = 0; t < tt; ++t) {
      Seq2SeqStep st = decode_step(enc, s, column(tgt_in, t));
      logits.push_back(st.logits);
      weights.push_back(st.weights);
      s = st.state;
    }
    out.logits = stack(logits, 1);
    out.alignments = stack(weights, 1);
    return out;
  }
  // kNone and Luong: the RNN input does not depend on attention, so one whole-sequence call.
  Tensor x = tgt_embed_.forward(tgt_in);  // (B, Tt, E)
  if (config_.attention == Seq2SeqAttention::kNone && config_.feed_context) {
    const Tensor c = top(enc.h_n).unsqueeze(1).expand({nb, tt, config_.hidden_size});
    x = concat({x, c}, -1);
  }
  const Tensor dec = run_rnn(*decoder_, x, s0.h, s0.c, {}).output;  // (B, Tt, H)
  if (config_.attention == Seq2SeqAttention::kNone) {
    out.logits = out_->forward(dec);
    return out;
  }
  const nn::AlignmentResult a = attention_->forward(dec, enc.states, enc.prepared, enc.keep_mask);
  out.logits = out_->forward(qkv::tanh(attn_combine_->forward(concat({a.context, dec}, -1))));
  out.alignments = a.weights;  // (B, Tt, Ts)
  return out;
}

Seq2SeqOutput Seq2Seq::forward(const Ids& src, const std::vector<int64_t>& src_lengths, const Ids& tgt_in) const {
  check_ids(tgt_in, "tgt_in");
  QKV_CHECK_ARG(src.shape.size() == 2 && src.shape[0] == tgt_in.shape[0], "[Seq2Seq] src ", str(src.shape),
                " and tgt_in ", str(tgt_in.shape), " must agree on B");
  return decode(encode(src, src_lengths), tgt_in);
}

}  // namespace qkv::models
