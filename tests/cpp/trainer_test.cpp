// train::Trainer: one step equals the hand-written zero_grad / forward / backward / clip / lr / step sequence bit for
// bit; a non-finite loss makes no update; a missing or non-scalar loss is refused. The loop around the steps
// (hooks, stopping) is train::Run's: tests/cpp/train_run_test.cpp.
#include "qkv/train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "nn_testing.h"
#include "qkv/nn/linear.h"
#include "qkv/ops/functional.h"
#include "qkv/train/loss.h"

namespace qkv::train {
namespace {

using qkv::testing::BitIdentical;
using qkv::testing::randn;

ad::Var loss_of(const nn::Linear& m, const nn::Context& c, const Tensor& x) {
  return ad::mean(ad::mul(m.forward(c, x), m.forward(c, x)));
}

TEST(Trainer, StepEqualsTheHandWrittenSequenceBitForBit) {
  Rng r1(7), r2(7);
  nn::Linear a(6, 4, true, r1), b(6, 4, true, r2);
  ad::ParameterSet pa(a), pb(b);
  AdamW oa(pa), ob(pb);
  LrSchedule sched;
  sched.kind = LrSchedule::Kind::kWarmupCosine;
  sched.lr = 0.05;
  sched.warmup = 2;
  sched.total_steps = 5;
  Rng drop(1);
  Trainer trainer(pa, oa, sched, drop, /*clip=*/0.5);
  ad::Tape tape;
  for (int64_t step = 1; step <= 5; ++step) {
    const Tensor x = randn({3, 6}, 10 + static_cast<uint64_t>(step));
    const StepResult r = trainer.step(step, [&](nn::Context& g) { return loss_of(a, g, x); });
    pb.zero_grad();
    tape.clear();
    const nn::Context c(tape, pb);
    const ad::Var l = loss_of(b, c, x);
    tape.backward(l);
    clip_grad_norm(pb, 0.5);
    ob.set_lr(sched.at(step));
    ob.step();
    EXPECT_TRUE(r.finite);
    EXPECT_EQ(r.loss, static_cast<double>(l.value.item()));
    EXPECT_EQ(r.lr, sched.at(step));
    EXPECT_TRUE(BitIdentical(a.weight, b.weight)) << "step " << step;
    EXPECT_TRUE(BitIdentical(a.bias, b.bias)) << "step " << step;
  }
}

TEST(Trainer, NonFiniteLossMakesNoUpdate) {
  Rng rng(3);
  nn::Linear m(4, 2, true, rng);
  ad::ParameterSet ps(m);
  SGD opt(ps, SgdOptions{});
  LrSchedule sched;
  Rng drop(1);
  Trainer trainer(ps, opt, sched, drop);
  const Tensor before = m.weight.clone();
  Tensor x = randn({2, 4}, 5);
  x.data()[0] = std::numeric_limits<float>::infinity();
  const StepResult r = trainer.step(1, [&](nn::Context& g) { return loss_of(m, g, x); });
  EXPECT_FALSE(r.finite);
  EXPECT_TRUE(BitIdentical(m.weight, before));
}

TEST(Trainer, StepRefusesAMissingOrNonScalarLoss) {
  Rng rng(4);
  nn::Linear m(4, 2, true, rng);
  ad::ParameterSet ps(m);
  SGD opt(ps, SgdOptions{});
  LrSchedule sched;
  Rng drop(1);
  Trainer trainer(ps, opt, sched, drop);
  const Tensor before = m.weight.clone();
  const Tensor x = randn({2, 4}, 6);
  EXPECT_THROW(trainer.step(1, Trainer::LossFn{}), std::invalid_argument);
  try {
    trainer.step(2, [&](nn::Context& g) { return m.forward(g, x); });  // (2, 2): not a scalar
    ADD_FAILURE() << "a (2, 2) loss was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[Trainer] the loss of step 2 must be a scalar"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(BitIdentical(m.weight, before));
}

}  // namespace
}  // namespace qkv::train
