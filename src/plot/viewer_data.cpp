// The viewer's page data (see qkv/plot/viewer_data.h): shapes checked, weights encoded (float16, uint8 or sparse
// uint8 maps with thumbnails), per-head statistics from the exact weights, and the JSON escaped for a <script>.
#include "qkv/plot/viewer_data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "qkv/core/error.h"

namespace qkv::plot {
namespace {

constexpr size_t kMaxF16Base64 = 8'000'000;
constexpr size_t kMaxU8Base64 = 24'000'000;
constexpr int64_t kThumb = 48;  // the largest side of a sparse map's thumbnail
constexpr float kKeepShare = 0.01f;  // a sparse map keeps the weights of at least 1 % of its maximum
constexpr int64_t kTopPerRow = 4;    // and each row's 4 largest

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

// The weights of one layer, contiguous, each checked to lie in [0, 1] (up to rounding) and clamped there.
std::vector<float> checked_weights(const VizGroup& g, const Tensor& layer) {
  const Tensor c = layer.contiguous();
  std::vector<float> w(c.data(), c.data() + c.numel());
  for (float& v : w) {
    QKV_CHECK_ARG(std::isfinite(v) && v >= -1e-6f && v <= 1.001f, "[viz] ", g.name, ": weight ", v,
                  " is not in [0, 1] (shape ", str(c.shape()), ")");
    v = std::min(1.0f, std::max(0.0f, v));
  }
  return w;
}

// Per-head statistics of one (Tq, Tk) map, means over the rows that hold any weight: entropy (nats), the largest
// weight, the mean distance Σ p·|j - diagonal| (the diagonal aligned bottom-right; a cross map's scaled to Tk), and
// the share on the first key (an attention sink).
struct MapStats {
  double entropy = 0, max = 0, dist = 0, first = 0;
};
MapStats map_stats(const float* m, int64_t tq, int64_t tk, bool cross) {
  MapStats s;
  int64_t rows = 0;
  for (int64_t i = 0; i < tq; ++i) {
    const float* row = m + i * tk;
    double sum = 0;
    for (int64_t j = 0; j < tk; ++j) sum += row[j];
    if (sum <= 0) continue;
    ++rows;
    const double diag = cross ? static_cast<double>(i) * static_cast<double>(tk - 1) / std::max<int64_t>(1, tq - 1)
                              : static_cast<double>(i + tk - tq);
    for (int64_t j = 0; j < tk; ++j) {
      const double p = row[j];
      if (p > 0) s.entropy -= p * std::log(p);
      s.max = std::max(s.max, p);
      s.dist += p * std::fabs(static_cast<double>(j) - diag);
    }
    s.first += row[0];
  }
  const double d = static_cast<double>(std::max<int64_t>(1, rows));
  s.entropy /= d;
  s.dist /= d;
  s.first /= d;
  return s;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// A (Tq, Tk) map as sparse steps, row by row: a varint count, then (count > 0) the row's maximum as a little-endian
// float16 and per kept key a varint gap (j - previous j - 1, the previous being -1 at a row's start) and a byte step
// of that maximum / 255. Kept: the weights of at least 1 % of the map's maximum (what its colour scale shows; at 1000
// tokens the rest is most of the entries) and each row's kTopPerRow largest, whose step is not 0.
std::string sparse_map(const float* m, int64_t tq, int64_t tk, float map_max) {
  std::string out;
  std::vector<std::pair<int64_t, uint8_t>> kept;
  std::vector<int64_t> order(static_cast<size_t>(tk));
  for (int64_t i = 0; i < tq; ++i) {
    const float* row = m + i * tk;
    const uint16_t half = to_half(*std::max_element(row, row + tk));
    float scale;  // the row's maximum as the page reads it back
    {
      const uint32_t e = (half >> 10) & 0x1f, f = half & 0x3ff;
      scale = e == 0 ? std::ldexp(static_cast<float>(f), -24) : std::ldexp(1.0f + f / 1024.0f, static_cast<int>(e) - 15);
    }
    const int64_t top = std::min(kTopPerRow, tk);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top, order.end(),
                      [&](int64_t a, int64_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    const float floor = std::min(row[order[static_cast<size_t>(top - 1)]], map_max * kKeepShare);
    kept.clear();
    if (scale > 0)
      for (int64_t j = 0; j < tk; ++j) {
        if (row[j] < floor || row[j] <= 0) continue;
        const long step = std::lround(255.0 * row[j] / scale);
        if (step >= 1) kept.emplace_back(j, static_cast<uint8_t>(std::min(255L, step)));
      }
    put_varint(out, kept.size());
    if (kept.empty()) continue;
    out.push_back(static_cast<char>(half & 0xff));
    out.push_back(static_cast<char>(half >> 8));
    int64_t prev = -1;
    for (const auto& [j, step] : kept) {
      put_varint(out, static_cast<uint64_t>(j - prev - 1));
      out.push_back(static_cast<char>(step));
      prev = j;
    }
  }
  return out;
}

// The thumbnail of a map: rows x cols blocks, each its largest weight in steps of scale / 255.
void thumbnail(std::string& out, const float* m, int64_t tq, int64_t tk, int64_t rows, int64_t cols, float scale) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float mx = 0;
      for (int64_t i = r * tq / rows; i < (r + 1) * tq / rows; ++i)
        for (int64_t j = c * tk / cols; j < (c + 1) * tk / cols; ++j) mx = std::max(mx, m[i * tk + j]);
      out.push_back(static_cast<char>(scale > 0 ? std::min(255L, std::lround(255.0 * mx / scale)) : 0));
    }
}

json::Value group_json(const VizGroup& g, VizDtype dtype) {
  const int64_t heads = g.layers[0].size(0), tq = g.layers[0].size(1), tk = g.layers[0].size(2), n = tq * tk;
  const int64_t trows = std::min(tq, kThumb), tcols = std::min(tk, kThumb);
  std::string bytes, thumbs;
  json::Value maps = json::Value::array(), scales = json::Value::array();
  json::Value entropy = json::Value::array(), mx = json::Value::array(), dist = json::Value::array(),
              first = json::Value::array();
  if (dtype != VizDtype::kSparse)
    bytes.reserve(static_cast<size_t>(static_cast<int64_t>(g.layers.size()) * heads * n *
                                      (dtype == VizDtype::kF16 ? 2 : 1)));
  for (const Tensor& layer : g.layers) {
    const std::vector<float> w = checked_weights(g, layer);
    for (int64_t h = 0; h < heads; ++h) {
      const float* m = w.data() + h * n;
      const MapStats s = map_stats(m, tq, tk, g.cross);
      entropy.push(s.entropy);
      mx.push(s.max);
      dist.push(s.dist);
      first.push(s.first);
      if (dtype == VizDtype::kSparse) {
        const float scale = static_cast<float>(s.max);
        scales.push(static_cast<double>(scale));
        maps.push(base64(sparse_map(m, tq, tk, scale)));
        thumbnail(thumbs, m, tq, tk, trows, tcols, scale);
        continue;
      }
      for (int64_t i = 0; i < n; ++i) {
        if (dtype == VizDtype::kF16) {
          const uint16_t half = to_half(m[i]);
          bytes.push_back(static_cast<char>(half & 0xff));
          bytes.push_back(static_cast<char>(half >> 8));
        } else {
          bytes.push_back(static_cast<char>(static_cast<uint8_t>(std::lround(m[i] * 255.0f))));
        }
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
  json::Value stats = json::Value::object();
  stats.set("entropy", std::move(entropy));
  stats.set("max", std::move(mx));
  stats.set("dist", std::move(dist));
  stats.set("first", std::move(first));
  j.set("stats", std::move(stats));
  if (dtype == VizDtype::kSparse) {
    j.set("dtype", "u8s");
    j.set("maps", std::move(maps));
    j.set("scales", std::move(scales));
    j.set("thumb_rows", trows);
    j.set("thumb_cols", tcols);
    j.set("thumbs", base64(thumbs));
  } else {
    j.set("dtype", dtype == VizDtype::kF16 ? "f16" : "u8");
    j.set("data", base64(bytes));
  }
  return j;
}

}  // namespace

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
  if (dtype == VizDtype::kAuto)
    dtype = values * 2 * 4 / 3 <= kMaxF16Base64 ? VizDtype::kF16
            : values * 4 / 3 <= kMaxU8Base64    ? VizDtype::kU8
                                                : VizDtype::kSparse;
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

}  // namespace qkv::plot
