// Round trip of module weights through safetensors, and the errors a wrong file gives.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "qkv/core/rng.h"
#include "qkv/core/safetensors.h"
#include "qkv/nn/multihead_attention.h"
#include "qkv/nn/serialize.h"
#include "qkv/nn/transformer.h"

namespace qkv::nn {
namespace {

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / name).string();
}

TEST(Serialize, EncoderLayerRoundTripsBitExactly) {
  Rng rng(1), rng2(2);
  TransformerLayerConfig cfg;
  cfg.d_model = 16;
  cfg.nhead = 4;
  cfg.dim_feedforward = 32;
  TransformerEncoderLayer a(cfg, rng), b(cfg, rng2);
  const std::string path = temp_path("qkv_serialize_enc.safetensors");
  save_state_dict(a, path, {{"kind", "encoder"}});
  load_state_dict(b, path);
  const StateDict sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [name, t] : sa) EXPECT_EQ(t.to_vector(), sb.at(name).to_vector()) << name;
  std::filesystem::remove(path);
}

TEST(Serialize, WrongModuleNamesTheMissingParameters) {
  Rng rng(3);
  MultiheadAttention mha(8, 2, rng);
  TransformerLayerConfig cfg;
  cfg.d_model = 8;
  cfg.nhead = 2;
  cfg.dim_feedforward = 16;
  TransformerEncoderLayer layer(cfg, rng);
  const std::string path = temp_path("qkv_serialize_mha.safetensors");
  save_state_dict(mha, path);
  try {
    load_state_dict(layer, path);
    FAIL() << "expected a throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("linear1.weight"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(Serialize, LoadingAFileWithNonFiniteWeightsIsRefusedNamingTheTensor) {
  Rng rng(5);
  MultiheadAttention a(8, 2, rng), b(8, 2, rng);
  const StateDict before = b.state_dict();
  const std::string path = temp_path("qkv_serialize_nan.safetensors");
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    StateDict s = a.state_dict();
    s.at("out_proj.weight").data()[5] = bad;
    save_safetensors(path, s);
    try {
      load_state_dict(b, path);
      FAIL() << "expected a throw for " << bad;
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind("[load_state_dict] " + path + ": out_proj.weight holds a non-finite value", 0), 0u) << m;
      EXPECT_NE(m.find("flat index 5"), std::string::npos) << m;
    }
    // Nothing changed: all or nothing.
    const StateDict after = b.state_dict();
    for (const auto& [name, t] : before) EXPECT_EQ(t.to_vector(), after.at(name).to_vector()) << name;
  }
  std::filesystem::remove(path);
}

TEST(Serialize, CheckFiniteAcceptsFiniteAndNamesTheFirstBadTensor) {
  StateDict s = {{"a", Tensor::from_vector({2}, {1.0f, -2.0f})}, {"b", Tensor::from_vector({2}, {0.0f, std::nanf("")})}};
  EXPECT_NO_THROW(check_finite({{"a", s.at("a")}}, "[x] "));
  try {
    check_finite(s, "[ckpt] file: ");
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[ckpt] file: b holds a non-finite value", 0), 0u) << e.what();
  }
}

TEST(Serialize, MissingFileIsAnIoError) {
  Rng rng(4);
  MultiheadAttention mha(8, 2, rng);
  EXPECT_THROW(load_state_dict(mha, "/nonexistent/qkv.safetensors"), std::system_error);
}

}  // namespace
}  // namespace qkv::nn
