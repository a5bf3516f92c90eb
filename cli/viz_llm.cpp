// The language-model page of `qkv viz --model` (see viz_llm.h): one forward over the prompt and its greedy reply with
// every layer's attention probabilities and hidden states (LlamaForCausalLM::forward's CausalLMOutput), written by
// plot::viz_data, with a logit lens beside it.
#include "viz_llm.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/decode/generate.h"
#include "qkv/models/language_model.h"
#include "qkv/plot/viewer_data.h"
#include "viz_page.h"

namespace qkv::cli {
namespace {

// The bytes of one UTF-8 character starting at s[i] (0: not a well-formed one).
size_t utf8_length(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return 0;
  return n;
}

}  // namespace

bool is_language_model(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return fs::path(path).extension() == ".gguf";
  std::ifstream in(fs::path(path) / "config.json", std::ios::binary);
  if (!in) return false;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  json::Value config;
  try {
    config = json::Value::parse(text, path + "/config.json");
  } catch (const std::invalid_argument&) {
    return false;
  }
  if (!config.is_object()) return false;
  if (const json::Value* t = config.find("model_type"); t && t->is_string()) {
    const std::string& k = t->as_string();
    if (k == "llama" || k == "mistral" || k == "qwen2" || k == "gemma2") return true;
  }
  if (const json::Value* a = config.find("architectures"); a && a->is_array())
    for (const json::Value& name : a->items())
      if (name.is_string() && name.as_string().find("ForCausalLM") != std::string::npos) return true;
  return false;
}

std::string readable_token(const std::string& bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    const size_t n = utf8_length(bytes, i);
    if (c == ' ') {
      out += "\u2423";
    } else if (c == '\n') {
      out += "\u21b5";
    } else if (c == '\t') {
      out += "\u21e5";
    } else if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7f))) {
      static constexpr char kHex[] = "0123456789ABCDEF";
      out += "<0x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      out += ">";
      ++i;
      continue;
    } else {
      out.append(bytes, i, n);
    }
    i += n == 0 ? 1 : n;
  }
  return out;
}

std::vector<std::string> page_tokens(const text::Tokenizer& tokenizer, const std::vector<int64_t>& ids) {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids)
    tokens.push_back(tokenizer.is_special(id) ? tokenizer.token(id) : readable_token(tokenizer.decode_bytes({id})));
  return tokens;
}

json::Value llm_page_data(const std::vector<Tensor>& attentions, const std::vector<std::string>& tokens,
                          int64_t prompt_len, const std::string& title) {
  const auto t = static_cast<int64_t>(tokens.size());
  QKV_CHECK_ARG(prompt_len >= 1 && prompt_len <= t, "[viz] a prompt of ", prompt_len, " tokens among ", t);
  plot::VizGroup prompt;
  prompt.name = "prompt";
  prompt.causal = true;
  prompt.q_tokens.assign(tokens.begin(), tokens.begin() + prompt_len);
  prompt.k_tokens = prompt.q_tokens;
  plot::VizGroup reply;
  reply.name = "reply";
  reply.causal = true;
  reply.q_tokens.assign(tokens.begin() + prompt_len, tokens.end());
  reply.k_tokens = tokens;
  for (const Tensor& a : attentions) {
    QKV_CHECK_ARG(a.dim() == 4 && a.size(0) == 1 && a.size(2) == t && a.size(3) == t, "[viz] attentions ",
                  str(a.shape()), " must be (1, H, ", t, ", ", t, ") for ", t, " tokens");
    const Tensor h = a.select(0, 0);  // (H, T, T)
    prompt.layers.push_back(h.slice(1, 0, prompt_len).slice(2, 0, prompt_len));
    if (t > prompt_len) reply.layers.push_back(h.slice(1, prompt_len, t));
  }
  plot::VizSnapshot snap;
  snap.groups.push_back(std::move(prompt));
  if (t > prompt_len) snap.groups.push_back(std::move(reply));
  json::Value data = plot::viz_data({snap}, title);
  data.set("prompt_tokens", prompt_len);
  return data;
}

json::Value logit_lens(const models::LlamaForCausalLM& model, const text::Tokenizer& tokenizer,
                       const std::vector<Tensor>& hidden_states, const std::vector<int64_t>& rows, int64_t offset,
                       int64_t top) {
  QKV_CHECK_ARG(!hidden_states.empty() && !rows.empty() && top >= 1, "[viz] the logit lens needs hidden states, ",
                "rows and top >= 1, got ", hidden_states.size(), " levels, ", rows.size(), " rows, top ", top);
  const auto levels = static_cast<int64_t>(hidden_states.size());
  const Tensor& h0 = hidden_states[0];
  QKV_CHECK_ARG(h0.dim() == 3 && h0.size(0) == 1, "[viz] hidden states ", str(h0.shape()), " must be (1, T, E)");
  for (int64_t r : rows)
    QKV_CHECK_ARG(r >= 0 && r < h0.size(1), "[viz] lens row ", r, " is outside [0, ", h0.size(1), ")");
  const int64_t e = h0.size(2), k = std::min(top, model.config().vocab_size);
  const int64_t cells = static_cast<int64_t>(rows.size()) * levels;  // (position, level), level fastest
  std::vector<std::vector<std::pair<int64_t, float>>> best(static_cast<size_t>(cells));
  std::map<int64_t, int64_t> used;  // token id -> index in the lens's token table
  const nn::Context c;
  constexpr int64_t kRowsAtOnce = 64;  // hidden states through one head product (its logits: 64 x V floats)
  for (int64_t first = 0; first < cells; first += kRowsAtOnce) {
    const int64_t n = std::min(kRowsAtOnce, cells - first);
    Tensor x = Tensor::empty({n, e});
    for (int64_t r = 0; r < n; ++r) {
      const int64_t cell = first + r, l = cell % levels;
      x.select(0, r).copy_from(hidden_states[static_cast<size_t>(l)].select(0, 0).select(0, rows[cell / levels]));
    }
    Tensor normed = model.model.norm.forward(c, ad::Var(x)).value.contiguous();
    for (int64_t r = 0; r < n; ++r)
      if ((first + r) % levels == levels - 1) normed.select(0, r).copy_from(x.select(0, r));  // normed already
    const Tensor logits = model.head(c, ad::Var(normed)).value.contiguous();  // (n, V)
    const int64_t v = logits.size(1);
    std::vector<int64_t> order(static_cast<size_t>(v));
    for (int64_t r = 0; r < n; ++r) {
      const float* row = logits.data() + r * v;
      const float mx = *std::max_element(row, row + v);
      double sum = 0;
      for (int64_t j = 0; j < v; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int64_t a, int64_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
      auto& cell = best[static_cast<size_t>(first + r)];
      for (int64_t q = 0; q < k; ++q) {
        const int64_t id = order[static_cast<size_t>(q)];
        cell.emplace_back(id, static_cast<float>(std::exp(static_cast<double>(row[id]) - mx) / sum));
        used.emplace(id, 0);
      }
    }
  }
  json::Value table = json::Value::array(), table_ids = json::Value::array();
  int64_t next = 0;
  for (auto& [id, index] : used) {
    index = next++;
    table.push(tokenizer.is_special(id) ? tokenizer.token(id) : readable_token(tokenizer.decode_bytes({id})));
    table_ids.push(id);
  }
  json::Value lens_ids = json::Value::array(), lens_probs = json::Value::array(), pos = json::Value::array();
  for (int64_t r : rows) pos.push(offset + r);
  for (const auto& cell : best)
    for (const auto& [id, prob] : cell) {
      lens_ids.push(used[id]);
      lens_probs.push(std::round(static_cast<double>(prob) * 1e4) / 1e4);
    }
  json::Value lens = json::Value::object();
  lens.set("positions", std::move(pos));    // P positions of the prompt + reply
  lens.set("levels", levels);               // L + 1: the embeddings, then each layer
  lens.set("top", k);
  lens.set("tokens", std::move(table));     // the token table (readable), and their ids
  lens.set("token_ids", std::move(table_ids));
  lens.set("ids", std::move(lens_ids));     // (P, L + 1, top) indices into tokens, most likely first
  lens.set("probs", std::move(lens_probs)); // (P, L + 1, top) probabilities
  return lens;
}

json::Value llm_viz_data(const std::string& path, const std::string& text, int64_t generate, int64_t lens_positions,
                         int64_t lens_top) {
  QKV_CHECK_ARG(generate >= 0, "[viz] --generate must be >= 0, got ", generate);
  QKV_CHECK_ARG(lens_positions >= 1 && lens_top >= 1, "[viz] --lens-positions and --lens-top must be >= 1, got ",
                lens_positions, " and ", lens_top);
  const models::LanguageModel lm = models::LanguageModel::load(path);
  const models::LlamaForCausalLM& model = *lm.model;
  const text::Tokenizer& tok = *lm.tokenizer;
  std::vector<int64_t> ids = tok.encode(text);
  QKV_CHECK_ARG(!ids.empty(), "[viz] the text is empty after tokenization");
  const auto prompt_len = static_cast<int64_t>(ids.size());
  if (generate > 0) {
    decode::GenerateOptions o;
    o.max_new_tokens = generate;
    o.stop_ids = lm.stop_ids;
    const decode::Generation g = decode::generate(model, ids, o);
    ids.insert(ids.end(), g.tokens.begin(), g.tokens.end());
    if (g.finish == decode::FinishReason::kStop) ids.push_back(g.stop_id);  // the reply's last token, drawn too
  }
  const auto t = static_cast<int64_t>(ids.size());
  QKV_CHECK_ARG(t <= model.config().max_position_embeddings, "[viz] ", t, " tokens (prompt and reply) exceed the ",
                "model's max_position_embeddings ", model.config().max_position_embeddings);
  models::ForwardOptions fo;
  fo.output_attentions = fo.output_hidden_states = true;
  models::CausalLMOutput out = model.forward(Ids{ids, {1, t}}, fo);

  const std::vector<std::string> tokens = page_tokens(tok, ids);
  std::string title = short_model_name(path) + ": \"" + (text.size() > 80 ? text.substr(0, 77) + "..." : text) + "\"";
  json::Value data = llm_page_data(out.attentions, tokens, prompt_len, title);
  out.attentions.clear();

  std::vector<int64_t> positions;
  for (int64_t p = std::max<int64_t>(0, t - lens_positions); p < t; ++p) positions.push_back(p);
  json::Value lens = logit_lens(model, tok, out.hidden_states, positions, 0, lens_top);
  lens.set("text_tokens", json::Value(tokens));  // every token of prompt + reply, for the position picker
  data.set("lens", std::move(lens));
  return data;
}

}  // namespace qkv::cli
