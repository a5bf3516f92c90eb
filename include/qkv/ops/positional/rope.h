// Rotary position embedding (Su et al. 2021): rotate pairs of q/k features by pos·θ_i, θ_i = base^(-2i/D), so that
// q_m·k_n depends only on m - n. Two pairings exist in the wild; both are offered.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/core/tensor.h"

namespace qkv {

enum class RopeVariant {
  kInterleaved,  // pairs (2i, 2i+1): GPT-J, Meta LLaMA (complex view)
  kHalfSplit,    // pairs (i, i + D/2): GPT-NeoX, HF transformers (rotate_half)
};

// x: (..., T, D), D even  ->  rotated copy (..., T, D), contiguous; x may be strided.
// Row t has position offset + t. For pair (a, b) of frequency i, angle φ = pos·θ_i:
//   a' = a·cos φ - b·sin φ,   b' = a·sin φ + b·cos φ
// θ_i and φ follow the reference float32 recipe (inv_freq = 1 / base^(2i/D), φ = pos · inv_freq in float32).
// offset >= 0, base > 0 and finite.
Tensor rope_apply(const Tensor& x, int64_t offset = 0, float base = 10000.0f,
                  RopeVariant variant = RopeVariant::kHalfSplit);

// Same, with an explicit position per row: positions.size() == T, each >= 0.
Tensor rope_apply(const Tensor& x, const std::vector<int64_t>& positions, float base = 10000.0f,
                  RopeVariant variant = RopeVariant::kHalfSplit);

// The angles' cos and sin for T positions and D features (D/2 frequencies), by the recipe above. A model makes one
// per forward and rotates the queries and keys of every layer with it, as HF's rotary embedding hands its
// (cos, sin) to each layer; the two calls above make one per call.
struct RopeTable {
  int64_t rows = 0, dim = 0;    // T, D
  std::vector<float> cos, sin;  // (T, D/2), row t for position positions[t]
};
// D even and positive, base > 0 and finite, positions >= 0 (offset: positions offset .. offset + T - 1).
RopeTable rope_table(const std::vector<int64_t>& positions, int64_t dim, float base = 10000.0f);
RopeTable rope_table(int64_t offset, int64_t rows, int64_t dim, float base = 10000.0f);

// The frequency scalings of long-context checkpoints, under HF's rope_parameters names (transformers'
// modeling_rope_utils.py): "linear" (position interpolation), "llama3" (Llama 3.1's three bands), "yarn" (NTK-by-parts
// with an attention factor). Fields not used by a type are ignored, as HF ignores them.
struct RopeScaling {
  enum class Type { kDefault, kLinear, kLlama3, kYarn };
  Type type = Type::kDefault;
  float factor = 1.0f;                                      // linear, llama3, yarn
  float low_freq_factor = 1.0f, high_freq_factor = 4.0f;   // llama3
  int64_t original_max_position_embeddings = 0;            // llama3, yarn
  float beta_fast = 32.0f, beta_slow = 1.0f;               // yarn
  float attention_factor = 0.0f;  // yarn: 0 = derived as HF derives it (mscale, mscale_all_dim)
  float mscale = 0.0f, mscale_all_dim = 0.0f;              // yarn (DeepSeek-style), 0 = absent
  bool truncate = true;                                     // yarn: floor / ceil the correction range
  std::vector<float> freq_factors;  // llama.cpp's rope_freqs tensor: inv_freq[i] /= freq_factors[i] (D/2 or none)
};
// inv_freq (D/2) for base and scaling, HF's recipe per type (float32 as HF computes it), and the factor the cos
// and sin are multiplied by (yarn's attention_factor; 1 otherwise). Default scaling: inv_freq = 1 / base^(2i/D).
//   linear: inv_freq / factor
//   llama3: wavelength 2π / inv_freq above L / low_freq_factor: / factor; below L / high_freq_factor: kept; between:
//           blended by s = (L / wavelength - low) / (high - low). L = original_max_position_embeddings.
//   yarn:   1 / base^(2i/D) and 1 / (factor · base^(2i/D)) mixed by a linear ramp over the dimensions between the
//           correction range of beta_fast and beta_slow rotations in L positions (floored / ceiled when truncate).
// Errors (std::invalid_argument "[rope_inv_freq] ..."): D odd or not positive, base not finite and > 0, a factor not
// finite and > 0, high_freq_factor <= low_freq_factor, L <= 0 for llama3 / yarn, betas <= 0, negative mscales or
// attention_factor, freq_factors of a size other than D/2 or holding a value not finite and > 0.
std::vector<float> rope_inv_freq(int64_t dim, float base, const RopeScaling& scaling);
float rope_attention_factor(const RopeScaling& scaling);
// The table of a scaled rotary embedding: angle = pos · inv_freq (float32), cos and sin times
// rope_attention_factor. Default scaling gives the bits of the overloads above.
RopeTable rope_table(const std::vector<int64_t>& positions, int64_t dim, float base, const RopeScaling& scaling);
RopeTable rope_table(int64_t offset, int64_t rows, int64_t dim, float base, const RopeScaling& scaling);
// Rows first .. first + rows - 1 of a table (the queries of a model's last rows), the same values.
RopeTable rope_table_rows(const RopeTable& table, int64_t first, int64_t rows);
// x: (..., T, D) with T == table.rows, D == table.dim  ->  rotated copy, contiguous; x may be strided (the rows of a
// permuted view are read in place).
Tensor rope_apply(const Tensor& x, const RopeTable& table, RopeVariant variant = RopeVariant::kHalfSplit);
// The table rope_apply(x, offset | positions, base) rotates x with, x and the arguments checked as there (errors
// named rope_apply): for a caller that keeps the table (the autograd op, for its backward).
RopeTable rope_table_for(const Tensor& x, int64_t offset, float base);
RopeTable rope_table_for(const Tensor& x, const std::vector<int64_t>& positions, float base);

}  // namespace qkv
