// Tests of the RNN Seq2Seq step model: greedy search through RnnStep gives the plain greedy loop's tokens and
// alignments (rnn_oracle.h), beam search and forced attention run on the same rows machinery.
#include <gtest/gtest.h>

#include "ops_testing.h"
#include "rnn_oracle.h"
#include "qkv/decode/rnn_step.h"
#include "qkv/decode/search.h"

namespace qkv::decode {
namespace {

// --- RNN Seq2Seq ---------------------------------------------------------------------------------------------------

TEST(RnnStep, GreedyMatchesThePlainGreedyLoop) {
  for (auto att : {models::Seq2SeqAttention::kNone, models::Seq2SeqAttention::kBahdanau,
                   models::Seq2SeqAttention::kLuongGeneral}) {
    for (auto cell : {models::RnnCell::kGRU, models::RnnCell::kLSTM}) {
      models::Seq2SeqConfig c{};
      c.src_vocab = 15;
      c.tgt_vocab = 13;
      c.embed_dim = 8;
      c.hidden_size = 16;
      c.num_layers = 2;
      c.cell = cell;
      c.attention = att;
      Rng rng(7);
      models::Seq2Seq model(c, rng);
      const Ids src{{4, 5, 6, 7, 8, 9, 0, 0, 10, 11, 12, 0}, {3, 4}};
      const std::vector<int64_t> lengths = {4, 2, 3};
      RnnStep step(model, src, lengths);
      const auto g = greedy_search(step, SearchOptions{9, 1, 2});
      const testing::RnnGreedyDecoded ref = testing::rnn_greedy_decode(model, src, lengths, 9, 1, 2);
      for (int64_t s = 0; s < 3; ++s) {
        std::vector<int64_t> want(ref.tokens.data.begin() + s * ref.tokens.shape[1],
                                  ref.tokens.data.begin() + s * ref.tokens.shape[1] +
                                      ref.lengths[static_cast<size_t>(s)]);
        EXPECT_EQ(g[static_cast<size_t>(s)].tokens, want) << "source " << s;
      }
      if (att != models::Seq2SeqAttention::kNone) {  // the greedy tokens' attention is the loop's alignments
        std::vector<std::vector<int64_t>> tokens;
        for (const Hypothesis& h : g) tokens.push_back(h.tokens);
        const auto al = forced_attention(step, tokens, 1);
        for (int64_t s = 0; s < 3; ++s) {
          const int64_t len = ref.lengths[static_cast<size_t>(s)];
          EXPECT_TRUE(testing::AllClose(al[static_cast<size_t>(s)],
                                        ref.alignments.select(0, s).slice(0, 0, len).contiguous(), {1e-5, 1e-6}))
              << "source " << s;
        }
      }
      // beam search runs on the same rows machinery and scores at least as well as greedy without a penalty
      const auto b = beam_search(step, SearchOptions{9, 1, 2}, BeamOptions{4, LengthPenalty::kNone, 0.0});
      for (size_t s = 0; s < 3; ++s) EXPECT_GE(b[s][0].score, g[s].log_prob - 1e-6);
      if (att != models::Seq2SeqAttention::kNone) {
        const auto a = forced_attention(step, {{3, 2}, {2}, {4, 4, 2}}, 1);
        EXPECT_EQ(a[2].shape(), (Shape{3, 4}));
        EXPECT_NEAR(a[1].to_vector()[0] + a[1].to_vector()[1], 1.0, 1e-5);  // source 1 has 2 real tokens
      }
    }
  }
}

}  // namespace
}  // namespace qkv::decode
