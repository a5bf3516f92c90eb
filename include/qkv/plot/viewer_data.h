// The viewer's page data (the JSON of docs/VIEWER.md that web/viewer.html reads): attention maps as base64 float16,
// uint8, or sparse uint8 maps with thumbnails and per-head statistics for long inputs. Written here once, for
// `qkv viz`, `qkv serve` and qkv.viz alike.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qkv/core/json.h"
#include "qkv/core/tensor.h"

namespace qkv::plot {

// One set of maps drawn together: L layers x H heads of (Tq, Tk) weights; rows are queries.
struct VizGroup {
  std::string name;                   // "encoder self-attention", "cross-attention", ...
  bool cross = false;                 // true: Seq2Seq alignment (keys = source on x, queries = target on y)
  bool causal = false;                // shade the masked upper triangle (aligned bottom-right)
  std::vector<std::string> q_tokens;  // (Tq)
  std::vector<std::string> k_tokens;  // (Tk)
  std::vector<Tensor> layers;         // L x (H, Tq, Tk), values in [0, 1]
};

// The same groups at one moment (one checkpoint); a page with several snapshots gets a slider.
struct VizSnapshot {
  std::string label;
  std::vector<VizGroup> groups;
};

// kAuto: float16 while its base64 stays under 8 MB, else uint8 while under 24 MB, else sparse.
// kSparse ("u8s"): each map apart (decoded only when the page shows it), each weight in steps of 1/255 of its row's
// maximum, the weights under 1 % of the map's maximum left out unless among their row's 4 largest; with a thumbnail
// of every map (its maximum over blocks relative to the map's maximum, at most 48 x 48).
enum class VizDtype { kAuto, kF16, kU8, kSparse };

// The page data; every group also carries its per-head statistics computed from the exact weights (stats:
// entropy, max, dist, first, each L·H values, as the page's head table shows them). Throws std::invalid_argument
// "[viz] ..." on inconsistent shapes, NaN or weights outside [0, 1].
json::Value viz_data(const std::vector<VizSnapshot>& snapshots, const std::string& title,
                     VizDtype dtype = VizDtype::kAuto);

// `data` as the text of the page's <script type="application/json"> element: every '<', '>', '&', U+2028 and U+2029
// is written as its \u escape (the same JSON), so no string in it can end the element or open an HTML comment.
std::string script_json(const json::Value& data);

// IEEE half precision of x, rounded to nearest even (the page's float16).
uint16_t to_half(float x);
std::string base64(const std::string& bytes);

}  // namespace qkv::plot
