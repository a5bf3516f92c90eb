// Transformer step models: cached incremental decoding through the models' forward (Seq2SeqTransformer::decode
// with an nn::DecoderCache, DecoderOnlyTransformer::forward with one nn::KvCache per layer).
#include "qkv/decode/transformer_step.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "qkv/core/error.h"
#include "qkv/models/outputs.h"

namespace qkv::decode {
using nn::gather_rows;
using nn::is_identity;
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
  memory_ = model.encode(src, src_masks);  // (S, Ts, E)
}

int64_t TransformerCachedStep::vocab_size() const { return model_->config().tgt_vocab; }

int64_t TransformerCachedStep::row_bytes(int64_t steps) const {
  const int64_t L = static_cast<int64_t>(model_->transformer.decoder.layers.size());
  const int64_t E = model_->config().transformer.layer.d_model;
  const int64_t self = kv_row_bytes(L, E, steps), memory = kv_row_bytes(L, E, memory_.size(1));
  return self > std::numeric_limits<int64_t>::max() - memory ? std::numeric_limits<int64_t>::max() : self + memory;
}

void TransformerCachedStep::start() {
  cache_ = nn::DecoderCache(model_->transformer.decoder.layers.size());
  row_source_.resize(static_cast<size_t>(sources_));
  for (int64_t s = 0; s < sources_; ++s) row_source_[static_cast<size_t>(s)] = s;
  attention_ = Tensor();
}

Tensor TransformerCachedStep::step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) {
  QKV_CHECK_ARG(!row_source_.empty(), "[TransformerCachedStep] step before start");
  check_step(rows, tokens, static_cast<int64_t>(row_source_.size()), vocab_size(), "TransformerCachedStep");
  const int64_t N = static_cast<int64_t>(rows.size());
  std::vector<int64_t> src(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) src[i] = row_source_[static_cast<size_t>(rows[i])];
  // The first step projects the rows' memory into the cache; later ones reorder the cached rows (the memory's only
  // when the rows' sources change).
  const bool first = cache_.length == 0, same = is_identity(src, sources_);
  ad::Var memory;
  if (first) {
    memory = ad::Var(same ? memory_ : gather_rows(memory_, src));
  } else {
    for (nn::KvCache& c : cache_.self) c.reorder(rows);
    if (src != row_source_)
      for (nn::KvCache& c : cache_.memory) c.reorder(rows);
  }
  if (first || src != row_source_) row_block_ = same ? src_block_ : gather_rows(src_block_, src);  // (N, Ts)
  row_source_ = std::move(src);

  nn::AttentionMasks memory_masks;
  memory_masks.key_padding_mask = row_block_;
  const size_t L = model_->transformer.decoder.layers.size();
  nn::StackRecord record;  // the last layer's cross-attention, when asked
  const bool want = record_ && L > 0;
  if (want) {
    record.attention_layers.assign(L, false);
    record.attention_layers.back() = true;
  }
  const Tensor logits = model_->decode(nn::Context(), Ids{tokens, {N, 1}}, memory,
                                       models::Seq2SeqMasks::causal_self_attention(), memory_masks,
                                       want ? &record : nullptr, &cache_)
                            .value;  // (N, 1, V)
  if (want) attention_ = mean_heads_last_row(record.cross_attentions.back());
  return logits.reshape({N, vocab_size()});
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

int64_t DecoderOnlyCachedStep::row_bytes(int64_t steps) const {
  const models::DecoderOnlyConfig& c = model_->config();
  return kv_row_bytes(static_cast<int64_t>(model_->layers.size()), c.layer.d_model,
                      prompt_len_ + std::max<int64_t>(steps, 0));
}

Tensor DecoderOnlyCachedStep::forward(const Ids& ids, const std::vector<int64_t>& positions, bool record) {
  const int64_t N = ids.shape[0];
  const int64_t total = (caches_.empty() ? 0 : caches_[0].length()) + ids.shape[1];
  Tensor block;  // left padding of each row, ignored as keys
  if (std::any_of(pad_left_.begin(), pad_left_.end(), [](int64_t p) { return p > 0; })) {
    block = Tensor::zeros({N, total});
    float* b = block.data();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < pad_left_[static_cast<size_t>(n)]; ++j) b[n * total + j] = 1.0f;
  }
  const int64_t L = static_cast<int64_t>(model_->layers.size());
  if (!record || L == 0) return model_->forward(nn::Context(), ids, block, &positions, &caches_).value;
  models::ForwardOptions o;
  o.output_attentions = true;
  o.attention_layers = {L - 1};
  const models::CausalLMOutput out = model_->forward(ids, o, block, &caches_, &positions);
  attention_ = mean_heads_last_row(out.attentions.back()).slice(1, 0, std::max<int64_t>(prompt_len_, 1)).contiguous();
  return out.logits;
}

void DecoderOnlyCachedStep::start() {
  const int64_t S = num_sources(), P = prompt_len_;
  caches_ = model_->new_caches(S, std::min<int64_t>(model_->config().max_len, 64));
  pad_left_.resize(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s)
    pad_left_[static_cast<size_t>(s)] = P - static_cast<int64_t>(prompts_[static_cast<size_t>(s)].size());
  attention_ = Tensor();
  if (P == 0) return;
  Ids ids{std::vector<int64_t>(static_cast<size_t>(S * P), 0), {S, P}};
  std::vector<int64_t> positions(static_cast<size_t>(S * P), 0);
  for (int64_t s = 0; s < S; ++s) {
    const auto& p = prompts_[static_cast<size_t>(s)];
    const int64_t pad = pad_left_[static_cast<size_t>(s)];
    for (int64_t j = pad; j < P; ++j) {
      ids.data[static_cast<size_t>(s * P + j)] = p[static_cast<size_t>(j - pad)];
      positions[static_cast<size_t>(s * P + j)] = j - pad;
    }
  }
  forward(ids, positions, false);  // fills the caches
}

Tensor DecoderOnlyCachedStep::step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) {
  QKV_CHECK_ARG(!pad_left_.empty(), "[DecoderOnlyCachedStep] step before start");
  check_step(rows, tokens, static_cast<int64_t>(pad_left_.size()), vocab_size(), "DecoderOnlyCachedStep");
  const int64_t N = static_cast<int64_t>(rows.size());
  std::vector<int64_t> pad(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) pad[i] = pad_left_[static_cast<size_t>(rows[i])];
  pad_left_ = pad;
  for (nn::KvCache& c : caches_) c.reorder(rows);
  const int64_t len = caches_.empty() ? 0 : caches_[0].length();
  QKV_CHECK_ARG(len < model_->config().max_len, "[DecoderOnlyCachedStep] position ", len, " is past max_len ",
                model_->config().max_len);
  std::vector<int64_t> positions(rows.size());
  for (int64_t i = 0; i < N; ++i) positions[static_cast<size_t>(i)] = len - pad_left_[static_cast<size_t>(i)];
  return forward(Ids{tokens, {N, 1}}, positions, record_).reshape({N, vocab_size()});
}

}  // namespace qkv::decode
