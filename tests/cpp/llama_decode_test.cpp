// Tests of decoding with the Llama-style models: cached steps (contiguous and paged caches, bf16) against the full
// forward, logits_to_keep, the tape's gradient through the model, and sampling (filters, seeds, greedy's tokens).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "ops_testing.h"
#include "qkv/decode/cached_step.h"
#include "qkv/decode/generate.h"
#include "qkv/decode/sampling.h"
#include "qkv/decode/search.h"
#include "qkv/models/llama.h"
#include "qkv/nn/kv_cache.h"
#include "qkv/train/loss.h"
#include "recompute_steps.h"
#include "tiny_llama.h"

namespace qkv::decode {
using nn::KvCache;
namespace {

using qkv::testing::AllClose;
using qkv::testing::CausalLmRecomputeStep;
using qkv::testing::ThrowsArg;
using qkv::testing::Tol;


// Contiguous caches (page 0) and paged ones (pages of 1 and 3 positions, read in place by attention_with_kvcache),
// two rows: the prompt at once, then one token a step, equal the full forward.
TEST(LlamaDecoding, CachedStepsEqualTheFullForward) {
  for (bool gemma : {false, true})
    for (int64_t page : {0, 1, 3}) {
      Rng rng(5);
      const models::LlamaConfig c = qkv::testing::tiny_gqa_llama(gemma);
      const models::LlamaForCausalLM model(c, rng);
      const Ids ids{{3, 7, 1, 19, 4, 4, 11, 2, 9, 5, 2, 8, 0, 13, 6, 1, 22, 3}, {2, 9}};
      const Tensor full = model.logits(ids);  // (2, 9, V)
      std::vector<nn::KvCache> caches = model.new_caches(2, 2, page);  // grows while decoding
      const Tensor first = model.forward(nn::Context(), Ids{{3, 7, 1, 19, 5, 2, 8, 0}, {2, 4}}, &caches).value;
      EXPECT_TRUE(AllClose(first, full.slice(1, 0, 4), qkv::testing::Tol{1e-5, 1e-5})) << "gemma " << gemma << " page " << page;
      for (int64_t t = 4; t < 9; ++t) {
        const Ids next{{ids.data[t], ids.data[9 + t]}, {2, 1}};
        const Tensor step = model.forward(nn::Context(), next, &caches).value;
        EXPECT_TRUE(AllClose(step, full.slice(1, t, t + 1), qkv::testing::Tol{1e-5, 1e-5}))
            << "gemma " << gemma << " page " << page << " t " << t;
      }
      EXPECT_EQ(caches[0].length(), 9);
      EXPECT_EQ(caches[0].paged(), page > 0);
    }
}

// At bf16 the paged cache holds and reads what the contiguous one does (the rounded keys and values, the rounded
// queries): the same logits at every step up to the key tiling's float32 order; fp32 ones are visibly different.
TEST(LlamaDecoding, PagedCacheFollowsTheBf16Precision) {
  for (bool gemma : {false, true}) {
    Rng rng(6);
    models::LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(gemma), rng);
    const Ids prompt{{3, 7, 1, 19, 5, 2, 8, 0}, {2, 4}};
    const std::vector<std::vector<int64_t>> steps{{4, 6}, {11, 1}, {2, 22}, {9, 3}, {5, 5}};
    auto run = [&](Precision p, int64_t page) {
      model.set_precision(p);
      std::vector<nn::KvCache> caches = model.new_caches(2, 2, page);
      std::vector<Tensor> out{model.forward(nn::Context(), prompt, &caches).value};
      for (const auto& s : steps) out.push_back(model.forward(nn::Context(), Ids{s, {2, 1}}, &caches).value);
      return out;
    };
    const std::vector<Tensor> flat = run(Precision::kBFloat16, 0), fp32 = run(Precision::kFloat32, 0);
    double bf16_vs_fp32 = 0.0;
    for (size_t i = 0; i < flat.size(); ++i) {
      const std::vector<float> a = flat[i].to_vector(), b = fp32[i].to_vector();
      for (size_t j = 0; j < a.size(); ++j) bf16_vs_fp32 = std::max(bf16_vs_fp32, std::abs(double{a[j]} - b[j]));
    }
    EXPECT_GT(bf16_vs_fp32, 1e-3) << "gemma " << gemma;  // bf16 is in effect
    for (int64_t page : {1, 3}) {
      const std::vector<Tensor> paged = run(Precision::kBFloat16, page);
      for (size_t i = 0; i < flat.size(); ++i)
        EXPECT_TRUE(AllClose(paged[i], flat[i], qkv::testing::Tol{2e-5, 2e-5}))
            << "gemma " << gemma << " page " << page << " step " << i;
    }
  }
}

// logits_to_keep = n: the last n positions of the full logits (tied and untied heads, final soft-cap); 0 and n >= T
// give them all; a negative n is named. The last layer then runs its queries, residual and MLP on those n rows only:
// with the last layer windowed too, and after a cached prefix (contiguous and paged caches), where the caches must
// still take every row's keys and values (the next step's logits equal the full forward's).
TEST(LlamaDecoding, LogitsToKeepAreTheLastRowsOfTheFullLogits) {
  const auto columns = [](const Ids& ids, int64_t from, int64_t to) {
    Ids out{{}, {ids.shape[0], to - from}};
    for (int64_t r = 0; r < ids.shape[0]; ++r)
      for (int64_t t = from; t < to; ++t) out.data.push_back(ids.data[static_cast<size_t>(r * ids.shape[1] + t)]);
    return out;
  };
  for (int kind : {0, 1, 2}) {  // llama; gemma 2 (layer 0 windowed, soft-caps); gemma 2 with both layers windowed
    models::LlamaConfig config = qkv::testing::tiny_gqa_llama(kind > 0);
    if (kind == 2) config.layer_sliding = {true, true};
    Rng rng(8);
    const models::LlamaForCausalLM model(config, rng);
    const Ids ids{{3, 7, 1, 19, 4, 4, 11, 2, 9, 5}, {2, 5}};
    const Tensor full = model.logits(ids);  // (2, 5, V)
    for (int64_t n : {1, 2, 4}) {
      const Tensor kept = model.forward(nn::Context(), ids, nullptr, n).value;
      ASSERT_EQ(kept.shape(), (Shape{2, n, full.size(2)})) << n;
      EXPECT_TRUE(AllClose(kept, full.slice(1, 5 - n, 5), qkv::testing::Tol{1e-6, 1e-6})) << "kind " << kind << " n " << n;
      EXPECT_EQ(model.model.forward(nn::Context(), ids, nullptr, nullptr, n).value.shape(), (Shape{2, n, 16}));
    }
    for (int64_t n : {0, 5, 9}) EXPECT_EQ(model.forward(nn::Context(), ids, nullptr, n).value.shape(), full.shape());
    EXPECT_TRUE(ThrowsArg([&] { model.forward(nn::Context(), ids, nullptr, -1); }, "[llama] logits_to_keep"));
    EXPECT_TRUE(ThrowsArg([&] { model.model.forward(nn::Context(), ids, nullptr, nullptr, -2); }, "[llama] last"));

    const Ids longer{{3, 7, 1, 19, 4, 6, 4, 11, 2, 9, 5, 8}, {2, 6}};
    const Tensor whole = model.logits(longer);  // (2, 6, V)
    for (int64_t page : {0, 2})
      for (int64_t n : {1, 2}) {
        std::vector<nn::KvCache> caches = model.new_caches(2, 2, page);
        model.forward(nn::Context(), columns(longer, 0, 2), &caches, 1);
        const Tensor kept = model.forward(nn::Context(), columns(longer, 2, 5), &caches, n).value;
        EXPECT_TRUE(AllClose(kept, whole.slice(1, 5 - n, 5), qkv::testing::Tol{1e-5, 1e-5}))
            << "kind " << kind << " page " << page << " n " << n;
        EXPECT_EQ(caches[1].length(), 5);
        const Tensor step = model.forward(nn::Context(), columns(longer, 5, 6), &caches).value;
        EXPECT_TRUE(AllClose(step, whole.slice(1, 5, 6), qkv::testing::Tol{1e-5, 1e-5}))
            << "kind " << kind << " page " << page << " n " << n;
      }
  }
}

TEST(LlamaDecoding, TapeGradientMatchesADirectionalDifference) {
  // The same forward on a tape: d(loss)/d(weights) along a random direction against a central difference.
  Rng rng(6);
  models::LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(true), rng);
  const Ids ids{{3, 7, 1, 19, 4, 4, 11, 2}, {2, 4}};
  const std::vector<int64_t> targets{7, 1, 19, 4, 11, 2, 9, 0};
  ad::ParameterSet params(model);
  ad::Tape tape;
  nn::Context ctx(tape, params);
  tape.backward(train::cross_entropy(model.forward(ctx, ids), targets));
  auto loss = [&] { return static_cast<double>(train::cross_entropy(model.logits(ids), targets).value.data()[0]); };
  for (const char* name : {"model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.up_proj.weight",
                           "model.layers.0.post_feedforward_layernorm.weight", "model.embed_tokens.weight"}) {
    ad::Parameter* p = params.find(name);
    ASSERT_TRUE(p && p->has_grad) << name;
    const Tensor dir = qkv::testing::randn(p->value->shape(), 77);
    double analytic = 0.0;
    for (int64_t i = 0; i < dir.numel(); ++i) analytic += static_cast<double>(dir.data()[i]) * p->grad.data()[i];
    const Tensor saved = p->value->clone();
    const float h = 3e-3f;
    double l[2];
    for (int s = 0; s < 2; ++s) {
      for (int64_t i = 0; i < dir.numel(); ++i) p->value->data()[i] = saved.data()[i] + (s ? -h : h) * dir.data()[i];
      l[s] = loss();
    }
    for (int64_t i = 0; i < dir.numel(); ++i) p->value->data()[i] = saved.data()[i];
    EXPECT_NEAR(analytic, (l[0] - l[1]) / (2.0 * h), 2e-3 * std::max(1.0, std::fabs(analytic))) << name;
  }
}

TEST(Sampling, FiltersAndFrequencies) {
  const std::vector<float> logits{1.0f, 3.0f, 2.5f, -1.0f, 3.0f};
  Rng rng(3);
  SamplingOptions greedy;
  EXPECT_EQ(sample_token(logits.data(), 5, greedy, rng), 1);  // lowest id on ties
  SamplingOptions o;
  o.temperature = 0.7f;
  o.top_k = 1;
  EXPECT_EQ(sample_token(logits.data(), 5, o, rng), 1);
  // Frequencies follow softmax(logits / T) among the top 3 (ids 1, 4, 2).
  o.top_k = 3;
  std::vector<double> want(5, 0.0);
  double z = 0.0;
  for (int64_t id : {1, 4, 2}) z += want[id] = std::exp(logits[id] / 0.7);
  for (double& w : want) w /= z;
  std::vector<double> seen(5, 0.0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) seen[sample_token(logits.data(), 5, o, rng)] += 1.0 / n;
  for (int id = 0; id < 5; ++id) EXPECT_NEAR(seen[id], want[id], 0.015) << id;
  // top_p: ids 1 and 4 hold ~0.77 of the mass at T = 0.7, so p = 0.5 keeps two tokens and p = 0.9 three.
  o.top_k = 0;
  o.top_p = 0.5f;
  for (int i = 0; i < 200; ++i) {
    const int64_t t = sample_token(logits.data(), 5, o, rng);
    EXPECT_TRUE(t == 1 || t == 4) << t;
  }
  o.temperature = -1.0f;
  EXPECT_THROW(sample_token(logits.data(), 5, o, rng), std::invalid_argument);
}

TEST(Sampling, GenerateIsSeededAndGreedyMatchesGreedySearch) {
  Rng rng(9);
  const models::LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(true), rng);
  SamplingOptions o;
  o.temperature = 1.0f;
  o.seed = 4;
  EXPECT_EQ(generate(model, {3, 5}, 12, o), generate(model, {3, 5}, 12, o));
  // cached_step under greedy_search continues the prompt as generate() does (eos 0 as the end token): the prompt but
  // its last token runs at once, the search feeds that token first.
  const std::vector<int64_t> g = generate(model, {3, 5, 8}, 10, {}, 0);
  CachedStep step = cached_step(model, {{3, 5}});
  SearchOptions so;
  so.max_len = 10;
  so.bos = 8;
  so.eos = 0;
  EXPECT_EQ(greedy_search(step, so).at(0).tokens, g);
  EXPECT_THROW(generate(model, {3, 23}, 4), std::invalid_argument);
  // Paged caches give the same tokens, sampled and under beam search (whose reorders fork the pages).
  EXPECT_EQ(generate(model, {3, 5}, 12, o, -1, 4), generate(model, {3, 5}, 12, o));
  CachedStep paged = cached_step(model, {{3, 5}}, 2);
  BeamOptions b;
  b.beam_size = 3;
  const auto flat_beams = beam_search(step, so, b).at(0), paged_beams = beam_search(paged, so, b).at(0);
  ASSERT_EQ(paged_beams.size(), flat_beams.size());
  for (size_t i = 0; i < flat_beams.size(); ++i) EXPECT_EQ(paged_beams[i].tokens, flat_beams[i].tokens) << i;
  EXPECT_TRUE(ThrowsArg([&] { generate(model, {3, 5}, 4, {}, -1, -2); }, "[generate] page_size must be >= 0"));
}

// Prompts of different lengths (one empty) run cached, left-padded with per-row positions (transformers' generate):
// greedy and beam search give the tokens of the recomputing oracle (each row's whole sequence every step, no
// padding), both continuing the prompts after the search's bos.
TEST(LlamaCache, UnequalPromptsGiveTheRecomputedTokens) {
  for (bool gemma : {false, true}) {
    Rng rng(21);
    const models::LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(gemma), rng);
    const std::vector<std::vector<int64_t>> prompts = {{3, 5, 9, 2, 7, 8}, {4, 8}, {8}, {9, 1, 6, 8}};
    std::vector<std::vector<int64_t>> heads;
    for (const auto& p : prompts) heads.emplace_back(p.begin(), p.end() - 1);
    SearchOptions so;
    so.max_len = 8;
    so.bos = 8;
    so.eos = 0;
    BeamOptions b;
    b.beam_size = 3;
    CausalLmRecomputeStep oracle(model, heads);
    const std::vector<Hypothesis> greedy = greedy_search(oracle, so);
    const auto beams = beam_search(oracle, so, b);
    size_t generated = 0;
    for (const Hypothesis& h : greedy) generated += h.tokens.size();
    EXPECT_GE(generated, 12u) << "the prompts' continuations run for several steps";
    for (int64_t page : {0, 2}) {
      CachedStep step = cached_step(model, heads, page);
      const std::vector<Hypothesis> got = greedy_search(step, so);
      ASSERT_EQ(got.size(), greedy.size());
      for (size_t s = 0; s < got.size(); ++s) {
        EXPECT_EQ(got[s].tokens, greedy[s].tokens) << "gemma " << gemma << " page " << page << " prompt " << s;
        EXPECT_NEAR(got[s].log_prob, greedy[s].log_prob, 1e-4) << s;
      }
      const auto got_beams = beam_search(step, so, b);
      ASSERT_EQ(got_beams.size(), beams.size());
      for (size_t s = 0; s < beams.size(); ++s) {
        ASSERT_EQ(got_beams[s].size(), beams[s].size()) << s;
        for (size_t i = 0; i < beams[s].size(); ++i)
          EXPECT_EQ(got_beams[s][i].tokens, beams[s][i].tokens) << "gemma " << gemma << " page " << page << " " << s;
      }
    }
  }
  Rng rng(1);
  const models::LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(false), rng);
  EXPECT_TRUE(ThrowsArg([&] { cached_step(model, {}); }, "[CachedStep] no prompts"));
  EXPECT_TRUE(ThrowsArg([&] { cached_step(model, {{3, 8}, {23}}); }, "[CachedStep] prompt token 23"));
  EXPECT_TRUE(ThrowsArg([&] { cached_step(model, {{3, 8}}, -1); }, "[CachedStep] page_size must be >= 0"));
  CachedStep step = cached_step(model, {{3, 8}});
  EXPECT_TRUE(ThrowsArg([&] { step.step({0}, {1}); }, "[CachedStep] step before start"));
}

// forced_attention over a Llama's cached step records the last layer's attention (output_attentions of that layer
// only), heads averaged: each fed token's row over the prompt columns equals the full forward of its source alone,
// left padding at 0 (unequal prompts, one empty; contiguous and paged caches; Gemma 2's window and soft-caps).
TEST(LlamaCache, ForcedAttentionIsTheFullForwardsLastLayerOverThePrompt) {
  constexpr Tol kAttention{1e-5, 1e-4};
  for (bool gemma : {false, true}) {
    Rng rng(23);
    const models::LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(gemma), rng);
    const std::vector<std::vector<int64_t>> prompts = {{3, 5, 9, 2}, {}, {4, 7}};
    const std::vector<std::vector<int64_t>> tokens = {{6, 1, 0}, {2, 2}, {9, 11, 13, 5}};
    models::ForwardOptions o;
    o.output_attentions = true;
    o.attention_layers = {1};
    const auto last_layer = [&](const Ids& ids) { return model.forward(ids, o).attentions.back(); };
    const std::vector<Tensor> want = qkv::testing::prompt_attention_oracle(last_layer, prompts, tokens, 8);
    for (int64_t page : {0, 2}) {
      CachedStep step = cached_step(model, prompts, page);
      const std::vector<Tensor> got = forced_attention(step, tokens, 8);
      ASSERT_EQ(got.size(), want.size());
      for (size_t s = 0; s < got.size(); ++s) {
        ASSERT_EQ(got[s].shape(), (Shape{static_cast<int64_t>(tokens[s].size()), 4})) << s;
        EXPECT_TRUE(AllClose(got[s], want[s], kAttention)) << "gemma " << gemma << " page " << page << " source " << s;
      }
      step.start();  // forced_attention turned recording off again
      step.step({0, 1, 2}, {8, 8, 8});
      EXPECT_FALSE(step.last_attention().defined());
    }
  }
}

}  // namespace
}  // namespace qkv::decode
