// BertModel and SentenceEncoder on a tiny random BERT: the packed (padding-free) path against its padded twin,
// the HF name mapping both ways, pooling helpers, a model folder written to disk and every loading error.
// The real all-MiniLM-L6-v2 comparison with sentence-transformers lives in tests/python/test_minilm.py.
#include "qkv/models/bert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "qkv/core/safetensors.h"
#include "qkv/nn/init.h"

namespace {

namespace fs = std::filesystem;
using qkv::Rng;
using qkv::Tensor;
using qkv::models::BertConfig;
using qkv::models::BertModel;
using qkv::models::SentenceEncoder;

// |a - b| <= atol + rtol * |b|
bool close(float a, float b, float atol = 2e-5f, float rtol = 1e-4f) {
  return std::fabs(a - b) <= atol + rtol * std::fabs(b);
}

BertConfig tiny_config() {
  BertConfig c;
  c.vocab_size = 28;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 24;
  c.max_position_embeddings = 12;
  c.type_vocab_size = 2;
  return c;
}

const std::vector<std::string>& tiny_vocab() {
  static const std::vector<std::string> v = {
      "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "hello", "world", "!", ",", "'", "s",
      "cafe", "中", "a", "##a", "σ", "##α", "##σ", "the", "e", "[", "]", "mask", "x", "y"};
  return v;
}

// One sequence through BertModel::forward with output_attentions: hidden (T, E) and one (H, T, T) per layer.
struct OneSequence {
  Tensor hidden;
  std::vector<Tensor> weights;
};
OneSequence with_attentions(const BertModel& m, const std::vector<int64_t>& ids) {
  qkv::models::ForwardOptions o;
  o.output_attentions = true;
  const auto t = static_cast<int64_t>(ids.size());
  const qkv::models::BaseModelOutput out = m.forward(qkv::Ids{ids, {1, t}}, qkv::Ids(), o);
  OneSequence r{out.last_hidden_state.select(0, 0), {}};
  for (const Tensor& w : out.attentions) r.weights.push_back(w.select(0, 0));
  return r;
}

template <typename F>
void expect_throw_with(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an exception containing: " << needle;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Bert, PackedForwardMatchesPaddedTwinOnMixedLengths) {
  Rng rng(1);
  BertModel m(tiny_config(), rng);
  const std::vector<std::vector<int64_t>> seqs = {{2, 8, 9, 3}, {2, 3}, {2, 5, 6, 7, 10, 21, 16, 17, 3}, {2, 14, 3}};
  std::vector<int64_t> packed, lengths;
  int64_t t = 0;
  for (const auto& s : seqs) {
    packed.insert(packed.end(), s.begin(), s.end());
    lengths.push_back(static_cast<int64_t>(s.size()));
    t = std::max<int64_t>(t, static_cast<int64_t>(s.size()));
  }
  const Tensor fast = m.forward_packed(packed, lengths);
  ASSERT_EQ(fast.shape(), (qkv::Shape{static_cast<int64_t>(packed.size()), 16}));

  const auto b = static_cast<int64_t>(seqs.size());
  qkv::Ids ids{std::vector<int64_t>(static_cast<size_t>(b * t), 0), {b, t}};
  qkv::Ids mask{std::vector<int64_t>(static_cast<size_t>(b * t), 0), {b, t}};
  for (int64_t i = 0; i < b; ++i)
    for (size_t j = 0; j < seqs[i].size(); ++j) {
      ids.data[i * t + j] = seqs[i][j];
      mask.data[i * t + j] = 1;
    }
  const Tensor plain = m.forward(ids, mask);
  int64_t row = 0;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < lengths[i]; ++j, ++row)
      for (int64_t k = 0; k < 16; ++k)
        ASSERT_TRUE(close(fast.at({row, k}), plain.at({i, j, k}))) << "seq " << i << " token " << j << " dim " << k;
}

TEST(Bert, AttentionsComeWithTheSameHiddenStatesAsThePackedPath) {
  Rng rng(3);
  BertModel m(tiny_config(), rng);
  const std::vector<int64_t> ids = {2, 8, 9, 11, 21, 3};
  const Tensor fast = m.forward_packed(ids, {6});
  const OneSequence a = with_attentions(m, ids);
  ASSERT_EQ(a.hidden.shape(), (qkv::Shape{6, 16}));
  for (int64_t j = 0; j < 6; ++j)
    for (int64_t k = 0; k < 16; ++k) ASSERT_TRUE(close(a.hidden.at({j, k}), fast.at({j, k}))) << j << " " << k;
  ASSERT_EQ(a.weights.size(), 2u);
  for (const Tensor& w : a.weights) {
    ASSERT_EQ(w.shape(), (qkv::Shape{4, 6, 6}));
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t i = 0; i < 6; ++i) {
        double sum = 0.0;
        for (int64_t j = 0; j < 6; ++j) {
          EXPECT_GE(w.at({h, i, j}), 0.0f);
          sum += w.at({h, i, j});
        }
        EXPECT_NEAR(sum, 1.0, 1e-5) << "head " << h << " row " << i;
      }
  }
}

TEST(Bert, AttentionsOfLayerZeroAreTheSoftmaxOfItsScores) {
  // Layer 0's weights recomputed by hand from the embeddings: softmax(q k^T / sqrt(D)) per head.
  Rng rng(4);
  BertModel m(tiny_config(), rng);
  const std::vector<int64_t> ids = {2, 14, 15, 3};
  const OneSequence a = with_attentions(m, ids);
  const Tensor x = m.embeddings.forward(ids, {0, 1, 2, 3});  // (4, 16)
  const auto& sa = m.encoder.layers[0]->self_attn;
  const int64_t e = 16, h = 4, d = 4;
  for (int64_t head = 0; head < h; ++head)
    for (int64_t i = 0; i < 4; ++i) {
      std::vector<double> s(4);
      double mx = -1e300, z = 0.0;
      for (int64_t j = 0; j < 4; ++j) {
        double dot = 0.0;
        for (int64_t c = 0; c < d; ++c) {
          double q = sa.in_proj_bias.at({head * d + c}), k = sa.in_proj_bias.at({e + head * d + c});
          for (int64_t f = 0; f < e; ++f) {
            q += sa.in_proj_weight.at({head * d + c, f}) * x.at({i, f});
            k += sa.in_proj_weight.at({e + head * d + c, f}) * x.at({j, f});
          }
          dot += q * k;
        }
        s[j] = dot / std::sqrt(static_cast<double>(d));
        mx = std::max(mx, s[j]);
      }
      for (double& v : s) z += (v = std::exp(v - mx));
      for (int64_t j = 0; j < 4; ++j) EXPECT_TRUE(close(a.weights[0].at({head, i, j}), static_cast<float>(s[j] / z)));
    }
}

TEST(Bert, TokenTypesChangeTheEmbeddingsAndAreChecked) {
  Rng rng(5);
  BertModel m(tiny_config(), rng);
  const Tensor zero = m.embeddings.forward({2, 8, 3}, {0, 1, 2});
  const Tensor same = m.embeddings.forward({2, 8, 3}, {0, 1, 2}, {0, 0, 0});
  const Tensor one = m.embeddings.forward({2, 8, 3}, {0, 1, 2}, {0, 0, 1});
  for (int64_t k = 0; k < 16; ++k) {
    EXPECT_TRUE(close(same.at({2, k}), zero.at({2, k})));
    EXPECT_TRUE(close(one.at({1, k}), zero.at({1, k})));
  }
  bool differs = false;
  for (int64_t k = 0; k < 16; ++k) differs |= !close(one.at({2, k}), zero.at({2, k}));
  EXPECT_TRUE(differs);
  expect_throw_with([&] { m.embeddings.forward({2, 8, 3}, {0, 1, 2}, {0, 2, 0}); }, "token type 2 at 1");
  expect_throw_with([&] { m.embeddings.forward({2, 8, 3}, {0, 1, 2}, {0, 0}); }, "3 ids but 2 token types");
  expect_throw_with([&] { with_attentions(m, {}); }, "sequence length 0");
}

TEST(Bert, SequenceResultDoesNotDependOnItsBatchMates) {
  Rng rng(2);
  BertModel m(tiny_config(), rng);
  const Tensor alone = m.forward_packed({2, 8, 9, 3}, {4});
  const Tensor together = m.forward_packed({2, 5, 3, 2, 8, 9, 3}, {3, 4});
  for (int64_t j = 0; j < 4; ++j)
    for (int64_t k = 0; k < 16; ++k) EXPECT_TRUE(close(alone.at({j, k}), together.at({3 + j, k})));
}

TEST(Bert, NaNInQueriesPropagatesThroughThePackedPath) {
  // A NaN query makes NaN scores, which the fused kernel alone would treat as masked (output 0): the packed path
  // must route such a layer to attention(), which propagates NaN as PyTorch does.
  Rng rng(8);
  BertModel m(tiny_config(), rng);
  m.encoder.layers[0]->self_attn.in_proj_bias.data()[0] = std::nanf("");  // head 0's query, every token
  const Tensor out = m.forward_packed({2, 8, 9, 3}, {4});
  bool any_nan = false;
  for (float v : out.to_vector()) any_nan |= std::isnan(v);
  EXPECT_TRUE(any_nan);
}

// SkipInit writes nothing (the parameters are uninitialised, as PyTorch's skip_init leaves them: a large model's
// pages stay untouched until its weights are loaded); loading gives the same model.
TEST(Bert, UnderSkipInitLoadingGivesTheSameModel) {
  Rng rng_a(9), rng_b(10);
  BertModel a(tiny_config(), rng_a);
  std::unique_ptr<BertModel> skipped;
  {
    const qkv::nn::SkipInit skip;
    skipped = std::make_unique<BertModel>(tiny_config(), rng_b);
  }
  BertModel& b = *skipped;
  EXPECT_FALSE(qkv::nn::SkipInit::active());
  b.load_hf_state_dict(a.hf_state_dict());
  const Tensor fa = a.forward_packed({2, 8, 9, 3, 2, 5, 3}, {4, 3});
  const Tensor fb = b.forward_packed({2, 8, 9, 3, 2, 5, 3}, {4, 3});
  EXPECT_EQ(fa.to_vector(), fb.to_vector());
}

TEST(Bert, EmbeddingFromTableSharesItAndZeroesThePaddingRow) {
  Tensor table = Tensor::ones({5, 3});
  qkv::nn::Embedding emb(table, /*padding_idx=*/-1);
  EXPECT_EQ(emb.num_embeddings(), 5);
  EXPECT_EQ(emb.embedding_dim(), 3);
  EXPECT_EQ(*emb.padding_idx(), 4);
  EXPECT_TRUE(emb.weight.shares_storage(table));
  EXPECT_EQ(table.at({4, 1}), 0.0f);
  EXPECT_EQ(emb.forward(qkv::Ids{{1, 4}, {2}}).to_vector(), (std::vector<float>{1, 1, 1, 0, 0, 0}));
  expect_throw_with([] { qkv::nn::Embedding bad(Tensor::ones({5})); }, "[Embedding]");
  expect_throw_with([] { qkv::nn::Embedding bad(Tensor::ones({0, 3})); }, "[Embedding]");
  expect_throw_with([] { qkv::nn::Embedding bad(Tensor::ones({5, 3}), 5); }, "[Embedding]");
  expect_throw_with([] { qkv::nn::Embedding bad(Tensor{}); }, "[Embedding]");
}

TEST(Bert, HfNameMappingRoundTrips) {
  Rng rng(3);
  BertModel a(tiny_config(), rng);
  BertModel b(tiny_config(), rng);
  const auto hf = a.hf_state_dict();
  EXPECT_TRUE(hf.count("encoder.layer.1.attention.self.value.bias"));
  EXPECT_TRUE(hf.count("embeddings.LayerNorm.weight"));
  EXPECT_EQ(hf.size(), 5u + 2u * 16u);  // 5 embedding tensors, 16 per layer
  b.load_hf_state_dict(hf);
  const auto sa = a.state_dict(), sb = b.state_dict();
  for (const auto& [name, t] : sa) EXPECT_EQ(t.to_vector(), sb.at(name).to_vector()) << name;
}

TEST(Bert, BertPrefixAndExtraTensorsAreAccepted) {
  Rng rng(4);
  BertModel a(tiny_config(), rng);
  BertModel b(tiny_config(), rng);
  qkv::nn::StateDict prefixed;
  for (const auto& [name, t] : a.hf_state_dict()) prefixed["bert." + name] = t;
  prefixed["bert.pooler.dense.weight"] = Tensor::zeros({16, 16});
  b.load_hf_state_dict(prefixed);
  EXPECT_EQ(a.state_dict().at("encoder.layers.0.linear1.weight").to_vector(),
            b.state_dict().at("encoder.layers.0.linear1.weight").to_vector());
}

TEST(Bert, MissingOrMisshapenHfTensorNamesItAndChangesNothing) {
  Rng rng(5);
  BertModel a(tiny_config(), rng);
  BertModel b(tiny_config(), rng);
  const auto before = b.state_dict().at("encoder.layers.0.norm1.weight").to_vector();
  auto hf = a.hf_state_dict();
  hf.erase("encoder.layer.1.output.dense.bias");
  expect_throw_with([&] { b.load_hf_state_dict(hf); },
                    "[bert] the weights have no tensor 'encoder.layer.1.output.dense.bias'");
  hf = a.hf_state_dict();
  hf["encoder.layer.0.attention.self.query.weight"] = Tensor::zeros({16, 15});
  expect_throw_with([&] { b.load_hf_state_dict(hf); },
                    "[bert] tensor 'encoder.layer.0.attention.self.query.weight' has shape (16, 15), the config "
                    "expects (16, 16)");
  EXPECT_EQ(b.state_dict().at("encoder.layers.0.norm1.weight").to_vector(), before);
}

TEST(Bert, BadInputsThrowNamingTheOp) {
  Rng rng(6);
  BertModel m(tiny_config(), rng);
  expect_throw_with([&] { m.forward_packed({2, 3}, {3}); }, "[bert] lengths add up to 3 but 2 ids");
  expect_throw_with([&] { m.forward_packed({}, {0}); }, "[bert] sequence length 0 must be in [1, ");
  std::vector<int64_t> long_ids(13, 5);
  expect_throw_with([&] { m.forward_packed(long_ids, {13}); }, "max_position_embeddings = 12");
  expect_throw_with([&] { m.forward_packed({2, 28}, {2}); }, "[bert] token id 28 at 1 is outside [0, 28)");
  expect_throw_with([&] { m.forward({{2, 3}, {2}}, {{1, 1}, {2}}); }, "[bert] ids (2,) and attention_mask (2,)");
  BertConfig bad = tiny_config();
  bad.num_attention_heads = 5;
  expect_throw_with([&] { BertModel x(bad, rng); }, "[bert] hidden_size 16 must be divisible");
}

TEST(Bert, EmptyPackedBatchGivesZeroRows) {
  Rng rng(7);
  BertModel m(tiny_config(), rng);
  EXPECT_EQ(m.forward_packed({}, {}).shape(), (qkv::Shape{0, 16}));
}

TEST(Bert, MeanPoolAndNormalize) {
  const Tensor h = Tensor::from_vector({3, 2}, {1, 2, 3, 4, 10, 0});
  const Tensor p = qkv::models::mean_pool_packed(h, {2, 1});
  EXPECT_EQ(p.to_vector(), (std::vector<float>{2, 3, 10, 0}));
  const Tensor n = qkv::models::l2_normalize_rows(Tensor::from_vector({2, 2}, {3, 4, 0, 0}));
  EXPECT_EQ(n.to_vector(), (std::vector<float>{0.6f, 0.8f, 0, 0}));  // a zero row stays zero, not NaN
  expect_throw_with([&] { qkv::models::mean_pool_packed(h, {2, 2}); }, "[mean_pool] lengths add up to 4");
  expect_throw_with([&] { qkv::models::mean_pool_packed(h, {3, 0}); }, "[mean_pool] every length must be >= 1");
  expect_throw_with([&] { qkv::models::l2_normalize_rows(Tensor::zeros({3})); }, "[l2_normalize] x (3,)");
}

// --- a model folder on disk -------------------------------------------------------------------------------

class TinyFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("qkv_bert_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "1_Pooling");
    Rng rng(42);
    model_ = std::make_unique<BertModel>(tiny_config(), rng);
    write("config.json",
          R"({"model_type": "bert", "vocab_size": 28, "hidden_size": 16, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 24, "max_position_embeddings": 12,
              "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu", "initializer_range": 0.02,
              "architectures": ["BertModel"], "position_embedding_type": "absolute"})");
    std::string vocab;
    for (const auto& t : tiny_vocab()) vocab += t + "\n";
    write("vocab.txt", vocab);
    write("sentence_bert_config.json", R"({"max_seq_length": 8, "do_lower_case": false})");
    write("modules.json", R"([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
      {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
      {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])");
    write("1_Pooling/config.json", R"({"word_embedding_dimension": 16, "pooling_mode_mean_tokens": true,
      "pooling_mode_cls_token": false, "pooling_mode_max_tokens": false})");
    qkv::save_safetensors((dir_ / "model.safetensors").string(), model_->hf_state_dict());
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  std::string dir() const { return dir_.string(); }

  fs::path dir_;
  std::unique_ptr<BertModel> model_;
};

TEST_F(TinyFolder, EncodeEqualsPaddedForwardMeanPooledAndNormalized) {
  const SentenceEncoder enc(dir());
  EXPECT_EQ(enc.max_seq_length(), 8);
  EXPECT_EQ(enc.embedding_dim(), 16);
  EXPECT_TRUE(enc.normalizes());
  const std::vector<std::string> texts = {"hello world!", "unaffable the cafe", "x", "a a a a a a a a a a a a", ""};
  const Tensor got = enc.encode(texts, 2);
  ASSERT_EQ(got.shape(), (qkv::Shape{5, 16}));

  const auto batch = enc.tokenizer().encode_batch(texts, 8);
  const Tensor hidden = model_->forward(batch.ids, batch.attention_mask);  // (B, T, E), the plain twin
  const int64_t t = batch.ids.shape[1];
  for (int64_t i = 0; i < 5; ++i) {
    std::vector<double> mean(16, 0.0);
    for (int64_t j = 0; j < batch.lengths[i]; ++j)
      for (int64_t k = 0; k < 16; ++k) mean[k] += hidden.at({i, j, k}) / static_cast<double>(batch.lengths[i]);
    double norm = 0.0;
    for (double v : mean) norm += v * v;
    norm = std::sqrt(norm);
    for (int64_t k = 0; k < 16; ++k)
      EXPECT_TRUE(close(got.at({i, k}), static_cast<float>(mean[k] / norm))) << "text " << i << " dim " << k;
  }
  EXPECT_LE(t, 8);
}

TEST_F(TinyFolder, WithoutModulesJsonThereIsNoNormalization) {
  fs::remove(dir_ / "modules.json");
  const SentenceEncoder enc(dir());
  EXPECT_FALSE(enc.normalizes());
}

TEST_F(TinyFolder, EncodeOfNothingIsZeroRowsAndBadBatchSizeThrows) {
  const SentenceEncoder enc(dir());
  EXPECT_EQ(enc.encode({}).shape(), (qkv::Shape{0, 16}));
  expect_throw_with([&] { enc.encode({"x"}, 0); }, "[SentenceEncoder] batch_size must be >= 1, got 0");
}

TEST_F(TinyFolder, MissingFolderAndFilesAreNamed) {
  expect_throw_with([&] { SentenceEncoder e(dir() + "/nope"); }, "/nope does not exist");
  for (const char* name : {"config.json", "vocab.txt", "model.safetensors"}) {
    const fs::path keep = dir_ / (std::string(name) + ".bak");
    fs::rename(dir_ / name, keep);
    expect_throw_with([&] { SentenceEncoder e(dir()); }, std::string(" has no ") + name);
    fs::rename(keep, dir_ / name);
  }
  fs::remove(dir_ / "1_Pooling/config.json");
  expect_throw_with([&] { SentenceEncoder e(dir()); }, "1_Pooling/config.json");
}

TEST_F(TinyFolder, BrokenFilesAreNamed) {
  write("config.json", R"({"model_type": "bert", "hidden_size": 16)");
  expect_throw_with([&] { SentenceEncoder e(dir()); }, "config.json is not valid JSON");
  write("config.json", R"({"model_type": "bert", "vocab_size": 28, "hidden_size": "16"})");
  expect_throw_with([&] { SentenceEncoder e(dir()); }, "config.json: \"hidden_size\" must be a non-negative integer");
  write("config.json", R"({"model_type": "roberta"})");
  expect_throw_with([&] { SentenceEncoder e(dir()); }, "model_type \"roberta\" is not supported");
  write("config.json", R"({"vocab_size": 28, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
                           "intermediate_size": 24, "max_position_embeddings": 12, "hidden_act": "swish"})");
  expect_throw_with([&] { SentenceEncoder e(dir()); }, "hidden_act \"swish\" is not supported");
  write("config.json", R"({"vocab_size": 29, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
                           "intermediate_size": 24, "max_position_embeddings": 12})");
  expect_throw_with([&] { SentenceEncoder e(dir()); }, "vocab.txt has 28 tokens but config.json says vocab_size 29");
}

TEST_F(TinyFolder, BrokenWeightsAreNamed) {
  write("model.safetensors", "not a safetensors file");
  expect_throw_with([&] { SentenceEncoder e(dir()); }, "model.safetensors: [safetensors]");
  auto hf = model_->hf_state_dict();
  hf.erase("encoder.layer.0.attention.self.key.weight");
  qkv::save_safetensors((dir_ / "model.safetensors").string(), hf);
  expect_throw_with([&] { SentenceEncoder e(dir()); },
                    "model.safetensors: [bert] the weights have no tensor 'encoder.layer.0.attention.self.key.weight'");
}

TEST_F(TinyFolder, UnsupportedModulesAndPoolingAreRefused) {
  write("1_Pooling/config.json", R"({"pooling_mode_cls_token": true})");
  expect_throw_with([&] { SentenceEncoder e(dir()); }, "only mean pooling is supported");
  write("modules.json", R"([{"type": "sentence_transformers.models.Dense", "path": "2_Dense"}])");
  expect_throw_with([&] { SentenceEncoder e(dir()); }, "module type \"sentence_transformers.models.Dense\"");
}

}  // namespace
