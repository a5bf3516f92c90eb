// Transformer step models: cached incremental decoding (self-attention K/V appended per step, cross-attention
// K/V projected once per source), for Seq2SeqTransformer and DecoderOnly.
#include "qkv/decode/transformer_step.h"

#include <algorithm>
#include <cmath>

#include "qkv/core/error.h"
#include "qkv/nn/positional/sinusoidal.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/matmul.h"

namespace qkv::decode {
using nn::gather_rows;
using nn::is_identity;
using nn::KvCache;
namespace {

void check_step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens, int64_t prev_rows, int64_t V,
                const char* op) {
  QKV_CHECK_ARG(!rows.empty() && rows.size() == tokens.size(), "[", op, "] step needs N >= 1 rows and as many ",
                "tokens, got ", rows.size(), " rows and ", tokens.size(), " tokens");
  for (size_t i = 0; i < rows.size(); ++i) {
    QKV_CHECK_ARG(rows[i] >= 0 && rows[i] < prev_rows, "[", op, "] row ", rows[i], " is outside [0, ", prev_rows,
                  ")");
    QKV_CHECK_ARG(tokens[i] >= 0 && tokens[i] < V, "[", op, "] token ", tokens[i], " is outside [0, ", V, ")");
  }
}

// weights (N, H, Tq, Tk) -> last query row averaged over heads: (N, Tk)
Tensor mean_heads_last_row(const Tensor& w) {
  const Tensor last = w.select(2, w.size(2) - 1).contiguous();  // (N, H, Tk)
  const int64_t N = last.size(0), H = last.size(1), Tk = last.size(2);
  Tensor out = Tensor::zeros({N, Tk});
  const float* p = last.data();
  float* o = out.data();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t k = 0; k < Tk; ++k) o[n * Tk + k] += p[(n * H + h) * Tk + k] / static_cast<float>(H);
  return out;
}

void check_src(const Ids& src, const char* op) {
  QKV_CHECK_ARG(src.shape.size() == 2 && src.shape[0] >= 1 && src.shape[1] >= 1 &&
                    static_cast<int64_t>(src.data.size()) == src.shape[0] * src.shape[1],
                "[", op, "] src ids ", str(src.shape), " must be (S, Ts) with S, Ts >= 1 and hold S*Ts values");
}

}  // namespace

// --- TransformerCachedStep ---------------------------------------------------------------------------------------

TransformerCachedStep::TransformerCachedStep(models::Seq2SeqTransformer& model, const Ids& src, int64_t pad_id)
    : model_(&model) {
  check_src(src, "TransformerCachedStep");
  model.eval();
  sources_ = src.shape[0];
  src_block_ = models::padding_mask(src, pad_id);
  nn::AttentionMasks src_masks;
  src_masks.key_padding_mask = src_block_;
  const Tensor memory = model.encode(src, src_masks);  // (S, Ts, E)
  for (auto& layer : model.transformer.decoder.layers) {  // (S, H, Ts, D) per layer, once per source
    auto [k, v] = layer->multihead_attn.project_kv(memory, memory);
    layer_mem_k_.push_back(k);
    layer_mem_v_.push_back(v);
  }
}

int64_t TransformerCachedStep::vocab_size() const { return model_->config().tgt_vocab; }

void TransformerCachedStep::start() {
  const auto& layers = model_->transformer.decoder.layers;
  caches_.assign(layers.size(), nn::LayerCache());
  for (size_t l = 0; l < layers.size(); ++l)
    caches_[l].self.reset(sources_, layers[l]->self_attn.num_heads(), layers[l]->self_attn.head_dim());
  row_source_.resize(static_cast<size_t>(sources_));
  for (int64_t s = 0; s < sources_; ++s) row_source_[static_cast<size_t>(s)] = s;
  gathered_for_.clear();
  t_ = 0;
  attention_ = Tensor();
}

// The memory keys/values and key padding of the current rows' sources, gathered when the rows' sources change.
void TransformerCachedStep::ensure_memory_rows() {
  if (row_source_ == gathered_for_) return;
  const bool same = is_identity(row_source_, sources_);  // one row per source in order: no gather
  const int64_t N = static_cast<int64_t>(row_source_.size());
  for (size_t l = 0; l < layer_mem_k_.size(); ++l) {
    const Tensor& k = layer_mem_k_[l];
    nn::KvCache& m = caches_[l].memory;
    m.reset(N, k.size(1), k.size(3), std::max<int64_t>(k.size(2), 1));
    m.append(same ? k : gather_rows(k, row_source_), same ? layer_mem_v_[l] : gather_rows(layer_mem_v_[l], row_source_));
  }
  row_block_ = same ? src_block_ : gather_rows(src_block_, row_source_);  // (N, Ts)
  gathered_for_ = row_source_;
}

Tensor TransformerCachedStep::step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) {
  QKV_CHECK_ARG(!row_source_.empty(), "[TransformerCachedStep] step before start");
  check_step(rows, tokens, static_cast<int64_t>(row_source_.size()), vocab_size(), "TransformerCachedStep");
  const int64_t N = static_cast<int64_t>(rows.size());
  std::vector<int64_t> src(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) src[i] = row_source_[static_cast<size_t>(rows[i])];
  row_source_ = src;
  for (nn::LayerCache& c : caches_) c.self.reorder(rows);
  ensure_memory_rows();

  const int64_t E = model_->config().transformer.layer.d_model;
  Tensor x = model_->tgt_tok_emb.forward(Ids{tokens, {N, 1}});  // (N, 1, E)
  if (model_->config().scale_embeddings) x = scale(x, std::sqrt(static_cast<float>(E)));
  x = add_sinusoidal(x, t_);
  nn::AttentionMasks tgt_masks, memory_masks;
  tgt_masks.is_causal = true;  // bottom-right: the new token sees every cached position
  memory_masks.key_padding_mask = row_block_;
  const nn::Context inference;
  auto& layers = model_->transformer.decoder.layers;
  for (size_t l = 0; l < layers.size(); ++l) {
    Tensor w;
    const bool want = record_ && l + 1 == layers.size();
    x = layers[l]->forward(inference, x, ad::Var(), tgt_masks, memory_masks, &caches_[l], nullptr, want ? &w : nullptr)
            .value;
    if (want) attention_ = mean_heads_last_row(w);
  }
  if (model_->transformer.decoder.norm) x = model_->transformer.decoder.norm->forward(x);
  ++t_;
  return model_->generator.forward(x).reshape({N, vocab_size()});
}

// --- DecoderOnlyCachedStep ---------------------------------------------------------------------------------------

namespace {
int64_t longest_prompt(const models::DecoderOnlyTransformer& model, const std::vector<std::vector<int64_t>>& prompts,
                       const char* op) {
  QKV_CHECK_ARG(!prompts.empty(), "[", op, "] needs at least one prompt");
  int64_t P = 0;
  for (const auto& p : prompts) {
    for (int64_t id : p)
      QKV_CHECK_ARG(id >= 0 && id < model.config().vocab, "[", op, "] prompt token ", id, " is outside [0, ",
                    model.config().vocab, ")");
    P = std::max<int64_t>(P, static_cast<int64_t>(p.size()));
  }
  QKV_CHECK_ARG(P < model.config().max_len, "[", op, "] a prompt of ", P, " tokens leaves no room in max_len ",
                model.config().max_len);
  return P;
}
}  // namespace

DecoderOnlyCachedStep::DecoderOnlyCachedStep(models::DecoderOnlyTransformer& model,
                                             std::vector<std::vector<int64_t>> prompts)
    : model_(&model), prompts_(std::move(prompts)) {
  prompt_len_ = longest_prompt(model, prompts_, "DecoderOnlyCachedStep");
  model.eval();
}

int64_t DecoderOnlyCachedStep::vocab_size() const { return model_->config().vocab; }
int64_t DecoderOnlyCachedStep::capacity() const { return model_->config().max_len - prompt_len_; }

Tensor DecoderOnlyCachedStep::run_layers(Tensor x) {
  const int64_t N = x.size(0), Tq = x.size(1);
  const int64_t total = (caches_.empty() ? 0 : caches_[0].self.length()) + Tq;
  nn::AttentionMasks masks;
  masks.is_causal = true;  // bottom-right: new query i sits at cache position total - Tq + i
  if (std::any_of(pad_left_.begin(), pad_left_.end(), [](int64_t p) { return p > 0; })) {
    Tensor block = Tensor::zeros({N, total});  // left padding of each row, ignored as keys
    float* b = block.data();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < pad_left_[static_cast<size_t>(n)]; ++j) b[n * total + j] = 1.0f;
    masks.key_padding_mask = block;
  }
  const nn::Context inference;
  for (size_t l = 0; l < model_->layers.size(); ++l) {
    Tensor w;
    const bool want = record_ && l + 1 == model_->layers.size();
    x = model_->layers[l]->forward(inference, x, masks, &caches_[l], want ? &w : nullptr).value;
    if (want) attention_ = mean_heads_last_row(w).slice(1, 0, std::max<int64_t>(prompt_len_, 1)).contiguous();
  }
  return x;
}

void DecoderOnlyCachedStep::start() {
  const int64_t S = num_sources(), P = prompt_len_;
  caches_.assign(model_->layers.size(), nn::LayerCache());
  for (size_t l = 0; l < caches_.size(); ++l)
    caches_[l].self.reset(S, model_->layers[l]->self_attn.num_heads(), model_->layers[l]->self_attn.head_dim(),
                     std::min<int64_t>(model_->config().max_len, 64));
  pad_left_.resize(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s)
    pad_left_[static_cast<size_t>(s)] = P - static_cast<int64_t>(prompts_[static_cast<size_t>(s)].size());
  attention_ = Tensor();
  if (P == 0) return;
  Ids ids{std::vector<int64_t>(static_cast<size_t>(S * P), 0), {S, P}};
  Ids pos{std::vector<int64_t>(static_cast<size_t>(S * P), 0), {S, P}};
  for (int64_t s = 0; s < S; ++s) {
    const auto& p = prompts_[static_cast<size_t>(s)];
    const int64_t pad = pad_left_[static_cast<size_t>(s)];
    for (int64_t j = pad; j < P; ++j) {
      ids.data[static_cast<size_t>(s * P + j)] = p[static_cast<size_t>(j - pad)];
      pos.data[static_cast<size_t>(s * P + j)] = j - pad;
    }
  }
  const bool rec = record_;
  record_ = false;
  run_layers(add(model_->tok_emb.forward(ids), model_->pos_emb.forward(pos)));  // fills the caches
  record_ = rec;
}

Tensor DecoderOnlyCachedStep::step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) {
  QKV_CHECK_ARG(!caches_.empty() || model_->layers.empty() || !pad_left_.empty(),
                "[DecoderOnlyCachedStep] step before start");
  QKV_CHECK_ARG(!pad_left_.empty(), "[DecoderOnlyCachedStep] step before start");
  check_step(rows, tokens, static_cast<int64_t>(pad_left_.size()), vocab_size(), "DecoderOnlyCachedStep");
  const int64_t N = static_cast<int64_t>(rows.size());
  std::vector<int64_t> pad(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) pad[i] = pad_left_[static_cast<size_t>(rows[i])];
  pad_left_ = pad;
  for (nn::LayerCache& c : caches_) c.self.reorder(rows);
  const int64_t len = caches_.empty() ? 0 : caches_[0].self.length();
  QKV_CHECK_ARG(len < model_->config().max_len, "[DecoderOnlyCachedStep] position ", len, " is past max_len ",
                model_->config().max_len);
  Ids pos{std::vector<int64_t>(rows.size()), {N, 1}};
  for (int64_t i = 0; i < N; ++i) pos.data[static_cast<size_t>(i)] = len - pad_left_[static_cast<size_t>(i)];
  Tensor x = add(model_->tok_emb.forward(Ids{tokens, {N, 1}}), model_->pos_emb.forward(pos));
  x = run_layers(x);
  return model_->lm_head.forward(model_->norm.forward(x)).reshape({N, vocab_size()});
}

}  // namespace qkv::decode
