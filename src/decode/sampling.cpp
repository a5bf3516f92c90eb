// Token sampling (temperature, top-k, top-p) and prompt continuation for models::LlamaForCausalLM through its
// KV caches: the StepModel that greedy_search / beam_search drive, and generate() for one prompt.
#include "qkv/decode/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "qkv/core/error.h"
#include "qkv/decode/generate.h"

namespace qkv::decode {

void check_sampling(const SamplingOptions& o) {
  QKV_CHECK_ARG(o.temperature >= 0.0f && std::isfinite(o.temperature),
                "[sampling] temperature must be finite and >= 0, got ", o.temperature);
  QKV_CHECK_ARG(o.top_k >= 0, "[sampling] top_k must be >= 0, got ", o.top_k);
  QKV_CHECK_ARG(o.top_p > 0.0f && o.top_p <= 1.0f, "[sampling] top_p must be in (0, 1], got ", o.top_p);
}

int64_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& o, Rng& rng) {
  check_sampling(o);
  QKV_CHECK_ARG(vocab >= 1, "[sampling] vocab must be >= 1, got ", vocab);
  for (int64_t i = 0; i < vocab; ++i)
    QKV_CHECK_ARG(!std::isnan(logits[i]), "[sampling] logit ", i, " is NaN");
  if (o.temperature == 0.0f) return std::max_element(logits, logits + vocab) - logits;
  // Candidates by decreasing logit (lower id first on ties), cut to top_k.
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  if (o.top_k > 0 && o.top_k < vocab) order.resize(static_cast<size_t>(o.top_k));
  // Softmax of logits / temperature over the candidates, in double.
  const double top = static_cast<double>(logits[order[0]]) / o.temperature;
  std::vector<double> p(order.size());
  double total = 0.0;
  for (size_t i = 0; i < order.size(); ++i) total += p[i] = std::exp(static_cast<double>(logits[order[i]]) / o.temperature - top);
  for (double& x : p) x /= total;
  // Nucleus: the shortest prefix whose mass reaches top_p (at least one token).
  size_t keep = p.size();
  if (o.top_p < 1.0f) {
    double mass = 0.0;
    for (size_t i = 0; i < p.size(); ++i) {
      mass += p[i];
      if (mass >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  const double u = static_cast<double>(rng.uniform()) * kept;
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

// --- CausalLmStep ----------------------------------------------------------------------------------------------

CausalLmStep::CausalLmStep(const models::LlamaForCausalLM& model, std::vector<std::vector<int64_t>> prompts,
                           int64_t page_size)
    : model_(&model), prompts_(std::move(prompts)), page_size_(page_size) {
  QKV_CHECK_ARG(page_size >= 0, "[CausalLmStep] page_size must be >= 0, got ", page_size);
  QKV_CHECK_ARG(!prompts_.empty(), "[CausalLmStep] no prompts");
  const size_t p = prompts_[0].size();
  QKV_CHECK_ARG(p >= 1, "[CausalLmStep] prompts must hold at least one token");
  for (const auto& prompt : prompts_)
    QKV_CHECK_ARG(prompt.size() == p, "[CausalLmStep] prompts must share one length: ", p, " and ", prompt.size());
}

int64_t CausalLmStep::vocab_size() const { return model_->config().vocab_size; }

int64_t CausalLmStep::row_bytes(int64_t steps) const {
  const models::LlamaConfig& c = model_->config();
  const int64_t positions = static_cast<int64_t>(prompts_[0].size()) + std::max<int64_t>(steps, 0);
  const double bytes = 2.0 * static_cast<double>(c.num_hidden_layers) * static_cast<double>(c.num_key_value_heads) *
                       static_cast<double>(c.head_dim) * static_cast<double>(positions) * sizeof(float);
  return bytes >= 9.0e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(bytes);
}

void CausalLmStep::start() {
  const auto s = static_cast<int64_t>(prompts_.size());
  const auto p = static_cast<int64_t>(prompts_[0].size());
  caches_ = model_->new_caches(s, p + 16, page_size_);
  rows_ = s;
  if (p == 1) return;
  Ids ids{{}, {s, p - 1}};
  for (const auto& prompt : prompts_) ids.data.insert(ids.data.end(), prompt.begin(), prompt.end() - 1);
  model_->forward(nn::Context(), ids, &caches_, /*logits_to_keep=*/1);  // only the caches are kept
}

Tensor CausalLmStep::step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) {
  const auto n = static_cast<int64_t>(rows.size());
  QKV_CHECK_ARG(n >= 1 && tokens.size() == rows.size(), "[CausalLmStep] ", rows.size(), " rows and ",
                tokens.size(), " tokens");
  for (int64_t r : rows)
    QKV_CHECK_ARG(r >= 0 && r < rows_, "[CausalLmStep] row ", r, " is outside [0, ", rows_, ")");
  if (!nn::is_identity(rows, rows_))
    for (nn::KvCache& c : caches_) c.reorder(rows);
  rows_ = n;
  const Tensor logits = model_->forward(nn::Context(), Ids{tokens, {n, 1}}, &caches_).value;  // (N, 1, V)
  return logits.reshape({n, logits.size(2)});
}

CausalLmRecomputeStep::CausalLmRecomputeStep(const models::LlamaForCausalLM& model,
                                             std::vector<std::vector<int64_t>> prompts)
    : model_(&model), prompts_(std::move(prompts)) {
  QKV_CHECK_ARG(!prompts_.empty(), "[CausalLmRecomputeStep] no prompts");
}

int64_t CausalLmRecomputeStep::vocab_size() const { return model_->config().vocab_size; }

void CausalLmRecomputeStep::start() { rows_ = prompts_; }

Tensor CausalLmRecomputeStep::step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) {
  const auto n = static_cast<int64_t>(rows.size());
  QKV_CHECK_ARG(n >= 1 && tokens.size() == rows.size(), "[CausalLmRecomputeStep] ", rows.size(), " rows and ",
                tokens.size(), " tokens");
  std::vector<std::vector<int64_t>> next;
  const int64_t v = vocab_size();
  Tensor out = Tensor::empty({n, v});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows[static_cast<size_t>(i)];
    QKV_CHECK_ARG(r >= 0 && r < static_cast<int64_t>(rows_.size()), "[CausalLmRecomputeStep] row ", r,
                  " is outside [0, ", rows_.size(), ")");
    std::vector<int64_t> seq = rows_[static_cast<size_t>(r)];
    seq.push_back(tokens[static_cast<size_t>(i)]);
    const auto t = static_cast<int64_t>(seq.size());
    const Tensor logits = model_->logits(Ids{seq, {1, t}});  // (1, T, V)
    const Tensor last = logits.select(1, t - 1).contiguous();
    std::copy(last.data(), last.data() + v, out.data() + i * v);
    next.push_back(std::move(seq));
  }
  rows_ = std::move(next);
  return out;
}

std::vector<int64_t> generate(const models::LlamaForCausalLM& model, const std::vector<int64_t>& prompt,
                              int64_t max_new_tokens, const SamplingOptions& options, int64_t eos,
                              int64_t page_size) {
  check_sampling(options);
  QKV_CHECK_ARG(page_size >= 0, "[generate] page_size must be >= 0, got ", page_size);
  QKV_CHECK_ARG(!prompt.empty(), "[generate] the prompt must hold at least one token");
  QKV_CHECK_ARG(max_new_tokens >= 0, "[generate] max_new_tokens must be >= 0, got ", max_new_tokens);
  const int64_t v = model.config().vocab_size;
  QKV_CHECK_ARG(eos >= -1 && eos < v, "[generate] eos ", eos, " must be in [0, vocab_size = ", v, ") or -1 (never)");
  for (size_t i = 0; i < prompt.size(); ++i)
    QKV_CHECK_ARG(prompt[i] >= 0 && prompt[i] < v, "[generate] prompt id ", prompt[i], " at ", i,
                  " is outside [0, vocab_size = ", v, ")");
  GenerateOptions o;
  o.max_new_tokens = max_new_tokens;
  o.sampling = options;
  if (eos >= 0) o.stop_ids = {eos};
  o.page_size = page_size;
  Generation g = generate(model, prompt, o);
  if (g.finish == FinishReason::kStop) g.tokens.push_back(g.stop_id);
  return g.tokens;
}

}  // namespace qkv::decode
