// Tests of the optimizers (SGD with momentum / Nesterov / weight decay, Adam, AdamW) against update formulas
// written out in double, their checkpoint state, clip_grad_norm and the learning-rate schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops_testing.h"
#include "qkv/train/optim.h"
#include "qkv/train/schedule.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::ThrowsArg;
using ad::ParameterSet;
using DVec = std::vector<double>;

// A float32 update chain against the same formulas in double: a few ulps per step.
constexpr testing::Tol kStepTol{1e-7, 1e-6};

// Sets p's gradient (marks it present), as a backward pass would.
void set_grad(ad::Parameter& p, const DVec& g) {
  for (size_t i = 0; i < g.size(); ++i) p.grad.data()[i] = static_cast<float>(g[i]);
  p.has_grad = true;
}

const std::vector<DVec> kGrads{{0.5, -1.0, 2.0}, {-0.25, 0.75, 1.0}, {1.5, 0.1, -0.3}};
const DVec kStart{1.0, -2.0, 0.5};

Tensor start_tensor() { return Tensor::from_vector({3}, std::vector<float>(kStart.begin(), kStart.end())); }

TEST(SGD, PlainMomentumNesterovAndWeightDecayFollowTorchFormulas) {
  struct Cfg {
    double momentum, dampening, wd;
    bool nesterov;
  };
  for (const Cfg c : {Cfg{0, 0, 0, false}, Cfg{0.9, 0, 0, false}, Cfg{0.9, 0.1, 0.01, false}, Cfg{0.8, 0, 0.05, true}}) {
    Tensor w = start_tensor();
    ParameterSet ps;
    ps.add("w", &w);
    train::SgdOptions o;
    o.lr = 0.1;
    o.momentum = c.momentum;
    o.dampening = c.dampening;
    o.weight_decay = c.wd;
    o.nesterov = c.nesterov;
    train::SGD opt(ps, o);
    DVec p = kStart, buf(3, 0.0);
    for (size_t s = 0; s < kGrads.size(); ++s) {
      set_grad(ps[0], kGrads[s]);
      opt.step();
      for (int i = 0; i < 3; ++i) {
        double d = kGrads[s][i] + c.wd * p[i];
        if (c.momentum != 0) {
          buf[i] = s == 0 ? d : c.momentum * buf[i] + (1 - c.dampening) * d;
          d = c.nesterov ? d + c.momentum * buf[i] : buf[i];
        }
        p[i] -= 0.1 * d;
      }
      EXPECT_TRUE(AllClose(w, p, kStepTol)) << "momentum " << c.momentum << " step " << s;
    }
  }
}

DVec adam_reference(bool decoupled, double wd, int steps) {
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  DVec p = kStart, m(3, 0.0), v(3, 0.0);
  for (int s = 1; s <= steps; ++s) {
    for (int i = 0; i < 3; ++i) {
      double g = kGrads[s - 1][i];
      if (decoupled) p[i] *= 1 - lr * wd;
      else g += wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double mhat = m[i] / (1 - std::pow(b1, s)), vhat = v[i] / (1 - std::pow(b2, s));
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
  return p;
}

TEST(Adam, AdamAndAdamWMatchTheTextbookUpdateOverThreeSteps) {
  for (bool decoupled : {false, true}) {
    for (double wd : {0.0, 0.1}) {
      Tensor w = start_tensor();
      ParameterSet ps;
      ps.add("w", &w);
      train::AdamOptions o;
      o.lr = 0.01;
      o.weight_decay = wd;
      train::Adam opt(ps, o, decoupled);
      for (int s = 1; s <= 3; ++s) {
        set_grad(ps[0], kGrads[s - 1]);
        opt.step();
        EXPECT_TRUE(AllClose(w, adam_reference(decoupled, wd, s), kStepTol))
            << "decoupled " << decoupled << " wd " << wd << " step " << s;
      }
    }
  }
}

TEST(Adam, FirstStepMovesEachWeightByAboutLr) {
  // m̂ = g and v̂ = g² after one step, so the update is lr·g/(|g| + eps) = ±lr.
  Tensor w = start_tensor();
  ParameterSet ps;
  ps.add("w", &w);
  train::AdamW opt(ps, [] {
    train::AdamOptions o;
    o.lr = 0.5;
    o.weight_decay = 0.0;
    return o;
  }());
  set_grad(ps[0], kGrads[0]);
  opt.step();
  EXPECT_TRUE(AllClose(w, DVec{0.5, -1.5, 0.0}, {1e-6, 1e-6}));
}

TEST(Optimizer, ParametersWithoutGradientAreSkipped) {
  Tensor a = start_tensor(), b = start_tensor();
  ParameterSet ps;
  ps.add("a", &a);
  ps.add("b", &b);
  train::AdamW opt(ps);
  ps.zero_grad();
  set_grad(ps[0], kGrads[0]);
  opt.step();
  EXPECT_TRUE(AllClose(b, kStart, testing::kExact));
  EXPECT_FALSE(AllClose(a, kStart, testing::kExact));
  const nn::StateDict s = opt.state_dict();
  EXPECT_EQ(s.count("a.step"), 1u);
  EXPECT_EQ(s.count("b.step"), 0u);
  EXPECT_EQ(s.at("a.step").item(), 1.0f);
}

TEST(Optimizer, StateRoundTripContinuesBitIdentically) {
  for (int kind = 0; kind < 2; ++kind) {
    Tensor w1 = start_tensor(), w2;
    ParameterSet p1, p2;
    p1.add("w", &w1);
    std::unique_ptr<train::Optimizer> o1, o2;
    train::SgdOptions so;
    so.lr = 0.1;
    so.momentum = 0.9;
    if (kind == 0) o1 = std::make_unique<train::AdamW>(p1);
    else o1 = std::make_unique<train::SGD>(p1, so);
    for (int s = 0; s < 2; ++s) {
      set_grad(p1[0], kGrads[s]);
      o1->step();
    }
    w2 = w1.clone();
    p2.add("w", &w2);
    if (kind == 0) o2 = std::make_unique<train::AdamW>(p2);
    else o2 = std::make_unique<train::SGD>(p2, so);
    o2->load_state_dict(o1->state_dict());
    set_grad(p1[0], kGrads[2]);
    set_grad(p2[0], kGrads[2]);
    o1->step();
    o2->step();
    EXPECT_TRUE(testing::AllClose(w2, w1, testing::kExact)) << kind;
  }
}

TEST(Optimizer, BadStateIsRejectedNamingTheOptimizer) {
  Tensor w = start_tensor();
  ParameterSet ps;
  ps.add("w", &w);
  train::Adam adam(ps, {});
  train::SGD sgd(ps, {});
  const Tensor v3 = Tensor::zeros({3}), one = Tensor::ones({1});
  EXPECT_TRUE(ThrowsArg([&] { adam.load_state_dict({{"x.exp_avg", v3}}); }, "[Adam.load_state_dict]"));
  EXPECT_TRUE(ThrowsArg([&] { adam.load_state_dict({{"w.exp_avg", Tensor::zeros({4})}}); }, "[Adam.load_state_dict]"));
  EXPECT_TRUE(ThrowsArg([&] { adam.load_state_dict({{"w.exp_avg", v3}}); }, "[Adam.load_state_dict]"));  // partial
  EXPECT_TRUE(ThrowsArg([&] { adam.load_state_dict({{"w.bogus", v3}}); }, "[Adam.load_state_dict]"));
  EXPECT_TRUE(ThrowsArg([&] { adam.load_state_dict({{"w.step", Tensor::full({1}, 1.5f)}, {"w.exp_avg", v3},
                                                    {"w.exp_avg_sq", v3}}); },
                        "[Adam.load_state_dict]"));
  EXPECT_TRUE(ThrowsArg([&] { adam.load_state_dict({{"nodot", v3}}); }, "[Adam.load_state_dict]"));
  EXPECT_TRUE(ThrowsArg([&] { sgd.load_state_dict({{"w.exp_avg", v3}}); }, "[SGD.load_state_dict]"));
  adam.load_state_dict({{"w.step", one}, {"w.exp_avg", v3}, {"w.exp_avg_sq", v3}});  // complete: accepted
}

TEST(Optimizer, BadOptionsThrow) {
  Tensor w = start_tensor();
  ParameterSet ps;
  ps.add("w", &w);
  train::AdamOptions a;
  a.beta1 = 1.0;
  EXPECT_TRUE(ThrowsArg([&] { train::Adam(ps, a); }, "[Adam]"));
  a = {};
  a.lr = -1;
  EXPECT_TRUE(ThrowsArg([&] { train::AdamW(ps, a); }, "[AdamW]"));
  train::SgdOptions s;
  s.nesterov = true;
  EXPECT_TRUE(ThrowsArg([&] { train::SGD(ps, s); }, "[SGD]"));
  train::SGD ok(ps, {});
  EXPECT_TRUE(ThrowsArg([&] { ok.set_lr(std::nan("")); }, "[SGD]"));
}

// --- clipping ----------------------------------------------------------------------------------------------------

TEST(ClipGradNorm, ScalesDownOnlyAboveMaxNorm) {
  Tensor a = Tensor::zeros({2}), b = Tensor::zeros({1}), c = Tensor::zeros({1});
  ParameterSet ps;
  ps.add("a", &a);
  ps.add("b", &b);
  ps.add("c", &c);
  set_grad(ps[0], {3.0, 0.0});
  set_grad(ps[1], {4.0});
  ps[2].grad.data()[0] = 100.0f;  // has_grad false: ignored
  EXPECT_DOUBLE_EQ(train::clip_grad_norm(ps, 10.0), 5.0);
  EXPECT_TRUE(AllClose(ps[0].grad, DVec{3.0, 0.0}, testing::kExact));
  const double total = train::clip_grad_norm(ps, 1.0);
  EXPECT_DOUBLE_EQ(total, 5.0);
  const double coef = 1.0 / (5.0 + 1e-6);
  EXPECT_TRUE(AllClose(ps[0].grad, DVec{3.0 * coef, 0.0}, {1e-7, 1e-6}));
  EXPECT_TRUE(AllClose(ps[1].grad, DVec{4.0 * coef}, {1e-7, 1e-6}));
  EXPECT_NEAR(train::clip_grad_norm(ps, 100.0, INFINITY), 4.0 * coef, 1e-6);
  EXPECT_TRUE(ThrowsArg([&] { train::clip_grad_norm(ps, 0.0); }, "[clip_grad_norm]"));
  EXPECT_TRUE(ThrowsArg([&] { train::clip_grad_norm(ps, 1.0, 1.0); }, "[clip_grad_norm]"));
}

// --- schedules ---------------------------------------------------------------------------------------------------

TEST(Schedule, InverseSqrtWarmsUpLinearlyPeaksAtWarmupThenDecays) {
  const int64_t d = 512, w = 4000;
  EXPECT_NEAR(train::inverse_sqrt_lr(1, d, w), std::pow(512.0, -0.5) * std::pow(4000.0, -1.5), 1e-15);
  EXPECT_NEAR(train::inverse_sqrt_lr(w, d, w), 1.0 / std::sqrt(512.0 * 4000.0), 1e-15);
  EXPECT_NEAR(train::inverse_sqrt_lr(16000, d, w), std::pow(512.0, -0.5) / std::sqrt(16000.0), 1e-15);
  EXPECT_LT(train::inverse_sqrt_lr(w - 1, d, w), train::inverse_sqrt_lr(w, d, w));
  EXPECT_LT(train::inverse_sqrt_lr(w + 1, d, w), train::inverse_sqrt_lr(w, d, w));
  EXPECT_NEAR(train::inverse_sqrt_lr(10, 64, 100, 2.0), 2.0 * train::inverse_sqrt_lr(10, 64, 100), 1e-15);
  EXPECT_TRUE(ThrowsArg([] { train::inverse_sqrt_lr(0, 512, 10); }, "[inverse_sqrt_lr]"));
  EXPECT_TRUE(ThrowsArg([] { train::inverse_sqrt_lr(1, 512, 10, 0.0); }, "[inverse_sqrt_lr]"));
}

TEST(Schedule, WarmupCosineEndpointsAndMidpoint) {
  EXPECT_DOUBLE_EQ(train::warmup_cosine_lr(5, 1.0, 10, 110), 0.5);
  EXPECT_DOUBLE_EQ(train::warmup_cosine_lr(10, 1.0, 10, 110), 1.0);
  EXPECT_NEAR(train::warmup_cosine_lr(60, 1.0, 10, 110, 0.2), 0.6, 1e-12);
  EXPECT_DOUBLE_EQ(train::warmup_cosine_lr(110, 1.0, 10, 110, 0.2), 0.2);
  EXPECT_DOUBLE_EQ(train::warmup_cosine_lr(500, 1.0, 10, 110, 0.2), 0.2);
  EXPECT_DOUBLE_EQ(train::warmup_cosine_lr(1, 1.0, 0, 0), 0.0);  // no room to decay: min_lr
  EXPECT_TRUE(ThrowsArg([] { train::warmup_cosine_lr(1, 1.0, 10, 5); }, "[warmup_cosine_lr]"));
  EXPECT_TRUE(ThrowsArg([] { train::warmup_cosine_lr(1, 0.1, 1, 5, 0.2); }, "[warmup_cosine_lr]"));
}

TEST(Schedule, ByName) {
  train::LrSchedule s;
  s.kind = train::schedule_kind_from_string("cosine");
  s.lr = 1.0;
  s.warmup = 10;
  s.total_steps = 110;
  EXPECT_DOUBLE_EQ(s.at(5), 0.5);
  s.kind = train::schedule_kind_from_string("inverse_sqrt");
  s.d_model = 512;
  EXPECT_DOUBLE_EQ(s.at(3), train::inverse_sqrt_lr(3, 512, 10));
  s.kind = train::schedule_kind_from_string("constant");
  EXPECT_DOUBLE_EQ(s.at(99), 1.0);
  EXPECT_TRUE(ThrowsArg([] { train::schedule_kind_from_string("linear"); }, "[LrSchedule]"));
  EXPECT_TRUE(ThrowsArg([&] { s.at(0); }, "[LrSchedule]"));
}

}  // namespace
}  // namespace qkv
