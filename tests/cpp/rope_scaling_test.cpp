// The rotary scalings (linear, llama3, yarn, llama.cpp's frequency factors): rope_inv_freq against transformers'
// recipes restated here in float64, the default scaling bit for bit the unscaled table, yarn's attention factor in
// the table, every refusal; and config.json's rope keys and Qwen 2's switches as LlamaConfig reads them.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <string>
#include <vector>

#include "ops_testing.h"
#include "qkv/models/llama.h"
#include "qkv/ops/positional/rope.h"

namespace qkv {
namespace {

using testing::ThrowsArg;
using Type = RopeScaling::Type;

// float32 frequencies against the float64 formula: a few float32 roundings apart.
constexpr double kFreqRtol = 1e-5;

::testing::AssertionResult FreqsNear(const std::vector<float>& got, const std::vector<double>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " frequencies, want " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::fabs(got[i] - want[i]) > kFreqRtol * std::fabs(want[i]))
      return ::testing::AssertionFailure() << "inv_freq[" << i << "] = " << got[i] << ", want " << want[i];
  return ::testing::AssertionSuccess();
}

// HF's default: 1 / base^(2i/D).
std::vector<double> plain(int64_t dim, double base) {
  std::vector<double> f(static_cast<size_t>(dim / 2));
  for (size_t i = 0; i < f.size(); ++i) f[i] = 1.0 / std::pow(base, 2.0 * static_cast<double>(i) / dim);
  return f;
}

// _compute_llama3_parameters.
std::vector<double> llama3(int64_t dim, double base, double factor, double low, double high, double len) {
  std::vector<double> f = plain(dim, base);
  for (double& x : f) {
    const double wavelen = 2 * std::numbers::pi / x;
    if (wavelen < len / high) continue;
    if (wavelen > len / low) {
      x /= factor;
      continue;
    }
    const double smooth = (len / wavelen - low) / (high - low);
    x = (1 - smooth) * x / factor + smooth * x;
  }
  return f;
}

// _compute_yarn_parameters.
std::vector<double> yarn(int64_t dim, double base, double factor, double len, double beta_fast, double beta_slow,
                         bool truncate) {
  const auto correction = [&](double rotations) {
    return dim * std::log(len / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
  };
  double lo = correction(beta_fast), hi = correction(beta_slow);
  if (truncate) lo = std::floor(lo), hi = std::ceil(hi);
  lo = std::max(lo, 0.0);
  hi = std::min(hi, static_cast<double>(dim - 1));
  if (lo == hi) hi += 0.001;
  std::vector<double> f = plain(dim, base);
  for (size_t i = 0; i < f.size(); ++i) {
    const double keep = 1 - std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
    f[i] = f[i] / factor * (1 - keep) + f[i] * keep;
  }
  return f;
}

TEST(RopeScaling, DefaultScalingIsTheUnscaledTableBitForBit) {
  // The recipe the table had before scalings existed, restated: float32 inv_freq and angle, cos / sin in double.
  const std::vector<int64_t> positions{0, 1, 7, 300, 4095, 131071};
  for (const int64_t dim : {2, 6, 64, 128})
    for (const float base : {10000.0f, 500000.0f, 1e6f, 12345.0f}) {
      const RopeTable t = rope_table(positions, dim, base, RopeScaling{});
      const RopeTable old = rope_table(positions, dim, base);
      EXPECT_EQ(t.cos, old.cos);
      EXPECT_EQ(t.sin, old.sin);
      const std::vector<float> inv = rope_inv_freq(dim, base, RopeScaling{});
      for (int64_t i = 0; i < dim / 2; ++i) {
        const float f = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
        ASSERT_EQ(inv[static_cast<size_t>(i)], f) << dim << " " << base << " " << i;
        for (size_t r = 0; r < positions.size(); ++r) {
          const float angle = static_cast<float>(positions[r]) * f;
          const size_t at = r * static_cast<size_t>(dim / 2) + static_cast<size_t>(i);
          ASSERT_EQ(t.cos[at], static_cast<float>(std::cos(static_cast<double>(angle))));
          ASSERT_EQ(t.sin[at], static_cast<float>(std::sin(static_cast<double>(angle))));
        }
      }
      EXPECT_EQ(rope_table(5, 3, dim, base, RopeScaling{}).cos, rope_table(5, 3, dim, base).cos);
    }
  EXPECT_EQ(rope_attention_factor(RopeScaling{}), 1.0f);
}

TEST(RopeScaling, LinearDividesEveryFrequency) {
  RopeScaling s;
  s.type = Type::kLinear;
  for (const float factor : {2.0f, 3.3f, 0.5f}) {
    s.factor = factor;
    std::vector<double> want = plain(16, 10000.0);
    for (double& x : want) x /= factor;
    EXPECT_TRUE(FreqsNear(rope_inv_freq(16, 10000.0f, s), want));
    EXPECT_EQ(rope_attention_factor(s), 1.0f);
  }
}

TEST(RopeScaling, Llama3KeepsHighScalesLowAndBlendsTheMiddleBand) {
  // D = 16, base 10000, L = 64: wavelengths 6.3 (below L/4 = 16: kept), 19.9 and 62.8 (between 16 and 64:
  // blended), 199 and longer (above 64: divided by the factor); every band is hit.
  RopeScaling s;
  s.type = Type::kLlama3;
  s.factor = 8.0f;
  s.low_freq_factor = 1.0f;
  s.high_freq_factor = 4.0f;
  s.original_max_position_embeddings = 64;
  const std::vector<float> got = rope_inv_freq(16, 10000.0f, s);
  EXPECT_TRUE(FreqsNear(got, llama3(16, 10000.0, 8.0, 1.0, 4.0, 64.0)));
  const std::vector<double> base = plain(16, 10000.0);
  EXPECT_EQ(got[0], rope_inv_freq(16, 10000.0f, RopeScaling{})[0]);  // high band: untouched
  EXPECT_LT(got[1], base[1]);
  EXPECT_GT(got[1], base[1] / 8.0);
  EXPECT_NEAR(got[7], base[7] / 8.0, kFreqRtol * base[7]);
  // Llama 3.1's own numbers: D = 128, base 500000, factor 8, L = 8192.
  s.original_max_position_embeddings = 8192;
  EXPECT_TRUE(FreqsNear(rope_inv_freq(128, 500000.0f, s), llama3(128, 500000.0, 8.0, 1.0, 4.0, 8192.0)));
  s.low_freq_factor = 0.5f;
  s.high_freq_factor = 3.0f;
  s.factor = 4.0f;
  s.original_max_position_embeddings = 100;
  EXPECT_TRUE(FreqsNear(rope_inv_freq(64, 10000.0f, s), llama3(64, 10000.0, 4.0, 0.5, 3.0, 100.0)));
  EXPECT_EQ(rope_attention_factor(s), 1.0f);
}

TEST(RopeScaling, YarnRampsBetweenExtrapolationAndInterpolation) {
  RopeScaling s;
  s.type = Type::kYarn;
  s.factor = 4.0f;
  s.original_max_position_embeddings = 64;
  // D = 16, base 10000, L = 64: correction range [-0.99, 2.02] -> [0, 3] truncated; i = 0 extrapolates, i >= 3
  // interpolates (/ factor), 1 and 2 mix.
  const std::vector<float> got = rope_inv_freq(16, 10000.0f, s);
  EXPECT_TRUE(FreqsNear(got, yarn(16, 10000.0, 4.0, 64.0, 32.0, 1.0, true)));
  const std::vector<double> base = plain(16, 10000.0);
  EXPECT_NEAR(got[0], base[0], kFreqRtol);
  EXPECT_NEAR(got[5], base[5] / 4.0, kFreqRtol * base[5]);
  s.truncate = false;  // the range [0, 2.02] as it is
  EXPECT_TRUE(FreqsNear(rope_inv_freq(16, 10000.0f, s), yarn(16, 10000.0, 4.0, 64.0, 32.0, 1.0, false)));
  s.truncate = true;
  s.beta_fast = 16.0f;
  s.beta_slow = 2.0f;
  s.original_max_position_embeddings = 32768;
  s.factor = 40.0f;
  EXPECT_TRUE(FreqsNear(rope_inv_freq(128, 1e6f, s), yarn(128, 1e6, 40.0, 32768.0, 16.0, 2.0, true)));
  // A zero-width range (low == high) takes HF's 0.001 guard: a step, no division by zero.
  s.beta_fast = s.beta_slow = 4.0f;
  s.original_max_position_embeddings = 4096;
  EXPECT_TRUE(FreqsNear(rope_inv_freq(64, 10000.0f, s), yarn(64, 10000.0, 40.0, 4096.0, 4.0, 4.0, true)));
}

TEST(RopeScaling, YarnAttentionFactorScalesTheCosAndSin) {
  RopeScaling s;
  s.type = Type::kYarn;
  s.factor = 4.0f;
  s.original_max_position_embeddings = 64;
  EXPECT_EQ(rope_attention_factor(s), static_cast<float>(0.1 * std::log(4.0) + 1.0));  // HF's get_mscale
  s.factor = 40.0f;
  s.mscale = 0.707f;
  s.mscale_all_dim = 1.0f;  // DeepSeek's ratio
  const double m = 0.1 * static_cast<double>(0.707f) * std::log(40.0) + 1.0, all = 0.1 * std::log(40.0) + 1.0;
  EXPECT_EQ(rope_attention_factor(s), static_cast<float>(m / all));
  s.mscale_all_dim = 0.0f;  // one of them absent: factor alone
  EXPECT_EQ(rope_attention_factor(s), static_cast<float>(all));
  s.attention_factor = 1.25f;  // given: used as it is
  EXPECT_EQ(rope_attention_factor(s), 1.25f);
  s.attention_factor = 0.0f;
  s.factor = 0.5f;  // factor <= 1: 1
  EXPECT_EQ(rope_attention_factor(s), 1.0f);

  s.factor = 4.0f;
  const float gain = rope_attention_factor(s);
  const std::vector<float> inv = rope_inv_freq(16, 10000.0f, s);
  const RopeTable t = rope_table(3, 2, 16, 10000.0f, s);
  for (int64_t r = 0; r < 2; ++r)
    for (size_t i = 0; i < 8; ++i) {
      const double angle = static_cast<double>(static_cast<float>(3 + r) * inv[i]);
      EXPECT_EQ(t.cos[static_cast<size_t>(r) * 8 + i], static_cast<float>(std::cos(angle)) * gain);
      EXPECT_EQ(t.sin[static_cast<size_t>(r) * 8 + i], static_cast<float>(std::sin(angle)) * gain);
    }
  EXPECT_EQ(t.cos, rope_table(std::vector<int64_t>{3, 4}, 16, 10000.0f, s).cos);
}

TEST(RopeScaling, FreqFactorsDivideAfterTheType) {
  RopeScaling s;
  s.freq_factors = {1.0f, 2.0f, 4.0f, 8.0f};
  std::vector<double> want = plain(8, 500000.0);
  for (size_t i = 0; i < want.size(); ++i) want[i] /= s.freq_factors[i];
  EXPECT_TRUE(FreqsNear(rope_inv_freq(8, 500000.0f, s), want));
  s.type = Type::kLinear;
  s.factor = 2.0f;
  for (double& x : want) x /= 2.0;
  EXPECT_TRUE(FreqsNear(rope_inv_freq(8, 500000.0f, s), want));
}

TEST(RopeScaling, BadScalingsAreRefusedNamingTheField) {
  const auto refuses = [](const RopeScaling& s, const std::string& needle, int64_t dim = 8) {
    return ThrowsArg([&] { rope_inv_freq(dim, 10000.0f, s); }, needle);
  };
  RopeScaling s;
  EXPECT_TRUE(refuses(s, "[rope_inv_freq] D must be even", 7));
  EXPECT_TRUE(ThrowsArg([&] { rope_inv_freq(8, -1.0f, s); }, "base must be finite"));
  s.type = Type::kLinear;
  s.factor = 0.0f;
  EXPECT_TRUE(refuses(s, "factor must be finite and > 0, got 0"));
  s.factor = NAN;
  EXPECT_TRUE(refuses(s, "factor"));
  s = RopeScaling{};
  s.type = Type::kLlama3;
  s.factor = 8.0f;
  s.original_max_position_embeddings = 64;
  s.low_freq_factor = 4.0f;
  s.high_freq_factor = 4.0f;
  EXPECT_TRUE(refuses(s, "0 < low_freq_factor < high_freq_factor"));
  s.low_freq_factor = 1.0f;
  s.original_max_position_embeddings = 0;
  EXPECT_TRUE(refuses(s, "original_max_position_embeddings must be > 0, got 0"));
  s = RopeScaling{};
  s.type = Type::kYarn;
  s.factor = 4.0f;
  s.original_max_position_embeddings = 64;
  s.beta_slow = 0.0f;
  EXPECT_TRUE(refuses(s, "beta_fast and beta_slow"));
  s.beta_slow = 1.0f;
  s.mscale = -1.0f;
  EXPECT_TRUE(refuses(s, "mscale"));
  s.mscale = 0.0f;
  s.attention_factor = INFINITY;
  EXPECT_TRUE(refuses(s, "attention_factor"));
  s = RopeScaling{};
  s.freq_factors = {1.0f, 2.0f, 3.0f};
  EXPECT_TRUE(refuses(s, "3 freq_factors for D = 8 (need D/2 = 4)"));
  s.freq_factors = {1.0f, 2.0f, 0.0f, 1.0f};
  EXPECT_TRUE(refuses(s, "freq_factors[2] must be finite and > 0"));
  // The table names itself.
  EXPECT_TRUE(ThrowsArg([&] { rope_table(0, 2, 8, 10000.0f, s); }, "[rope_table] freq_factors[2]"));
}

// --- config.json -------------------------------------------------------------------------------------------------

class RopeConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) / ("qkv_rope_config_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // A tiny Llama-shaped config with `extra` members appended.
  models::LlamaConfig read(const std::string& extra, const std::string& model_type = "llama") {
    const std::string path = (dir_ / "config.json").string();
    std::ofstream(path) << R"({"model_type": ")" << model_type
                        << R"(", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128)"
                        << (extra.empty() ? "" : ", ") << extra << "}";
    return models::LlamaConfig::from_json_file(path);
  }
  // The message of the std::runtime_error reading `extra` throws ("" when it reads).
  std::string refusal(const std::string& extra, const std::string& model_type = "llama") {
    try {
      read(extra, model_type);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  }
  std::filesystem::path dir_;
};

TEST_F(RopeConfig, RopeParametersOfEachType) {
  models::LlamaConfig c = read(R"("rope_parameters": {"rope_type": "default", "rope_theta": 500000.0})");
  EXPECT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.rope_scaling.type, Type::kDefault);
  c = read(R"("rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})");
  EXPECT_EQ(c.rope_scaling.type, Type::kLinear);
  EXPECT_EQ(c.rope_scaling.factor, 2.0f);
  c = read(R"("rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16})");
  EXPECT_EQ(c.rope_scaling.type, Type::kLlama3);
  EXPECT_EQ(c.rope_scaling.factor, 8.0f);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 16);
  c = read(R"("rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
              "beta_fast": null, "beta_slow": 0, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": false,
              "attention_factor": 1.5})");
  EXPECT_EQ(c.rope_theta, 10000.0f);  // none given: HF's default
  EXPECT_EQ(c.rope_scaling.type, Type::kYarn);
  EXPECT_EQ(c.rope_scaling.beta_fast, 32.0f);  // null or 0: HF's `or 32`, `or 1`
  EXPECT_EQ(c.rope_scaling.beta_slow, 1.0f);
  EXPECT_EQ(c.rope_scaling.mscale, 0.707f);
  EXPECT_EQ(c.rope_scaling.mscale_all_dim, 1.0f);
  EXPECT_FALSE(c.rope_scaling.truncate);
  EXPECT_EQ(c.rope_scaling.attention_factor, 1.5f);
  // yarn's factor null: max_position_embeddings / original; original absent: max_position_embeddings.
  c = read(R"("rope_parameters": {"rope_type": "yarn", "factor": null, "original_max_position_embeddings": 32})");
  EXPECT_EQ(c.rope_scaling.factor, 4.0f);
  c = read(R"("rope_parameters": {"rope_type": "yarn", "factor": 2.0})");
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 128);
  // A top-level original_max_position_embeddings wins (HF's Phi-3 rule).
  c = read(R"("original_max_position_embeddings": 64, "rope_parameters": {"rope_type": "llama3", "factor": 8.0,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16})");
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 64);
}

TEST_F(RopeConfig, OlderRopeScalingWithTopLevelTheta) {
  models::LlamaConfig c = read(R"("rope_theta": 5000.0, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": 32})");
  EXPECT_EQ(c.rope_theta, 5000.0f);
  EXPECT_EQ(c.rope_scaling.type, Type::kYarn);
  EXPECT_EQ(c.rope_scaling.factor, 4.0f);
  c = read(R"("rope_theta": 5000.0, "rope_scaling": {"rope_type": "linear", "factor": 3.0})");
  EXPECT_EQ(c.rope_scaling.type, Type::kLinear);
  EXPECT_EQ(c.rope_scaling.factor, 3.0f);
  c = read(R"("rope_theta": 5000.0, "rope_scaling": null)");
  EXPECT_EQ(c.rope_theta, 5000.0f);
  EXPECT_EQ(c.rope_scaling.type, Type::kDefault);
}

TEST_F(RopeConfig, UnsupportedRopeIsOneLineNamingTheKey) {
  EXPECT_NE(refusal(R"("rope_parameters": {"rope_type": "dynamic", "factor": 2.0})")
                .find(R"(rope_parameters.rope_type "dynamic" is not supported (default, linear, llama3, yarn))"),
            std::string::npos);
  EXPECT_NE(refusal(R"("rope_scaling": {"type": "longrope", "short_factor": [1]})").find("short_factor"),
            std::string::npos);
  EXPECT_NE(refusal(R"("rope_scaling": {"type": "longrope"})").find(R"(rope_scaling.rope_type "longrope")"),
            std::string::npos);
  EXPECT_NE(refusal(R"("rope_parameters": {"rope_type": "linear"})")
                .find(R"(rope_parameters.factor is required for rope_type "linear")"),
            std::string::npos);
  EXPECT_NE(refusal(R"("rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0})")
                .find("rope_parameters.high_freq_factor is required"),
            std::string::npos);
  EXPECT_NE(refusal(R"("rope_parameters": {"rope_type": "yarn", "original_max_position_embeddings": 32})")
                .find("rope_parameters.factor is required"),
            std::string::npos);
  EXPECT_NE(refusal(R"("rope_parameters": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 0})")
                .find("attention_factor must be > 0"),
            std::string::npos);
  EXPECT_NE(refusal(R"("rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5})")
                .find("partial_rotary_factor"),
            std::string::npos);
  EXPECT_NE(refusal(R"("rope_parameters": {"rope_type": "linear", "factor": -2.0})")
                .find("[llama] rope scaling: [rope_inv_freq] factor must be finite and > 0"),
            std::string::npos);
  EXPECT_NE(refusal(R"("rope_parameters": 3)").find("must be an object"), std::string::npos);
  const std::string one = refusal(R"("rope_parameters": {"rope_type": "dynamic"})");
  EXPECT_EQ(one.find('\n'), std::string::npos);
  EXPECT_EQ(one.rfind("[llama] ", 0), 0u);
}

TEST_F(RopeConfig, Qwen2BiasesAndWindowFollowQwen2Config) {
  models::LlamaConfig c = read(R"("attention_bias": true, "mlp_bias": true)", "qwen2");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.attention_bias);  // Qwen2Attention: q/k/v with a bias, o_proj without, whatever the config says
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.layer_sliding, std::vector<bool>(3, false));
  // use_sliding_window: the window on layers >= max_window_layers (absent: 4096).
  c = read(R"("use_sliding_window": true, "sliding_window": 5, "max_window_layers": 1)", "qwen2");
  EXPECT_EQ(c.sliding_window, 5);
  EXPECT_EQ(c.layer_sliding, (std::vector<bool>{false, true, true}));
  c = read(R"("use_sliding_window": true, "max_window_layers": 2)", "qwen2");
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.layer_sliding, (std::vector<bool>{false, false, true}));
  c = read(R"("use_sliding_window": true, "sliding_window": null, "max_window_layers": 0)", "qwen2");
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.layer_sliding, std::vector<bool>(3, false));
  // layer_types, when written, decide.
  c = read(R"("use_sliding_window": true, "sliding_window": 5,
              "layer_types": ["sliding_attention", "full_attention", "sliding_attention"])",
           "qwen2");
  EXPECT_EQ(c.layer_sliding, (std::vector<bool>{true, false, true}));
  c = read(R"("use_sliding_window": false, "sliding_window": 5, "max_window_layers": 0)", "qwen2");
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.layer_sliding, std::vector<bool>(3, false));
  c = read(R"("tie_word_embeddings": true)", "qwen2");
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_NE(refusal(R"("layer_types": ["full_attention"])", "qwen2").find("one type per layer"), std::string::npos);
  EXPECT_NE(refusal("", "qwen3").find("(llama, mistral, qwen2, gemma2)"), std::string::npos);
}

TEST_F(RopeConfig, QkvBiasGivesQKVBiasesAndNoOutputBias) {
  models::LlamaConfig c = read("", "qwen2");
  Rng rng(3);
  const models::LlamaAttention attn(c, 0, rng);
  EXPECT_TRUE(attn.q_proj.bias.defined());
  EXPECT_TRUE(attn.k_proj.bias.defined());
  EXPECT_TRUE(attn.v_proj.bias.defined());
  EXPECT_FALSE(attn.o_proj.bias.defined());
}

}  // namespace
}  // namespace qkv
