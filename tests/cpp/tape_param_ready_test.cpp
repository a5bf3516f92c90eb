// The tape's parameter-ready hook (data parallelism overlaps its all-reduce with the backward through it): every
// parameter reported once, with its final gradient, on a hand-made graph, a Llama with tied embeddings and GQA and a
// decoder-only Transformer; a late write to a reported parameter throws; no hook, no reports.
#include <gtest/gtest.h>

#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "grad_testing.h"
#include "tiny_llama.h"
#include "qkv/models/llama.h"
#include "qkv/models/transformer.h"
#include "qkv/ops/functional.h"
#include "qkv/train/loss.h"

namespace qkv {
namespace {

using testing::randn;
using ad::Tape;
using ad::Var;

// What the hook saw of one parameter: how often it was reported, its gradient then, and the nodes still to run.
struct Report {
  int count = 0;
  bool had_grad = false;
  std::vector<float> grad;
  size_t nodes_left = 0;
};

// Runs `loss_of` on a tape with the hook set and checks, for every parameter of `params`: one that some node read
// is reported exactly once, with its final gradient (bit for bit: nothing was added after the report); one that no
// node read is never reported. Returns the reports.
template <class LossOf>
std::map<std::string, Report> expect_reports_are_final(ad::ParameterSet& params, LossOf loss_of) {
  std::map<std::string, Report> seen;
  Tape tape;
  tape.set_on_param_ready([&](ad::Parameter& p, size_t nodes_left) {
    Report& r = seen[p.name];
    ++r.count;
    r.had_grad = p.has_grad;
    r.grad = p.has_grad ? p.grad.to_vector() : std::vector<float>();
    r.nodes_left = nodes_left;
    EXPECT_LT(nodes_left, tape.num_nodes());
  });
  params.zero_grad();
  const Var loss = loss_of(tape);
  tape.backward(loss);
  for (size_t i = 0; i < params.size(); ++i) {
    const ad::Parameter& p = params[i];
    const auto it = seen.find(p.name);
    if (it == seen.end()) {
      EXPECT_FALSE(p.has_grad) << p.name << " has a gradient but was never reported";
      continue;
    }
    EXPECT_EQ(it->second.count, 1) << p.name;
    EXPECT_EQ(it->second.had_grad, p.has_grad) << p.name;
    if (p.has_grad) EXPECT_EQ(it->second.grad, p.grad.to_vector()) << p.name << " changed after its report";
  }
  return seen;
}

TEST(TapeParamReady, AWeightReadByTwoNodesAndTiedEmbeddingsAreReportedOnceFinal) {
  Tensor emb = randn({7, 4}, 1), w = randn({4, 4}, 2), b = randn({4}, 3), unused = randn({2}, 4);
  ad::ParameterSet params;
  params.add("emb", &emb);
  params.add("w", &w);
  params.add("b", &b);
  params.add("unused", &unused);
  const auto seen = expect_reports_are_final(params, [&](Tape& tape) {
    const Var e = tape.param(params[0]), wv = tape.param(params[1]), bv = tape.param(params[2]);
    const Var w_again = tape.param(params[1]);  // a second slot of the same parameter
    const Var x = ad::embedding(e, Ids{{1, 3, 3, 6, 0, 2}, Shape{2, 3}});  // the first node
    const Var h = ad::tanh(ad::linear(x, wv));
    const Var h2 = ad::linear(ad::add(h, x), w_again, bv);  // w by a second node, through its second slot
    return ad::sum(ad::tanh(ad::linear(h2, e)));        // tied: the embedding as the output projection
  });
  EXPECT_EQ(seen.count("unused"), 0u);
  ASSERT_EQ(seen.count("emb"), 1u);
  ASSERT_EQ(seen.count("w"), 1u);
  EXPECT_EQ(seen.at("emb").nodes_left, 0u) << "final only after the embedding, the first node";
  EXPECT_GT(seen.at("w").nodes_left, 0u) << "final before the backward ends";
  EXPECT_GT(seen.at("b").nodes_left, seen.at("w").nodes_left) << "b's only node runs before w's first one";
}

TEST(TapeParamReady, EveryParameterOfALlamaWithTiedEmbeddingsAndGqa) {
  const models::LlamaConfig c = qkv::testing::tiny_tied_gqa_llama(13);
  Rng rng(7);
  models::LlamaForCausalLM model(c, rng);
  ad::ParameterSet params(model);
  const Ids ids{{1, 4, 9, 2, 12, 0, 5, 5}, Shape{2, 4}};
  const auto seen = expect_reports_are_final(params, [&](Tape& tape) {
    nn::Context ctx(tape, params);
    return train::cross_entropy(model.forward(ctx, ids), {4, 9, 2, 1, 0, 5, 5, 3});
  });
  EXPECT_EQ(seen.size(), params.size());
  EXPECT_EQ(seen.at("model.embed_tokens.weight").nodes_left, 0u);
  EXPECT_GT(seen.at("model.norm.weight").nodes_left, 0u);
}

TEST(TapeParamReady, EveryParameterOfADecoderOnlyTransformer) {
  models::DecoderOnlyConfig c;
  c.vocab = 11;
  c.max_len = 8;
  c.num_layers = 2;
  c.layer.d_model = 8;
  c.layer.nhead = 2;
  c.layer.dim_feedforward = 16;
  c.layer.dropout = 0.0f;
  Rng rng(8);
  models::DecoderOnlyTransformer model(c, rng);
  ad::ParameterSet params(model);
  const Ids ids{{1, 4, 9, 2, 10, 0}, Shape{2, 3}};
  const auto seen = expect_reports_are_final(params, [&](Tape& tape) {
    nn::Context ctx(tape, params);
    return train::cross_entropy(model.forward(ctx, ids), {4, 9, 2, 3, 0, 5});
  });
  EXPECT_EQ(seen.size(), params.size());
}

// sum(y · w) where y's node, recorded first and so run last, adds to w's gradient without naming w as an input
// (an op author's mistake the hook must catch).
Var loss_with_an_undeclared_write(Tape& tape, ad::Parameter& p) {
  const Var wv = tape.param(p);
  const Var x = tape.leaf(randn({3}, 6));
  const Var y =
      tape.record(x.value.clone(), {&x}, [wv](Tape& t, std::span<const Tensor> d) { t.accumulate(wv, d[0]); });
  return ad::sum(ad::mul(y, wv));
}

TEST(TapeParamReady, AClosureThatWritesAnUndeclaredParameterAfterItsReportThrows) {
  Tensor w = randn({3}, 5);
  ad::ParameterSet params;
  params.add("w", &w);
  Tape tape;
  int reports = 0;
  tape.set_on_param_ready([&](ad::Parameter&, size_t) { ++reports; });
  const Var loss = loss_with_an_undeclared_write(tape, params[0]);
  try {
    tape.backward(loss);
    ADD_FAILURE() << "a gradient after the report passed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("[Tape.backward] node 0 adds to the gradient of parameter 'w' after it was "
                                         "reported final"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(reports, 1);
}

TEST(TapeParamReady, WithoutAHookNothingIsReportedAndLateWritesPass) {
  Tensor w = randn({3}, 5);
  ad::ParameterSet params;
  params.add("w", &w);
  Tape tape;
  int reports = 0;
  tape.set_on_param_ready([&](ad::Parameter&, size_t) { ++reports; });
  tape.set_on_param_ready(nullptr);
  tape.backward(loss_with_an_undeclared_write(tape, params[0]));
  EXPECT_EQ(reports, 0);
  EXPECT_TRUE(params[0].has_grad);
}

}  // namespace
}  // namespace qkv
