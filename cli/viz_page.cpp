// The viewer page: attention tensors -> JSON page data (base64 float16 or uint8) -> web/viewer.html with the data
// in place of its placeholder. Shared by `qkv viz` and `qkv serve`.
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

constexpr size_t kMaxF16Base64 = 8'000'000;
constexpr std::string_view kPlaceholder = "__QKV_DATA__";
// In the <head> of web/viewer.html: what tells a page that the viewer wrote from any other file.
constexpr std::string_view kPageMarker = "<meta name=\"generator\" content=\"qkv attention viewer\">";
constexpr size_t kMarkerWithin = 4096;  // bytes from the start of a page

void check_group(const VizGroup& g, const VizGroup* first) {
  QKV_CHECK_ARG(!g.layers.empty(), "[viz] ", g.name, ": no layers");
  const auto tq = static_cast<int64_t>(g.q_tokens.size()), tk = static_cast<int64_t>(g.k_tokens.size());
  for (size_t l = 0; l < g.layers.size(); ++l) {
    const Tensor& w = g.layers[l];
    QKV_CHECK_ARG(w.dim() == 3 && w.size(1) == tq && w.size(2) == tk && w.size(0) == g.layers[0].size(0), "[viz] ",
                  g.name, ": layer ", l, " weights ", str(w.shape()), " must be (H, ", tq, ", ", tk, ") for ", tq,
                  " query and ", tk, " key tokens, H as layer 0");
  }
  if (first) {
    QKV_CHECK_ARG(first->layers.size() == g.layers.size() && first->layers[0].shape() == g.layers[0].shape(),
                  "[viz] ", g.name, ": every snapshot must hold the same shapes, got ", str(g.layers[0].shape()),
                  " and ", str(first->layers[0].shape()));
  }
}

json::Value group_json(const VizGroup& g, VizDtype dtype) {
  const int64_t heads = g.layers[0].size(0), tq = g.layers[0].size(1), tk = g.layers[0].size(2);
  std::string bytes;
  bytes.reserve(static_cast<size_t>(g.layers.size() * heads * tq * tk * (dtype == VizDtype::kF16 ? 2 : 1)));
  for (const Tensor& layer : g.layers) {
    const Tensor c = layer.contiguous();
    const float* p = c.data();
    for (int64_t i = 0; i < c.numel(); ++i) {
      const float v = p[i];
      QKV_CHECK_ARG(std::isfinite(v) && v >= -1e-6f && v <= 1.001f, "[viz] ", g.name, ": weight ", v,
                    " is not in [0, 1] (shape ", str(c.shape()), ")");
      const float x = std::min(1.0f, std::max(0.0f, v));
      if (dtype == VizDtype::kF16) {
        const uint16_t h = to_half(x);
        bytes.push_back(static_cast<char>(h & 0xff));
        bytes.push_back(static_cast<char>(h >> 8));
      } else {
        bytes.push_back(static_cast<char>(static_cast<uint8_t>(std::lround(x * 255.0f))));
      }
    }
  }
  json::Value j = json::Value::object();
  j.set("name", g.name);
  j.set("kind", g.cross ? "cross" : "self");
  j.set("layers", static_cast<int64_t>(g.layers.size()));
  j.set("heads", heads);
  j.set("tq", tq);
  j.set("tk", tk);
  j.set("q_tokens", json::Value(g.q_tokens));
  j.set("k_tokens", json::Value(g.k_tokens));
  j.set("causal", g.causal);
  j.set("dtype", dtype == VizDtype::kF16 ? "f16" : "u8");
  j.set("data", base64(bytes));
  return j;
}

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

uint16_t to_half(float x) {
  uint32_t f;
  std::memcpy(&f, &x, sizeof f);
  const uint32_t sign = (f >> 16) & 0x8000u;
  const uint32_t abs = f & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504: infinity
  if (abs < 0x38800000u) {  // below 2^-14: a subnormal half (or zero)
    const float scaled = std::fabs(x) * 16777216.0f;  // units of 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  const uint32_t mant = abs & 0x7fffffu;
  uint32_t h = ((abs >> 23) - 112u) << 10 | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // to nearest, ties to even (may carry into the exponent)
  return static_cast<uint16_t>(sign | h);
}

std::string base64(const std::string& bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = static_cast<uint8_t>(bytes[i]) << 16 | static_cast<uint8_t>(bytes[i + 1]) << 8 |
                       static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

json::Value viz_data(const std::vector<VizSnapshot>& snapshots, const std::string& title, VizDtype dtype) {
  QKV_CHECK_ARG(!snapshots.empty() && !snapshots[0].groups.empty(), "[viz] nothing to draw: no snapshot or group");
  size_t values = 0;
  for (const VizSnapshot& s : snapshots) {
    QKV_CHECK_ARG(s.groups.size() == snapshots[0].groups.size(), "[viz] snapshot '", s.label, "' has ",
                  s.groups.size(), " groups, the first one ", snapshots[0].groups.size());
    for (size_t k = 0; k < s.groups.size(); ++k) {
      check_group(s.groups[k], &s == &snapshots[0] ? nullptr : &snapshots[0].groups[k]);
      for (const Tensor& w : s.groups[k].layers) values += static_cast<size_t>(w.numel());
    }
  }
  if (dtype == VizDtype::kAuto) dtype = values * 2 * 4 / 3 <= kMaxF16Base64 ? VizDtype::kF16 : VizDtype::kU8;
  json::Value snaps = json::Value::array();
  for (const VizSnapshot& s : snapshots) {
    json::Value groups = json::Value::array();
    for (const VizGroup& g : s.groups) groups.push(group_json(g, dtype));
    json::Value js = json::Value::object();
    js.set("label", s.label);
    js.set("groups", std::move(groups));
    snaps.push(std::move(js));
  }
  json::Value data = json::Value::object();
  data.set("format", "qkv-attention-1");
  data.set("title", title);
  data.set("lang", "en");
  data.set("snapshots", std::move(snaps));
  return data;
}

std::string script_json(const json::Value& data) {
  const std::string json = data.dump(0);
  // These characters occur only inside JSON strings, where \uXXXX means the same character.
  std::string out;
  out.reserve(json.size() + json.size() / 16);
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (c == '<') {
      out += "\\u003c";
    } else if (c == '>') {
      out += "\\u003e";
    } else if (c == '&') {
      out += "\\u0026";
    } else if (c == '\xE2' && i + 2 < json.size() && json[i + 1] == '\x80' &&
               (json[i + 2] == '\xA8' || json[i + 2] == '\xA9')) {
      out += json[i + 2] == '\xA8' ? "\\u2028" : "\\u2029";  // line and paragraph separators (UTF-8 E2 80 A8/A9)
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
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
