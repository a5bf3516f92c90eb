// Round trip of module weights through safetensors, and the errors a wrong file gives; the one JSON reader/writer
// (qkv/core/json.h) that reads every JSON file of qkv: round trips and what it rejects.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "qkv/core/json.h"
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

namespace qkv::json {
namespace {

TEST(Json, EscapesStringsAndWritesNonFiniteAsNull) {
  Value j = Value::object();
  j.set("s", "a\"b\\c\n\x01");
  j.set("n", NAN);
  j.set("i", int64_t{12345678901234});
  j.set("f", 0.125);
  j.set("v", std::vector<double>{1, 2.5});
  EXPECT_EQ(j.dump(0), "{\"s\": \"a\\\"b\\\\c\\n\\u0001\", \"n\": null, \"i\": 12345678901234, \"f\": 0.125, "
                       "\"v\": [1, 2.5]}");
}

TEST(Json, SetReplacesInPlaceAndTypeMisuseThrows) {
  Value j;
  j.set("a", 1).set("b", 2).set("a", 3);
  EXPECT_EQ(j.dump(0), "{\"a\": 3, \"b\": 2}");
  EXPECT_TRUE(j.contains("b"));
  EXPECT_THROW(j.push(1), std::invalid_argument);
  try {
    j.at("zz");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[json] no member 'zz'"), std::string::npos);
  }
}

TEST(Json, ParseReadsBackWhatDumpWroteKeepingMemberOrder) {
  Value doc = Value::object();
  doc.set("zeta", "caf\xc3\xa9 \xe4\xb8\xad \t/\"");
  doc.set("alpha", Value::array().push(int64_t{-9007199254740993}).push(0.5).push(true).push(Value()));
  doc.set("nested", Value::object().set("k", std::vector<std::string>{"x", ""}).set("empty", Value::object()));
  const std::string text = doc.dump(2);
  const Value back = Value::parse(text, "[t] doc.json");
  EXPECT_EQ(back.dump(2), text);
  ASSERT_EQ(back.members().size(), 3u);
  EXPECT_EQ(back.members()[0].first, "zeta");
  EXPECT_EQ(back.at("zeta").as_string(), "caf\xc3\xa9 \xe4\xb8\xad \t/\"");
  const Value& a = back.at("alpha");
  EXPECT_TRUE(a.items()[0].is_integer());
  EXPECT_EQ(a.items()[0].as_integer(), int64_t{-9007199254740993});  // not rounded through a double
  EXPECT_FALSE(a.items()[1].is_integer());
  EXPECT_EQ(a.items()[1].as_number(), 0.5);
  EXPECT_TRUE(a.items()[2].as_bool());
  EXPECT_TRUE(a.items()[3].is_null());
  // Escapes and surrogate pairs decode to UTF-8; an integer past int64 becomes a double.
  const Value e = Value::parse(" {\"s\": \"\\u00e9\\ud83d\\ude00\\/\", \"big\": 18446744073709551616} ", "[t] e.json");
  EXPECT_EQ(e.at("s").as_string(), "\xc3\xa9\xf0\x9f\x98\x80/");
  EXPECT_FALSE(e.at("big").is_integer());
  EXPECT_EQ(e.at("big").as_number(), 18446744073709551616.0);
}

TEST(Json, ParseRejectsWhatRfc8259RejectsNamingTheFileAndByte) {
  const std::string deep = std::string(65, '[') + "1" + std::string(65, ']');
  const std::pair<const char*, std::string> cases[] = {
      {"duplicate key \"a\"", "{\"a\": 1, \"a\": 2}"},
      {"trailing comma", "[1, 2,]"},
      {"trailing comma", "{\"a\": 1,}"},
      {"unexpected character", "NaN"},
      {"leading zero", "012"},
      {"not valid UTF-8", "\"\xc3\x28\""},
      {"nesting deeper than 64", deep},
      {"after the document", "{} {}"},
      {"lone low surrogate", "\"\\udc00\""},
      {"control character", "\"a\nb\""},
      {"out of range", "1e400"},
      {"unexpected end", ""},
      {"invalid literal", "tru"},
  };
  for (const auto& [what, text] : cases) {
    try {
      (void)Value::parse(text, "[t] bad.json");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind("[t] bad.json: ", 0), 0u) << m;
      EXPECT_NE(m.find(what), std::string::npos) << m;
      EXPECT_NE(m.find("(at byte "), std::string::npos) << m;
    }
  }
  // 64 levels are fine.
  EXPECT_NO_THROW(Value::parse(std::string(64, '[') + std::string(64, ']'), "[t] ok.json"));
}

}  // namespace
}  // namespace qkv::json
