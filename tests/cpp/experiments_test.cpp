// Tests of the experiment framework's own pieces (not of any scientific result): tables, the
// registry, and the Tagger encoder's input checks, permutation equivariance without positions, parameter names and
// the gradients of its position tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "../../src/experiments/tagger.h"
#include "qkv/experiments/experiment.h"

namespace qkv::experiments {
namespace {

TEST(Table, TextAlignsColumnsAndMarkdownHasOneRowPerLine) {
  Table t;
  t.header = {"a", "long header"};
  t.rows = {{"x", "1"}, {"yyyy", "22"}};
  EXPECT_EQ(t.text(), "a     long header\n-----------------\nx     1\nyyyy  22\n");
  EXPECT_EQ(t.markdown(), "| a | long header |\n|---|--:|\n| x | 1 |\n| yyyy | 22 |\n");
}

TEST(Registry, NamesEveryClaimAndRejectsUnknownNames) {
  std::vector<std::string> names;
  for (const auto& e : registry()) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"bottleneck", "parallelism", "alignment", "scaling", "heads",
                                             "permutation", "positional", "components", "translation"}));
  try {
    find_experiment("nope");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[experiment] unknown experiment 'nope' (choose bottleneck"),
              std::string::npos);
  }
  Options o;
  EXPECT_THROW(run_experiment("parallelism", o), std::invalid_argument);  // no output directory
}

TEST(Tagger, WithoutPositionsShufflingTheInputShufflesTheOutput) {
  TaggerConfig c;
  c.vocab_in = c.vocab_out = 12;
  c.pos = PosKind::kNone;
  Rng rng(1);
  Tagger m(c, rng);
  const Ids a{{4, 5, 6, 7, 8}, {1, 5}}, b{{8, 4, 6, 5, 7}, {1, 5}};  // b[t] = a[perm[t]], perm = 4 0 2 1 3
  const Tensor ya = tagger_logits(m, a), yb = tagger_logits(m, b);
  const int64_t perm[5] = {4, 0, 2, 1, 3};
  double dev = 0, scale = 0;
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t v = 0; v < 12; ++v) {
      dev = std::max(dev, std::fabs(double(yb.at({0, t, v})) - ya.at({0, perm[t], v})));
      scale = std::max(scale, std::fabs(double(ya.at({0, t, v}))));
    }
  EXPECT_LT(dev, 1e-5 * scale);
}

TEST(Tagger, BadConfigAndInputsThrow) {
  TaggerConfig c;
  c.vocab_in = c.vocab_out = 12;
  c.heads = 3;  // 64 is not divisible by 3
  Rng rng(1);
  EXPECT_THROW(Tagger(c, rng), std::invalid_argument);
  c.heads = 4;
  c.pos = PosKind::kLearned;
  c.max_len = 4;
  Tagger m(c, rng);
  try {
    tagger_logits(m, Ids{{4, 5, 6, 7, 8}, {1, 5}});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[Tagger] length 5 exceeds"), std::string::npos);
  }
  TaggerRun run;
  run.head_mask = {1.0f};
  EXPECT_THROW(tagger_logits(m, Ids{{4, 5}, {1, 2}}, run), std::invalid_argument);
}

// The names saved state dicts carry (keyed by name, so the order does not matter): embeddings, per layer the
// attention, feed-forward, LayerNorm and Shaw tables, the final LayerNorm of pre-LN, the output projection.
TEST(Tagger, ParameterNamesAndShapesAreTheSavedOnes) {
  struct Case {
    PosKind pos;
    NormKind norm;
    std::vector<std::string> extra_front, per_layer_tail, extra_back;
  };
  const std::vector<std::string> attn_ff = {"self_attn.in_proj_weight", "self_attn.in_proj_bias",
                                            "self_attn.out_proj.weight", "self_attn.out_proj.bias",
                                            "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"};
  const std::vector<std::string> norms = {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"};
  const std::vector<Case> cases = {
      {PosKind::kShaw, NormKind::kPost, {}, {norms[0], norms[1], norms[2], norms[3], "rel_k", "rel_v"}, {}},
      {PosKind::kT5, NormKind::kPre, {"relative_attention_bias.weight"}, norms, {"norm.weight", "norm.bias"}},
      {PosKind::kLearned, NormKind::kNone, {"pos_emb.weight"}, {}, {}},
  };
  for (const Case& k : cases) {
    TaggerConfig c;
    c.vocab_in = 11;
    c.vocab_out = 7;
    c.d_model = 16;
    c.heads = 2;
    c.ff = 24;
    c.layers = 2;
    c.shaw_clip = 3;
    c.pos = k.pos;
    c.norm = k.norm;
    Rng rng(2);
    Tagger m(c, rng);
    std::vector<std::string> want = {"tok_emb.weight"};
    want.insert(want.end(), k.extra_front.begin(), k.extra_front.end());
    for (int l = 0; l < 2; ++l) {
      for (const auto& n : attn_ff) want.push_back("layers." + std::to_string(l) + "." + n);
      for (const auto& n : k.per_layer_tail) want.push_back("layers." + std::to_string(l) + "." + n);
    }
    want.insert(want.end(), k.extra_back.begin(), k.extra_back.end());
    want.push_back("out.weight");
    want.push_back("out.bias");
    std::vector<std::string> got;
    std::map<std::string, Shape> shapes;
    for (auto& [name, t] : m.named_parameters()) {
      got.push_back(name);
      shapes[name] = t->shape();
    }
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got, want) << pos_name(k.pos);
    EXPECT_EQ(shapes["layers.1.self_attn.in_proj_weight"], Shape({48, 16}));
    EXPECT_EQ(shapes["layers.0.linear1.weight"], Shape({24, 16}));
    if (k.pos == PosKind::kShaw) EXPECT_EQ(shapes["layers.1.rel_v"], Shape({7, 8}));
    if (k.pos == PosKind::kT5) EXPECT_EQ(shapes["relative_attention_bias.weight"], Shape({32, 2}));
  }
}

// Training reaches every table: T5's shared bias and each layer's Shaw tables get a nonzero gradient.
TEST(Tagger, PositionTablesGetGradients) {
  for (PosKind pos : {PosKind::kT5, PosKind::kShaw}) {
    TaggerConfig c;
    c.vocab_in = c.vocab_out = 9;
    c.d_model = 16;
    c.heads = 2;
    c.ff = 16;
    c.shaw_clip = 2;
    c.pos = pos;
    Rng rng(3);
    Tagger m(c, rng);
    ad::Tape tape;
    ad::ParameterSet params(m);
    const nn::Context g(tape, params);
    const ad::Var y = m.forward(g, Ids{{1, 2, 3, 4, 5, 6}, {2, 3}});
    tape.backward(y, rng.normal(y.shape(), 0.0f, 1.0f));
    const std::vector<std::string> tables =
        pos == PosKind::kT5 ? std::vector<std::string>{"relative_attention_bias.weight"}
                            : std::vector<std::string>{"layers.0.rel_k", "layers.0.rel_v", "layers.1.rel_k",
                                                       "layers.1.rel_v"};
    for (const std::string& name : tables) {
      ad::Parameter* p = params.find(name);
      ASSERT_TRUE(p != nullptr && p->has_grad) << name;
      double norm = 0.0;
      const Tensor gr = p->grad.contiguous();
      for (int64_t i = 0; i < gr.numel(); ++i) norm += std::abs(gr.data()[i]);
      EXPECT_GT(norm, 0.0) << name;
    }
  }
}

}  // namespace
}  // namespace qkv::experiments
