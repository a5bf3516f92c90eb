// decode::generate: the reply stops at a stop id (not kept), at max_new_tokens, at the end of the context, or when
// cancelled; the callback sees every kept token in order; greedy equals argmax of a recomputed forward.
#include "qkv/decode/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>

#include "qkv/core/rng.h"
#include "tiny_llama.h"

namespace qkv {
namespace {

// Modules hold pointers to their children: the model lives on the heap.
std::unique_ptr<models::LlamaForCausalLM> tiny(int64_t context) {
  models::LlamaConfig c = testing::tiny_tied_gqa_llama(17);
  c.max_position_embeddings = context;
  Rng rng(3);
  auto m = std::make_unique<models::LlamaForCausalLM>(c, rng);
  m->eval();
  return m;
}

// Greedy by recomputing the whole sequence every step (no cache): the oracle.
std::vector<int64_t> greedy_oracle(const models::LlamaForCausalLM& m, std::vector<int64_t> seq, int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const Tensor logits = m.logits(Ids{seq, {1, static_cast<int64_t>(seq.size())}});
    const int64_t v = logits.size(2);
    const float* last = logits.data() + (logits.size(1) - 1) * v;
    int64_t best = 0;
    for (int64_t j = 1; j < v; ++j)
      if (last[j] > last[best]) best = j;
    out.push_back(best);
    seq.push_back(best);
  }
  return out;
}

TEST(Generate, GreedyEqualsTheRecomputedArgmaxAndStreamsEveryToken) {
  const auto pm = tiny(64);
  const models::LlamaForCausalLM& m = *pm;
  decode::GenerateOptions o;
  o.max_new_tokens = 9;
  std::vector<int64_t> streamed;
  const decode::Generation g = decode::generate(m, {1, 5, 7}, o, [&](int64_t id) {
    streamed.push_back(id);
    return true;
  });
  EXPECT_EQ(g.tokens, greedy_oracle(m, {1, 5, 7}, 9));
  EXPECT_EQ(streamed, g.tokens);
  EXPECT_EQ(g.finish, decode::FinishReason::kLength);
}

TEST(Generate, StopIdEndsTheReplyAndIsNotKept) {
  const auto pm = tiny(64);
  const models::LlamaForCausalLM& m = *pm;
  const std::vector<int64_t> free_run = greedy_oracle(m, {2, 3}, 8);
  decode::GenerateOptions o;
  o.max_new_tokens = 8;
  o.stop_ids = {free_run[3]};
  const decode::Generation g = decode::generate(m, {2, 3}, o);
  const auto first = std::find(free_run.begin(), free_run.end(), free_run[3]) - free_run.begin();
  EXPECT_EQ(g.tokens, std::vector<int64_t>(free_run.begin(), free_run.begin() + first));
  EXPECT_EQ(g.finish, decode::FinishReason::kStop);
  EXPECT_EQ(g.stop_id, free_run[3]);
}

TEST(Generate, ContextEndStopsTheReplyAndAFullPromptIsRefused) {
  const auto pm = tiny(6);
  const models::LlamaForCausalLM& m = *pm;
  decode::GenerateOptions o;
  o.max_new_tokens = 50;
  const decode::Generation g = decode::generate(m, {1, 2, 3, 4}, o);
  EXPECT_EQ(g.tokens.size(), 2u);  // positions 4 and 5
  EXPECT_EQ(g.finish, decode::FinishReason::kContext);
  EXPECT_THROW(decode::generate(m, {1, 2, 3, 4, 5, 6}, o), std::invalid_argument);
}

TEST(Generate, CancelFlagAndCallbackStopTheReply) {
  const auto pm = tiny(64);
  const models::LlamaForCausalLM& m = *pm;
  decode::GenerateOptions o;
  o.max_new_tokens = 20;
  std::atomic<bool> cancel{false};
  o.cancel = &cancel;
  int calls = 0;
  const decode::Generation g = decode::generate(m, {1}, o, [&](int64_t) {
    if (++calls == 3) cancel = true;
    return true;
  });
  EXPECT_EQ(g.tokens.size(), 3u);
  EXPECT_EQ(g.finish, decode::FinishReason::kCancelled);
  cancel = false;
  const decode::Generation h = decode::generate(m, {1}, o, [&](int64_t) { return false; });
  EXPECT_EQ(h.tokens.size(), 1u);
  EXPECT_EQ(h.finish, decode::FinishReason::kCancelled);
}

TEST(Generate, BadArgumentsThrowNamingTheOp) {
  const auto pm = tiny(64);
  const models::LlamaForCausalLM& m = *pm;
  decode::GenerateOptions o;
  EXPECT_THROW(decode::generate(m, {}, o), std::invalid_argument);
  EXPECT_THROW(decode::generate(m, {17}, o), std::invalid_argument);
  o.stop_ids = {-1};
  EXPECT_THROW(decode::generate(m, {1}, o), std::invalid_argument);
  o.stop_ids = {};
  o.max_new_tokens = -1;
  try {
    decode::generate(m, {1}, o);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[generate]"), std::string::npos);
  }
}

}  // namespace
}  // namespace qkv
