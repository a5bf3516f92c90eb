// The one KV-cached decoding step (CachedStep: prompts, left padding, positions, beams' reordering, recording) and
// the three models behind it: LlamaForCausalLM, DecoderOnlyTransformer, Seq2SeqTransformer.
#include "qkv/decode/cached_step.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "qkv/core/error.h"
#include "qkv/models/llama.h"
#include "qkv/models/outputs.h"
#include "qkv/models/transformer.h"

namespace qkv::decode {
namespace {

constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();

void check_step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens, int64_t prev_rows, int64_t V) {
  QKV_CHECK_ARG(!rows.empty() && rows.size() == tokens.size(), "[CachedStep] step needs N >= 1 rows and as many ",
                "tokens, got ", rows.size(), " rows and ", tokens.size(), " tokens");
  for (size_t i = 0; i < rows.size(); ++i) {
    QKV_CHECK_ARG(rows[i] >= 0 && rows[i] < prev_rows, "[CachedStep] row ", rows[i], " is outside [0, ", prev_rows,
                  ")");
    QKV_CHECK_ARG(tokens[i] >= 0 && tokens[i] < V, "[CachedStep] token ", tokens[i], " is outside [0, ", V, ")");
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

int64_t saturating_add(int64_t a, int64_t b) { return a > kUnlimited - b ? kUnlimited : a + b; }

}  // namespace

// --- CachedStep --------------------------------------------------------------------------------------------------

CachedStep::CachedStep(std::unique_ptr<CachedModel> model, std::vector<std::vector<int64_t>> prompts)
    : model_(std::move(model)), prompts_(std::move(prompts)) {
  QKV_CHECK_ARG(!prompts_.empty(), "[CachedStep] no prompts");
  const int64_t V = model_->vocab_size(), context = model_->context();
  for (const auto& p : prompts_) {
    for (int64_t id : p)
      QKV_CHECK_ARG(id >= 0 && id < V, "[CachedStep] prompt token ", id, " is outside [0, ", V, ")");
    prompt_len_ = std::max<int64_t>(prompt_len_, static_cast<int64_t>(p.size()));
  }
  QKV_CHECK_ARG(prompt_len_ < context, "[CachedStep] a prompt of ", prompt_len_,
                " tokens leaves no room in the model's context of ", context, " positions");
}

int64_t CachedStep::capacity() const {
  const int64_t context = model_->context();
  return context == kUnlimited ? kUnlimited : context - prompt_len_;
}

int64_t CachedStep::row_bytes(int64_t steps) const {
  return model_->row_bytes(saturating_add(prompt_len_, std::max<int64_t>(steps, 0)));
}

Tensor CachedStep::forward(const Ids& ids, bool record) {
  const int64_t N = ids.shape[0], T = ids.shape[1], total = cached_ + T;
  Tensor block;  // each row's left padding, masked out as keys
  std::vector<int64_t> positions;
  if (std::any_of(pad_left_.begin(), pad_left_.end(), [](int64_t p) { return p > 0; })) {
    block = Tensor::zeros({N, total});
    float* b = block.data();
    positions.resize(static_cast<size_t>(N * T));
    for (int64_t n = 0; n < N; ++n) {
      const int64_t pad = pad_left_[static_cast<size_t>(n)];
      for (int64_t j = 0; j < pad; ++j) b[n * total + j] = 1.0f;
      for (int64_t t = 0; t < T; ++t)  // the padding's own positions (0) are never seen
        positions[static_cast<size_t>(n * T + t)] = std::max<int64_t>(cached_ + t - pad, 0);
    }
  }
  Tensor weights;
  Tensor logits = model_->forward(ids, block.defined() ? &positions : nullptr, block, caches_, cached_,
                                  record ? &weights : nullptr);
  cached_ = total;
  if (weights.defined()) {
    attention_ = mean_heads_last_row(weights);
    if (!model_->attends_to_source())
      attention_ = attention_.slice(1, 0, std::max<int64_t>(prompt_len_, 1)).contiguous();
  }
  return logits;
}

void CachedStep::start() {
  const int64_t S = num_sources(), P = prompt_len_;
  caches_ = model_->new_caches(S, std::min(model_->context(), P + 16));
  cached_ = 0;
  pad_left_.resize(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s)
    pad_left_[static_cast<size_t>(s)] = P - static_cast<int64_t>(prompts_[static_cast<size_t>(s)].size());
  attention_ = Tensor();
  model_->start();
  if (P == 0) return;
  Ids ids{std::vector<int64_t>(static_cast<size_t>(S * P), 0), {S, P}};
  for (int64_t s = 0; s < S; ++s) {
    const auto& p = prompts_[static_cast<size_t>(s)];
    std::copy(p.begin(), p.end(), ids.data.begin() + (s + 1) * P - static_cast<int64_t>(p.size()));
  }
  forward(ids, false);  // fills the caches
}

Tensor CachedStep::step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) {
  QKV_CHECK_ARG(!pad_left_.empty(), "[CachedStep] step before start");
  const auto prev = static_cast<int64_t>(pad_left_.size());
  check_step(rows, tokens, prev, vocab_size());
  QKV_CHECK_ARG(cached_ < model_->context(), "[CachedStep] position ", cached_, " is past the model's context of ",
                model_->context(), " positions");
  const auto N = static_cast<int64_t>(rows.size());
  if (!nn::is_identity(rows, prev)) {
    // Beams fork and drop rows: the caches (new ones while they hold nothing), the padding and the model's state.
    if (cached_ > 0) {
      for (nn::KvCache& c : caches_) c.reorder(rows);
    } else {
      caches_ = model_->new_caches(N, std::min(model_->context(), int64_t{16}));
    }
    std::vector<int64_t> pad(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) pad[i] = pad_left_[static_cast<size_t>(rows[i])];
    pad_left_ = std::move(pad);
    model_->reorder(rows);
  }
  const Tensor logits = forward(Ids{tokens, {N, 1}}, record_);  // (N, 1, V)
  return logits.reshape({N, vocab_size()});
}

// --- LlamaForCausalLM --------------------------------------------------------------------------------------------

namespace {

class LlamaCached : public CachedModel {
 public:
  LlamaCached(const models::LlamaForCausalLM& model, int64_t page_size, Precision kv_cache)
      : model_(&model), page_size_(page_size), kv_cache_(kv_cache) {
    QKV_CHECK_ARG(page_size >= 0, "[CachedStep] page_size must be >= 0, got ", page_size);
  }
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  // Rotary positions have no table: a search may run past max_position_embeddings (generate() stops there), and
  // BeamOptions::max_bytes then bounds its caches.
  int64_t context() const override { return kUnlimited; }
  int64_t row_bytes(int64_t positions) const override {
    const models::LlamaConfig& c = model_->config();
    const int64_t bytes = kv_row_bytes(c.num_hidden_layers, c.num_key_value_heads * c.head_dim, positions);
    return kv_cache_ == Precision::kBFloat16 ? bytes / 2 : bytes;  // bf16: 2 bytes an element in place of 4
  }
  std::vector<nn::KvCache> new_caches(int64_t rows, int64_t capacity) const override {
    return model_->new_caches(rows, capacity, page_size_, kv_cache_);
  }
  Tensor forward(const Ids& ids, const std::vector<int64_t>* positions, const Tensor& key_padding,
                 std::vector<nn::KvCache>& caches, int64_t cached, Tensor* attention) override {
    (void)cached;
    Ids mask;  // HF's attention_mask: 1 = token
    if (key_padding.defined()) {
      mask.shape = {key_padding.size(0), key_padding.size(1)};
      const float* b = key_padding.data();
      mask.data.resize(static_cast<size_t>(key_padding.numel()));
      for (size_t i = 0; i < mask.data.size(); ++i) mask.data[i] = b[i] != 0.0f ? 0 : 1;
    }
    const auto L = static_cast<int64_t>(model_->model.layers.size());
    if (attention == nullptr || L == 0)  // the prompt's prefill keeps the last position's logits only
      return model_->forward(nn::Context(), ids, &caches, /*logits_to_keep=*/1, positions, mask).value;
    models::ForwardOptions o;
    o.output_attentions = true;
    o.attention_layers = {L - 1};
    models::CausalLMOutput out = model_->forward(ids, o, &caches, mask, positions);
    *attention = std::move(out.attentions.back());
    return out.logits;
  }

 private:
  const models::LlamaForCausalLM* model_;
  int64_t page_size_;
  Precision kv_cache_;
};

// --- DecoderOnlyTransformer --------------------------------------------------------------------------------------

class DecoderOnlyCached : public CachedModel {
 public:
  explicit DecoderOnlyCached(models::DecoderOnlyTransformer& model) : model_(&model) { model.eval(); }
  int64_t vocab_size() const override { return model_->config().vocab; }
  int64_t context() const override { return model_->config().max_len; }
  int64_t row_bytes(int64_t positions) const override {
    return kv_row_bytes(static_cast<int64_t>(model_->layers.size()), model_->config().layer.d_model, positions);
  }
  std::vector<nn::KvCache> new_caches(int64_t rows, int64_t capacity) const override {
    return model_->new_caches(rows, capacity);
  }
  Tensor forward(const Ids& ids, const std::vector<int64_t>* positions, const Tensor& key_padding,
                 std::vector<nn::KvCache>& caches, int64_t cached, Tensor* attention) override {
    (void)cached;
    const auto L = static_cast<int64_t>(model_->layers.size());
    if (attention == nullptr || L == 0)
      return model_->forward(nn::Context(), ids, key_padding, positions, &caches).value;
    models::ForwardOptions o;
    o.output_attentions = true;
    o.attention_layers = {L - 1};
    models::CausalLMOutput out = model_->forward(ids, o, key_padding, &caches, positions);
    *attention = std::move(out.attentions.back());
    return out.logits;
  }

 private:
  models::DecoderOnlyTransformer* model_;
};

// --- Seq2SeqTransformer ------------------------------------------------------------------------------------------

// The sources' memory and its padding are the per-row state: the rows' sources, the cross-attention caches
// (projected by the first forward) and the memory's key padding follow the rows when their sources change.
class Seq2SeqCached : public CachedModel {
 public:
  Seq2SeqCached(models::Seq2SeqTransformer& model, const Ids& src, int64_t pad_id) : model_(&model) {
    QKV_CHECK_ARG(src.shape.size() == 2 && src.shape[0] >= 1 && src.shape[1] >= 1 &&
                      static_cast<int64_t>(src.data.size()) == src.shape[0] * src.shape[1],
                  "[CachedStep] src ids ", str(src.shape), " must be (S, Ts) with S, Ts >= 1 and hold S*Ts values");
    model.eval();
    sources_ = src.shape[0];
    src_block_ = models::padding_mask(src, pad_id);
    nn::AttentionMasks src_masks;
    src_masks.key_padding_mask = src_block_;
    memory_ = model.encode(src, src_masks);  // (S, Ts, E)
  }
  int64_t vocab_size() const override { return model_->config().tgt_vocab; }
  int64_t context() const override { return kUnlimited; }
  // float32 K and V of every decoder layer: self-attention over the positions, cross-attention over Ts.
  int64_t row_bytes(int64_t positions) const override {
    const auto L = static_cast<int64_t>(model_->transformer.decoder.layers.size());
    const int64_t E = model_->config().transformer.layer.d_model;
    return saturating_add(kv_row_bytes(L, E, positions), kv_row_bytes(L, E, memory_.size(1)));
  }
  std::vector<nn::KvCache> new_caches(int64_t rows, int64_t capacity) const override {
    (void)rows;
    (void)capacity;  // the decoder layers size them on their first append
    return std::vector<nn::KvCache>(model_->transformer.decoder.layers.size());
  }
  void start() override {
    row_source_.resize(static_cast<size_t>(sources_));
    for (int64_t s = 0; s < sources_; ++s) row_source_[static_cast<size_t>(s)] = s;
    memory_caches_.assign(model_->transformer.decoder.layers.size(), nn::KvCache());
    row_block_ = src_block_;
    projected_ = false;
  }
  void reorder(const std::vector<int64_t>& rows) override {
    std::vector<int64_t> src(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) src[i] = row_source_[static_cast<size_t>(rows[i])];
    if (src == row_source_) return;
    if (projected_)
      for (nn::KvCache& c : memory_caches_) c.reorder(rows);
    row_block_ = nn::is_identity(src, sources_) ? src_block_ : nn::gather_rows(src_block_, src);  // (N, Ts)
    row_source_ = std::move(src);
  }
  Tensor forward(const Ids& ids, const std::vector<int64_t>* positions, const Tensor& key_padding,
                 std::vector<nn::KvCache>& caches, int64_t cached, Tensor* attention) override {
    (void)positions;  // empty target prompts: no padding, every row at the caches' length
    (void)key_padding;
    // The first forward projects the rows' memory into the cross-attention caches; later ones pass none.
    ad::Var memory;
    if (!projected_)
      memory = ad::Var(nn::is_identity(row_source_, sources_) ? memory_ : nn::gather_rows(memory_, row_source_));
    nn::AttentionMasks memory_masks;
    memory_masks.key_padding_mask = row_block_;
    const size_t L = model_->transformer.decoder.layers.size();
    nn::StackRecord record;  // the last layer's cross-attention, when asked
    const bool want = attention != nullptr && L > 0;
    if (want) {
      record.attention_layers.assign(L, false);
      record.attention_layers.back() = true;
    }
    nn::DecoderCache cache;  // the self-attention caches lent by CachedStep beside the memory's own
    cache.self = std::move(caches);
    cache.memory = std::move(memory_caches_);
    cache.length = cached;
    Tensor logits = model_->decode(nn::Context(), ids, memory, models::Seq2SeqMasks::causal_self_attention(),
                                   memory_masks, want ? &record : nullptr, &cache)
                        .value;  // (N, T, V)
    caches = std::move(cache.self);
    memory_caches_ = std::move(cache.memory);
    projected_ = true;
    if (want) *attention = record.cross_attentions.back();
    return logits;
  }
  bool attends_to_source() const override { return true; }

 private:
  models::Seq2SeqTransformer* model_;
  int64_t sources_ = 0;
  Tensor memory_;     // (S, Ts, E): the encoder's output per source
  Tensor src_block_;  // (S, Ts) 1 at padding
  // Per row:
  std::vector<int64_t> row_source_;
  std::vector<nn::KvCache> memory_caches_;  // the cross-attention's keys and values, one per layer
  Tensor row_block_;                        // (N, Ts)
  bool projected_ = false;                  // memory_caches_ hold the rows' memory
};

}  // namespace

CachedStep cached_step(const models::LlamaForCausalLM& model, std::vector<std::vector<int64_t>> prompts,
                       int64_t page_size, Precision kv_cache) {
  return CachedStep(std::make_unique<LlamaCached>(model, page_size, kv_cache), std::move(prompts));
}

CachedStep cached_step(models::DecoderOnlyTransformer& model, std::vector<std::vector<int64_t>> prompts) {
  return CachedStep(std::make_unique<DecoderOnlyCached>(model), std::move(prompts));
}

CachedStep cached_step(models::Seq2SeqTransformer& model, const Ids& src, int64_t pad_id) {
  auto m = std::make_unique<Seq2SeqCached>(model, src, pad_id);
  const auto S = static_cast<size_t>(src.shape[0]);
  return CachedStep(std::move(m), std::vector<std::vector<int64_t>>(S));
}

}  // namespace qkv::decode
