// The viewer page: the page data (plot::viz_data) in place of web/viewer.html's placeholder; the BERT encoder's
// maps. Shared by `qkv viz` and `qkv serve`.
#include "viz_page.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "qkv/core/error.h"
#include "qkv_viewer_html.h"  // generated from web/viewer.html: kViewerHtml

namespace qkv::cli {
namespace {

constexpr std::string_view kPlaceholder = "__QKV_DATA__";
// In the <head> of web/viewer.html: what tells a page that the viewer wrote from any other file.
constexpr std::string_view kPageMarker = "<meta name=\"generator\" content=\"qkv attention viewer\">";
constexpr size_t kMarkerWithin = 4096;  // bytes from the start of a page

}  // namespace

VizSnapshot bert_snapshot(const models::SentenceEncoder& encoder, const std::string& text, const std::string* second,
                          const std::vector<int64_t>& mask) {
  models::SentenceEncoder::TokenAttentions a = encoder.attentions(text, second, mask);
  VizGroup g;
  g.name = "self-attention";
  g.q_tokens = a.tokens;
  g.k_tokens = a.tokens;
  g.layers = std::move(a.weights);
  VizSnapshot s;
  s.groups.push_back(std::move(g));
  return s;
}

std::string short_model_name(const std::string& model_dir) {
  const std::filesystem::path p = std::filesystem::path(model_dir).lexically_normal();
  const std::filesystem::path last = p.has_filename() ? p : p.parent_path();
  const std::filesystem::path parent = last.parent_path().filename();
  return parent.empty() ? last.filename().string() : (parent / last.filename()).string();
}

std::string viz_page(const json::Value& data) {
  const std::string json = script_json(data);
  const std::string_view page = kViewerHtml;
  const size_t at = page.find(kPlaceholder);
  if (at == std::string_view::npos) throw std::runtime_error("[viz] the embedded viewer page has no data placeholder");
  if (page.find(kPageMarker) >= kMarkerWithin)
    throw std::runtime_error("[viz] the embedded viewer page lacks its marker in its first 4 kB");
  std::string out;
  out.reserve(page.size() + json.size());
  out.append(page.substr(0, at)).append(json).append(page.substr(at + kPlaceholder.size()));
  return out;
}

bool is_viewer_page_or_absent(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  if (ec || st.type() == fs::file_type::not_found) return true;
  if (st.type() != fs::file_type::regular) return false;
  std::ifstream in(path, std::ios::binary);
  std::string head(kMarkerWithin, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  return head.find(kPageMarker) != std::string::npos;
}

std::unique_ptr<models::SentenceEncoder> load_viewer_encoder(const std::string& model_dir, const char* op) {
  namespace fs = std::filesystem;
  const std::string takes =
      std::string(" takes a BERT sentence-encoder folder (config.json, vocab.txt, model.safetensors;") +
      " e.g. all-MiniLM-L6-v2); attention maps of language models are not drawn yet";
  const fs::path dir(model_dir);
  QKV_CHECK_ARG(!(fs::is_regular_file(dir) && dir.extension() == ".gguf"), "[", op, "] ", model_dir,
                " is a GGUF language model: --model", takes);
  std::ifstream in(dir / "config.json", std::ios::binary);
  if (in) {
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    json::Value config;
    try {
      config = json::Value::parse(text, "[" + std::string(op) + "] " + (dir / "config.json").string());
    } catch (const std::invalid_argument&) {
      // SentenceEncoder reports a malformed config.json with its own message
    }
    std::string kind;
    if (config.is_object()) {
      if (const json::Value* t = config.find("model_type"); t && t->is_string()) kind = t->as_string();
      if (const json::Value* a = config.find("architectures"); a && a->is_array())
        for (const json::Value& name : a->items())
          if (name.is_string() && name.as_string().find("CausalLM") != std::string::npos && kind.empty())
            kind = name.as_string();
    }
    QKV_CHECK_ARG(kind.empty() || kind == "bert", "[", op, "] ", model_dir, " holds a '", kind,
                  "' model, not a BERT encoder: --model", takes);
  }
  return std::make_unique<models::SentenceEncoder>(model_dir);
}

std::string truncation_note(const models::SentenceEncoder& encoder, const std::string& text,
                            const std::string* second) {
  if (second) return "";  // a pair longer than max_seq_length is refused, never cut
  const auto t = static_cast<int64_t>(encoder.tokenizer().tokenize(text).size()) + 2;  // [CLS] ... [SEP]
  if (t <= encoder.max_seq_length()) return "";
  return "the text has " + std::to_string(t) + " tokens with [CLS] and [SEP]; the model reads only the first " +
         std::to_string(encoder.max_seq_length()) + " (its max_seq_length), and the maps show those";
}

}  // namespace qkv::cli
