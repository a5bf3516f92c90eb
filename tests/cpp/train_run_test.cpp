// train::Run: a run stopped and resumed from its checkpoint ends with the same bits as one run straight through;
// the stop flag ends a run after a checkpoint (or at once, before any step); evaluation stops it early; a
// non-finite loss is reported, not saved; options that cannot run are refused.
#include "qkv/train/run.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "nn_testing.h"
#include "qkv/nn/linear.h"
#include "qkv/ops/functional.h"

namespace qkv::train {
namespace {

namespace fs = std::filesystem;
using qkv::testing::BitIdentical;
using qkv::testing::randn;

constexpr int64_t kExamples = 10, kIn = 6, kClasses = 4;

// A linear classifier over kExamples fixed inputs with fixed labels, and everything a Run needs.
struct LinearRun {
  explicit LinearRun(RunOptions o) : rng(3), model(kIn, kClasses, true, rng), params(model), opt(params) {
    x = randn({kExamples, kIn}, 11);
    for (int64_t i = 0; i < kExamples; ++i) labels.push_back(i % kClasses);
    sched.lr = 0.05;
    run = std::make_unique<Run>(params, opt, sched, model, kExamples, o);
  }
  RunHooks hooks() {
    RunHooks h;
    h.forward = [this](const nn::Context& c, const std::vector<int64_t>& rows) {
      Tensor xb = Tensor::zeros({static_cast<int64_t>(rows.size()), kIn});
      std::vector<int64_t> t;
      for (size_t r = 0; r < rows.size(); ++r) {
        for (int64_t j = 0; j < kIn; ++j)
          xb.data()[static_cast<int64_t>(r) * kIn + j] = x.data()[rows[r] * kIn + j];
        t.push_back(labels[static_cast<size_t>(rows[r])]);
      }
      return TeacherForced{model.forward(c, xb), t, static_cast<int64_t>(t.size())};
    };
    return h;
  }
  Rng rng;
  nn::Linear model;
  ad::ParameterSet params;
  AdamW opt;
  LrSchedule sched;
  Tensor x;
  std::vector<int64_t> labels;
  std::unique_ptr<Run> run;
};

RunOptions options(const std::string& dir, int64_t steps) {
  RunOptions o;
  o.steps = steps;
  o.batch_size = 3;  // 10 examples: epochs end on a short batch
  o.seed = 5;
  o.clip = 1.0;
  o.loss.ignore_index = -100;
  o.dir = dir;
  o.model_kind = "linear";
  o.checkpoint_every = 4;
  return o;
}

class RunDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("qkv_train_run_test_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(RunDir, StopAndResumeEndsBitIdenticalToOneRun) {
  LinearRun straight(options(dir_ + "/a", 9));
  const RunResult ra = straight.run->run(straight.hooks());
  EXPECT_EQ(ra.step, 9);
  EXPECT_FALSE(ra.stopped);

  std::atomic<bool> stop{false};
  LinearRun first(options(dir_ + "/b", 9));
  RunHooks h = first.hooks();
  std::vector<int64_t> seen;
  h.on_step = [&](const RunStep& s) {
    seen.push_back(s.step);
    stop = s.step == 5;  // stops after step 5's checkpoint
  };
  const RunResult r1 = first.run->run(h, &stop);
  EXPECT_TRUE(r1.stopped);
  EXPECT_EQ(r1.step, 5);
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2, 3, 4, 5}));  // on_step after every step, in order
  EXPECT_EQ(r1.checkpoint, latest_checkpoint(dir_ + "/b"));

  LinearRun second(options(dir_ + "/b", 9));
  EXPECT_EQ(second.run->resume(), r1.checkpoint);
  EXPECT_EQ(second.run->state().step, 5);
  const RunResult r2 = second.run->run(second.hooks());
  EXPECT_EQ(r2.first_step, 5);
  EXPECT_EQ(r2.step, 9);
  EXPECT_EQ(r2.last_loss, ra.last_loss);
  EXPECT_TRUE(BitIdentical(second.model.weight, straight.model.weight));
  EXPECT_TRUE(BitIdentical(second.model.bias, straight.model.bias));
}

TEST_F(RunDir, StopFlagSetBeforeTheFirstStepWritesNothing) {
  LinearRun s(options(dir_, 4));
  const std::atomic<bool> stop{true};
  const RunResult r = s.run->run(s.hooks(), &stop);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.step, 0);
  EXPECT_EQ(r.checkpoint, "");
  EXPECT_FALSE(fs::exists(dir_));
}

TEST_F(RunDir, EarlyStopEndsWithACheckpoint) {
  RunOptions o = options(dir_, 20);
  o.eval_every = 2;
  o.early_stop = 0.5;
  LinearRun s(o);
  RunHooks h = s.hooks();
  std::vector<int64_t> evaluated;
  h.evaluate = [&](int64_t step) {
    evaluated.push_back(step);
    return step >= 6 ? 0.75 : 0.25;
  };
  const RunResult r = s.run->run(h);
  EXPECT_TRUE(r.early_stopped);
  EXPECT_EQ(r.step, 6);
  EXPECT_EQ(evaluated, (std::vector<int64_t>{2, 4, 6}));
  EXPECT_EQ(fs::path(r.checkpoint).filename().string(), "step-00000006");
}

TEST_F(RunDir, NonFiniteLossIsReportedAndNotSaved) {
  LinearRun s(options(dir_, 6));
  RunHooks h = s.hooks();
  const auto forward = h.forward;
  h.forward = [&](const nn::Context& c, const std::vector<int64_t>& rows) {
    TeacherForced tf = forward(c, rows);
    if (s.run->state().step == 2) tf.logits = ad::scale(tf.logits, NAN);
    return tf;
  };
  const RunResult r = s.run->run(h);
  EXPECT_TRUE(r.diverged);
  EXPECT_EQ(r.step, 2);
  EXPECT_TRUE(std::isnan(r.diverged_loss));
  EXPECT_EQ(latest_checkpoint(dir_), "");  // checkpoint_every 4: nothing was due
}

TEST(TrainRun, RefusesWhatCannotRun) {
  RunOptions o = options("", 3);
  o.context_parallel = true;  // one process
  EXPECT_THROW(LinearRun{o}, std::invalid_argument);
  o = options("", 3);
  o.batch_size = 0;
  EXPECT_THROW(LinearRun{o}, std::invalid_argument);
  LinearRun s(options("", 3));
  EXPECT_THROW(s.run->run(RunHooks{}), std::invalid_argument);  // no forward
  Rng rng(1);
  nn::Linear m(2, 2, true, rng);
  ad::ParameterSet p(m);
  AdamW opt(p);
  LrSchedule sched;
  EXPECT_THROW(train::Run(p, opt, sched, m, 0, options("", 3)), std::invalid_argument);  // no examples
}

}  // namespace
}  // namespace qkv::train
