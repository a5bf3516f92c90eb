// decode::RecordingDecoder: one row of the Scheduler's decoding step whose forwards record attentions and hidden
// states; its greedy tokens are decode::generate's on the same paged caches, and its logits and recordings those of
// the model's own recording forward over paged caches; the argument errors are named.
#include "qkv/decode/recording.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "ops_testing.h"
#include "qkv/core/rng.h"
#include "qkv/decode/generate.h"
#include "tiny_llama.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::ThrowsArg;

std::unique_ptr<models::LlamaForCausalLM> tiny() {
  models::LlamaConfig c = testing::tiny_gqa_llama(false);  // 2 layers, 4 query heads over 2 kv heads, V 23
  c.max_position_embeddings = 64;
  Rng rng(5);
  auto m = std::make_unique<models::LlamaForCausalLM>(c, rng);
  m->eval();
  return m;
}

int64_t argmax_last(const Tensor& logits) {  // (1, T, V), lowest id on ties
  const Tensor l = logits.contiguous();
  const int64_t v = l.size(2);
  const float* row = l.data() + (l.size(1) - 1) * v;
  return std::max_element(row, row + v) - row;
}

TEST(RecordingDecoder, GreedyGivesGeneratesTokensAndRecordsWhatTheForwardRecords) {
  const auto pm = tiny();
  const models::LlamaForCausalLM& m = *pm;
  const std::vector<int64_t> prompt = {1, 5, 7, 9, 2};
  const int64_t n = 8, page = 4;
  decode::GenerateOptions g;
  g.max_new_tokens = n;
  g.page_size = page;
  const decode::Generation want = decode::generate(m, prompt, g);
  ASSERT_EQ(static_cast<int64_t>(want.tokens.size()), n);

  models::ForwardOptions fo;
  fo.output_attentions = fo.output_hidden_states = true;
  decode::RecordingDecoder rec(m, page, 8);
  std::vector<nn::KvCache> caches = m.new_caches(1, 8, page);  // the model's own recording forward
  const auto p = static_cast<int64_t>(prompt.size());
  models::CausalLMOutput out = rec.prefill(prompt, fo);
  models::CausalLMOutput ref = m.forward(Ids{prompt, {1, p}}, fo, &caches);
  std::vector<int64_t> got;
  for (int64_t i = 0;; ++i) {
    const int64_t keys = p + i;
    EXPECT_EQ(rec.length(), keys);
    ASSERT_EQ(out.attentions.size(), 2u);
    ASSERT_EQ(out.hidden_states.size(), 3u);
    EXPECT_TRUE(AllClose(out.logits, ref.logits, testing::kExact)) << "step " << i;
    for (size_t l = 0; l < 2; ++l) {
      EXPECT_EQ(out.attentions[l].shape(), (Shape{1, 4, i == 0 ? p : 1, keys}));
      EXPECT_TRUE(AllClose(out.attentions[l], ref.attentions[l], testing::kExact));
    }
    for (size_t l = 0; l < 3; ++l) EXPECT_TRUE(AllClose(out.hidden_states[l], ref.hidden_states[l], testing::kExact));
    got.push_back(argmax_last(out.logits));
    if (i + 1 == n) break;
    out = rec.step(got.back(), fo);
    ref = m.forward(Ids{{got.back()}, {1, 1}}, fo, &caches);
  }
  EXPECT_EQ(got, want.tokens);
  models::ForwardOptions none;  // nothing asked: logits only
  const models::CausalLMOutput plain = rec.step(got.back(), none);
  EXPECT_EQ(plain.logits.shape(), (Shape{1, 1, 23}));
  EXPECT_TRUE(plain.attentions.empty() && plain.hidden_states.empty());
}

TEST(RecordingDecoder, BadArgumentsAreNamed) {
  const auto pm = tiny();
  const models::ForwardOptions fo;
  EXPECT_TRUE(ThrowsArg([&] { decode::RecordingDecoder(*pm, 0, 8); }, "[RecordingDecoder] page_size must be >= 1"));
  decode::RecordingDecoder rec(*pm, 4, 8);
  EXPECT_TRUE(ThrowsArg([&] { rec.step(1, fo); }, "[RecordingDecoder] step before prefill"));
  EXPECT_TRUE(ThrowsArg([&] { rec.prefill({}, fo); }, "[RecordingDecoder] the prompt is empty"));
  rec.prefill({1, 2}, fo);
  EXPECT_TRUE(ThrowsArg([&] { rec.prefill({1, 2}, fo); }, "[RecordingDecoder] prefill once"));
}

}  // namespace
}  // namespace qkv
