// LlamaForCausalLM::forward(ids, ForwardOptions): the attention probabilities and hidden states it records (HF's
// output_attentions / output_hidden_states) beside unchanged logits, and a decode step's probabilities through the
// KV cache (contiguous and paged) against the last row of the full forward's.
#include <gtest/gtest.h>

#include <vector>

#include "ops_testing.h"
#include "qkv/models/llama.h"
#include "qkv/nn/kv_cache.h"
#include "tiny_llama.h"

namespace qkv::models {
namespace {

using qkv::testing::AllClose;
using qkv::testing::Tol;


ForwardOptions everything() {
  ForwardOptions o;
  o.output_attentions = o.output_hidden_states = true;
  return o;
}

TEST(LlamaOutputs, RecordingLeavesTheLogitsAndTheFinalHiddenStateUnchanged) {
  for (bool gemma : {false, true}) {
    Rng rng(3);
    const LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(gemma), rng);
    const Ids ids{{3, 7, 1, 19, 4, 4, 11, 2, 9, 5, 2, 8, 0, 13, 6, 1, 22, 3}, {2, 9}};
    const CausalLMOutput out = model.forward(ids, everything());
    const Tensor logits = model.logits(ids);
    ASSERT_EQ(out.logits.shape(), logits.shape());
    EXPECT_TRUE(AllClose(out.logits, logits, Tol{0.0, 0.0}));  // the same kernels ran: the same bits
    ASSERT_EQ(out.attentions.size(), 2u);
    ASSERT_EQ(out.hidden_states.size(), 3u);
    EXPECT_EQ(out.attentions[1].shape(), (Shape{2, 4, 9, 9}));
    EXPECT_EQ(out.hidden_states[0].shape(), (Shape{2, 9, 16}));
    const Tensor last = model.model.forward(nn::Context(), ids, nullptr).value;
    EXPECT_TRUE(AllClose(out.hidden_states[2], last, Tol{0.0, 0.0}));
    // Every row a distribution over the keys it may see: causal, and the window of 3 on gemma's layer 0.
    const Tensor p = out.attentions[0].contiguous();
    for (int64_t i = 0; i < 9; ++i)
      for (int64_t j = 0; j < 9; ++j) {
        const bool seen = j <= i && (!gemma || i - j < 3);
        if (!seen) EXPECT_EQ(p.data()[((1 * 4 + 2) * 9 + i) * 9 + j], 0.0f) << i << " " << j;
      }
  }
}

TEST(LlamaOutputs, DecodeStepProbabilitiesAreTheLastRowOfTheFullForward) {
  for (bool gemma : {false, true})
    for (int64_t page : {0, 3}) {
      Rng rng(5);
      const LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(gemma), rng);
      const Ids ids{{3, 7, 1, 19, 4, 4, 11, 2, 9, 5, 2, 8, 0, 13}, {2, 7}};
      const CausalLMOutput full = model.forward(ids, everything());
      std::vector<nn::KvCache> caches = model.new_caches(2, 2, page);
      const Ids prompt{{3, 7, 1, 19, 4, 4, 2, 9, 5, 2, 8, 0}, {2, 6}};
      const CausalLMOutput first = model.forward(prompt, everything(), &caches);
      const CausalLMOutput step = model.forward(Ids{{11, 13}, {2, 1}}, everything(), &caches);
      for (size_t l = 0; l < 2; ++l) {
        EXPECT_TRUE(AllClose(first.attentions[l], full.attentions[l].slice(2, 0, 6).slice(3, 0, 6), Tol{1e-6, 1e-5}));
        ASSERT_EQ(step.attentions[l].shape(), (Shape{2, 4, 1, 7})) << "gemma " << gemma << " page " << page;
        EXPECT_TRUE(AllClose(step.attentions[l], full.attentions[l].slice(2, 6, 7), Tol{1e-6, 1e-5}))
            << "gemma " << gemma << " page " << page << " layer " << l;
        EXPECT_TRUE(AllClose(step.hidden_states[l + 1], full.hidden_states[l + 1].slice(1, 6, 7), Tol{1e-5, 1e-5}));
      }
    }
}

TEST(LlamaOutputs, OnlyTheAskedLayersAreComputed) {
  Rng rng(1);
  const LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(true), rng);
  ForwardOptions o;
  o.output_attentions = true;
  o.attention_layers = {1};
  const CausalLMOutput out = model.forward(Ids{{1, 2, 3}, {1, 3}}, o);
  ASSERT_EQ(out.attentions.size(), 2u);
  EXPECT_FALSE(out.attentions[0].defined());
  EXPECT_EQ(out.attentions[1].shape(), (Shape{1, 4, 3, 3}));
  EXPECT_TRUE(out.hidden_states.empty());
}

TEST(LlamaOutputs, AttentionLayerOutsideTheModelThrows) {
  Rng rng(1);
  const LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(false), rng);
  for (int64_t bad : {-1, 2}) {
    ForwardOptions o;
    o.output_attentions = true;
    o.attention_layers = {0, bad};
    EXPECT_THROW(model.forward(Ids{{1, 2}, {1, 2}}, o), std::invalid_argument) << bad;
  }
}

}  // namespace
}  // namespace qkv::models
