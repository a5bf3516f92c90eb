// The model of a `qkv train` run: the run config's kind and sizes as a TextModelConfig.
#include <memory>

#include "qkv/train/run_model.h"

namespace qkv::train {
namespace {

nn::TransformerLayerConfig layer_config(const RunConfig& c, nn::Activation act) {
  nn::TransformerLayerConfig l{};
  l.d_model = c.d_model;
  l.nhead = c.heads;
  l.dim_feedforward = c.ffn;
  l.dropout = static_cast<float>(c.dropout);
  l.activation = act;
  l.norm_first = !c.post_ln;
  return l;
}

}  // namespace

TextModelConfig text_model_config(const RunConfig& c, int64_t vocab) {
  TextModelConfig t;
  if (c.model == "rnn" || c.model == "rnn-attn") {
    // rnn: GRU/LSTM without attention; rnn-attn: Bahdanau or Luong.
    t.kind = TextModelKind::kRnnSeq2Seq;
    models::Seq2SeqConfig& m = t.rnn;
    m.src_vocab = vocab;
    m.tgt_vocab = vocab;
    m.embed_dim = c.d_model;
    m.hidden_size = c.hidden;
    m.num_layers = c.layers;
    m.cell = c.cell == "lstm" ? models::RnnCell::kLSTM : models::RnnCell::kGRU;
    m.attention = models::Seq2SeqAttention::kNone;
    if (c.model == "rnn-attn") {
      m.attention = c.attention == "luong-dot"       ? models::Seq2SeqAttention::kLuongDot
                    : c.attention == "luong-general" ? models::Seq2SeqAttention::kLuongGeneral
                                                     : models::Seq2SeqAttention::kBahdanau;
    }
    t.reverse_source = c.reverse_source;
  } else if (c.model == "decoder") {
    // GPT-style LM over source + BOS + target.
    t.kind = TextModelKind::kDecoderOnly;
    models::DecoderOnlyConfig& m = t.decoder_only;
    m.vocab = vocab;
    m.max_len = c.max_positions;
    m.num_layers = c.layers;
    m.layer = layer_config(c, nn::Activation::kGelu);
  } else if (c.model == "llama") {
    // The Llama decoder (RMSNorm, RoPE, SwiGLU, no dropout) over the same sequences.
    t.kind = TextModelKind::kLlama;
    models::LlamaConfig& m = t.llama;
    m.vocab_size = vocab;
    m.hidden_size = c.d_model;
    m.intermediate_size = c.ffn;
    m.num_hidden_layers = c.layers;
    m.num_attention_heads = c.heads;
    m.num_key_value_heads = c.heads;
    m.head_dim = c.d_model / c.heads;
    m.layer_sliding.assign(static_cast<size_t>(c.layers), false);
  } else {
    t.kind = TextModelKind::kTransformerSeq2Seq;
    models::TransformerSeq2SeqConfig& m = t.transformer;
    m.src_vocab = vocab;
    m.tgt_vocab = vocab;
    m.transformer.layer = layer_config(c, nn::Activation::kRelu);
    m.transformer.num_encoder_layers = c.layers;
    m.transformer.num_decoder_layers = c.layers;
    m.scale_embeddings = c.scale_embeddings;
  }
  return t;
}

std::unique_ptr<TextModel> make_run_model(const RunConfig& c, int64_t vocab, Rng& rng) {
  return make_text_model(text_model_config(c, vocab), rng);
}

}  // namespace qkv::train
