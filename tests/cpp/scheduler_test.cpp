// decode::Scheduler: requests decoded together get the tokens each gets alone (greedy and seeded sampling, a tiny
// random model and SmolLM2 as stored), join while others run, reuse a cached prompt prefix, report log-probabilities
// equal to a float64 log-softmax of a plain forward; cancel, queue limit, argument checks and both shutdowns.
#include "qkv/decode/scheduler.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "qkv/core/rng.h"
#include "smollm2.h"

namespace qkv {
namespace {

using decode::FinishReason;
using decode::RequestOptions;
using decode::RequestResult;
using decode::Scheduler;
using decode::SchedulerOptions;
using decode::TokenEvent;

constexpr int64_t kVocab = 61;
constexpr double kLogprobTolerance = 1e-4;

std::unique_ptr<models::LlamaForCausalLM> small_model(int64_t context = 96) {
  models::LlamaConfig c;
  c.vocab_size = kVocab;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = context;
  c.layer_sliding.assign(2, false);
  Rng rng(11);
  auto m = std::make_unique<models::LlamaForCausalLM>(c, rng);
  m->eval();
  return m;
}

std::vector<int64_t> random_prompt(int64_t n, uint64_t seed, int64_t vocab) {
  Rng rng(seed);
  std::vector<int64_t> p;
  for (int64_t i = 0; i < n; ++i)
    p.push_back(static_cast<int64_t>(rng.uniform() * static_cast<float>(vocab)) % vocab);
  return p;
}

// One request's events and result, filled by the scheduler's thread.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<TokenEvent> events;
  RequestResult result;
  bool finished = false;
  int done_calls = 0;

  Scheduler::OnToken on_token() {
    return [this](const TokenEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(e);
      cv.notify_all();
      return true;
    };
  }
  Scheduler::OnDone on_done() {
    return [this](const RequestResult& r) {
      std::lock_guard<std::mutex> lock(mu);
      result = r;
      finished = true;
      ++done_calls;
      cv.notify_all();
    };
  }
  RequestResult wait() {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return finished; })) << "no on_done in 120 s";
    return result;
  }
  void wait_tokens(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return events.size() >= n || finished; }));
  }
  std::vector<int64_t> ids() {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<int64_t> out;
    for (const TokenEvent& e : events) out.push_back(e.id);
    return out;
  }
};

decode::Generation alone(const models::LlamaForCausalLM& m, const std::vector<int64_t>& prompt,
                         const RequestOptions& r, int64_t page_size) {
  decode::GenerateOptions o;
  o.max_new_tokens = r.max_new_tokens;
  o.sampling = r.sampling;
  o.stop_ids = r.stop_ids;
  o.page_size = page_size;
  return decode::generate(m, prompt, o);
}

// n prompts of different lengths submitted at once (max_batch n) get the tokens each gets alone.
void expect_batched_equals_alone(const models::LlamaForCausalLM& m, const std::vector<std::vector<int64_t>>& prompts,
                                 const std::vector<RequestOptions>& options, int64_t page_size) {
  SchedulerOptions so;
  so.max_batch = static_cast<int64_t>(prompts.size());
  so.page_size = page_size;
  Scheduler s(m, so);
  std::vector<std::unique_ptr<Collector>> got;
  for (size_t i = 0; i < prompts.size(); ++i) {
    got.push_back(std::make_unique<Collector>());
    s.submit(prompts[i], options[i], got.back()->on_token(), got.back()->on_done());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i) + " of prompt length " + std::to_string(prompts[i].size()));
    const RequestResult r = got[i]->wait();
    const decode::Generation want = alone(m, prompts[i], options[i], page_size);
    EXPECT_EQ(r.generation.tokens, want.tokens);
    EXPECT_EQ(r.generation.finish, want.finish);
    EXPECT_EQ(got[i]->ids(), r.generation.tokens);
    EXPECT_EQ(r.prompt_tokens, static_cast<int64_t>(prompts[i].size()));
    EXPECT_EQ(got[i]->done_calls, 1);
  }
  s.shutdown(true);
  EXPECT_GT(s.stats().steps, 0);
}

TEST(Scheduler, EightGreedyRequestsTogetherGetTheirAloneTokens) {
  const auto m = small_model();
  std::vector<std::vector<int64_t>> prompts;
  std::vector<RequestOptions> options;
  const int64_t lengths[] = {1, 3, 4, 5, 9, 17, 30, 41};
  for (int64_t i = 0; i < 8; ++i) {
    prompts.push_back(random_prompt(lengths[i], 100 + static_cast<uint64_t>(i), kVocab));
    RequestOptions o;
    o.max_new_tokens = 6 + 3 * i;  // rows leave the batch at different steps
    options.push_back(o);
  }
  for (int64_t page : {1, 4, 16}) {
    SCOPED_TRACE("page_size " + std::to_string(page));
    expect_batched_equals_alone(*m, prompts, options, page);
  }
}

TEST(Scheduler, SeededSamplingIsTheSameAloneAndBatched) {
  const auto m = small_model();
  std::vector<std::vector<int64_t>> prompts;
  std::vector<RequestOptions> options;
  for (int64_t i = 0; i < 5; ++i) {
    prompts.push_back(random_prompt(2 + 7 * i, 200 + static_cast<uint64_t>(i), kVocab));
    RequestOptions o;
    o.max_new_tokens = 12;
    o.sampling.temperature = 0.9f;
    o.sampling.top_k = i % 2 == 0 ? 0 : 20;
    o.sampling.top_p = i == 3 ? 0.8f : 1.0f;
    o.sampling.seed = 7 + static_cast<uint64_t>(i);
    options.push_back(o);
  }
  expect_batched_equals_alone(*m, prompts, options, 4);
}

TEST(Scheduler, StopIdsAndContextEndRepliesAsGenerateDoes) {
  const auto m = small_model(40);
  std::vector<std::vector<int64_t>> prompts;
  std::vector<RequestOptions> options;
  for (int64_t i = 0; i < 4; ++i) {
    prompts.push_back(random_prompt(10 + 8 * i, 300 + static_cast<uint64_t>(i), kVocab));
    RequestOptions o;
    o.max_new_tokens = 30;  // past the context of 40 for the longer prompts
    const decode::Generation free_run = alone(*m, prompts.back(), o, 4);
    if (i % 2 == 1 && free_run.tokens.size() > 3) o.stop_ids = {free_run.tokens[3]};
    options.push_back(o);
  }
  expect_batched_equals_alone(*m, prompts, options, 4);
}

TEST(Scheduler, RequestsArrivingWhileOthersRunGetTheirAloneTokens) {
  const auto m = small_model();
  SchedulerOptions so;
  so.max_batch = 3;  // later requests wait for a place
  so.page_size = 4;
  Scheduler s(*m, so);
  RequestOptions o;
  o.max_new_tokens = 20;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::unique_ptr<Collector>> got;
  for (int64_t i = 0; i < 6; ++i) {
    prompts.push_back(random_prompt(3 + 5 * i, 400 + static_cast<uint64_t>(i), kVocab));
    got.push_back(std::make_unique<Collector>());
    s.submit(prompts.back(), o, got.back()->on_token(), got.back()->on_done());
    got.back()->wait_tokens(static_cast<size_t>(2 + i));  // the next one joins mid-reply
  }
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(got[i]->wait().generation.tokens, alone(*m, prompts[i], o, 4).tokens) << "request " << i;
}

TEST(Scheduler, LogprobsEqualAFloat64LogSoftmaxOfAPlainForward) {
  const auto m = small_model();
  SchedulerOptions so;
  so.max_batch = 4;
  so.page_size = 4;
  Scheduler s(*m, so);
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::unique_ptr<Collector>> got;
  for (int64_t i = 0; i < 3; ++i) {
    prompts.push_back(random_prompt(4 + 6 * i, 500 + static_cast<uint64_t>(i), kVocab));
    RequestOptions o;
    o.max_new_tokens = 5;
    o.top_logprobs = i == 0 ? 0 : 5;
    o.sampling.temperature = i == 2 ? 1.0f : 0.0f;
    got.push_back(std::make_unique<Collector>());
    s.submit(prompts.back(), o, got.back()->on_token(), got.back()->on_done());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    got[i]->wait();
    std::vector<int64_t> seq = prompts[i];
    for (const TokenEvent& e : got[i]->events) {
      const Tensor logits = m->logits(Ids{seq, {1, static_cast<int64_t>(seq.size())}});
      const float* last = logits.data() + (logits.size(1) - 1) * kVocab;
      double top = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < kVocab; ++j) top = std::max(top, static_cast<double>(last[j]));
      for (int64_t j = 0; j < kVocab; ++j) sum += std::exp(static_cast<double>(last[j]) - top);
      auto logp = [&](int64_t j) { return static_cast<double>(last[j]) - top - std::log(sum); };
      EXPECT_NEAR(e.logprob, logp(e.id), kLogprobTolerance);
      ASSERT_EQ(e.top.size(), i == 0 ? 0u : 5u);
      for (size_t k = 0; k < e.top.size(); ++k) {
        EXPECT_NEAR(e.top[k].second, logp(e.top[k].first), kLogprobTolerance);
        if (k > 0) {
          EXPECT_GE(e.top[k - 1].second, e.top[k].second);
        }
      }
      if (i == 1) {
        EXPECT_EQ(e.top[0].first, e.id);  // greedy: the chosen id is the most likely
      }
      seq.push_back(e.id);
    }
  }
}

TEST(Scheduler, PromptSharingTwoPagesReusesThemAndGetsTheRecomputedTokens) {
  const auto m = small_model();
  SchedulerOptions so;
  so.max_batch = 2;
  so.page_size = 4;
  Scheduler s(*m, so);
  RequestOptions o;
  o.max_new_tokens = 6;
  const std::vector<int64_t> first = random_prompt(10, 600, kVocab);
  Collector a;
  s.submit(first, o, a.on_token(), a.on_done());
  EXPECT_EQ(a.wait().cached_prompt_tokens, 0);
  // Shares 8 tokens (2 pages) with the first prompt, then differs.
  std::vector<int64_t> second(first.begin(), first.begin() + 8);
  for (int64_t t : random_prompt(5, 601, kVocab)) second.push_back(t);
  Collector b;
  s.submit(second, o, b.on_token(), b.on_done());
  const RequestResult rb = b.wait();
  EXPECT_EQ(rb.cached_prompt_tokens, 8);
  EXPECT_EQ(rb.generation.tokens, alone(*m, second, o, 4).tokens);
  // A chat's next turn: the first prompt, its reply and more; the cached pages cover the prompt and the reply.
  std::vector<int64_t> third = first;
  const std::vector<int64_t> reply = a.wait().generation.tokens;
  third.insert(third.end(), reply.begin(), reply.end());
  third.push_back(3);
  Collector c;
  s.submit(third, o, c.on_token(), c.on_done());
  const RequestResult rc = c.wait();
  EXPECT_EQ(rc.cached_prompt_tokens, 12);  // 15 positions of the first request held, 3 whole pages
  EXPECT_EQ(rc.generation.tokens, alone(*m, third, o, 4).tokens);
  s.shutdown(true);
  EXPECT_GT(s.stats().kv_pages_used, 0);  // the prefix cache keeps them
}

TEST(Scheduler, PrefixReuseOffComputesEveryPrompt) {
  const auto m = small_model();
  SchedulerOptions so;
  so.page_size = 4;
  so.reuse_prefix = false;
  Scheduler s(*m, so);
  RequestOptions o;
  o.max_new_tokens = 3;
  const std::vector<int64_t> p = random_prompt(13, 700, kVocab);
  for (int i = 0; i < 2; ++i) {
    Collector c;
    s.submit(p, o, c.on_token(), c.on_done());
    EXPECT_EQ(c.wait().cached_prompt_tokens, 0);
  }
  s.shutdown(true);
  EXPECT_EQ(s.stats().kv_pages_used, 0);
}

// A gate the scheduler's thread waits at inside a callback, so the test knows what it is doing.
struct Gate {
  std::promise<void> entered, open;
  std::shared_future<void> opened = open.get_future().share();
  bool once = false;
  Scheduler::OnToken hold() {
    return [this](const TokenEvent&) {
      if (!once) {
        once = true;
        entered.set_value();
        opened.wait();
      }
      return true;
    };
  }
};

void cancel_queued_and_running(bool reuse) {
  SCOPED_TRACE(reuse ? "prefix cache" : "no prefix cache");
  const auto m = small_model();
  SchedulerOptions so;
  so.max_batch = 1;
  so.page_size = 4;
  so.reuse_prefix = reuse;
  Scheduler s(*m, so);
  RequestOptions o;
  o.max_new_tokens = 80;
  Gate gate;
  Collector a, b;
  const uint64_t ia = s.submit(random_prompt(9, 800, kVocab), o, gate.hold(), a.on_done());
  gate.entered.get_future().wait();  // a runs; b waits in the queue (max_batch 1)
  const uint64_t ib = s.submit(random_prompt(5, 801, kVocab), o, b.on_token(), b.on_done());
  EXPECT_NE(ia, ib);
  s.cancel(ib);
  s.cancel(ia);
  s.cancel(ia + ib + 100);  // unknown: ignored
  gate.open.set_value();
  const RequestResult ra = a.wait(), rb = b.wait();
  EXPECT_EQ(rb.generation.finish, FinishReason::kCancelled);
  EXPECT_TRUE(rb.generation.tokens.empty());
  EXPECT_TRUE(b.events.empty());
  EXPECT_EQ(ra.generation.finish, FinishReason::kCancelled);
  EXPECT_LT(ra.generation.tokens.size(), 80u);
  s.cancel(ia);  // finished: ignored
  s.shutdown(true);
  // The prefix cache keeps the whole pages of a's 9 prompt positions and the n - 1 tokens fed back; nothing else.
  const auto n = static_cast<int64_t>(ra.generation.tokens.size());
  EXPECT_EQ(s.stats().kv_pages_used, reuse ? (9 + n - 1) / 4 : 0);
  EXPECT_EQ(s.stats().running, 0);
  EXPECT_EQ(a.done_calls, 1);
  EXPECT_EQ(b.done_calls, 1);
}

TEST(Scheduler, CancelEndsAQueuedAndARunningRequestAndReturnsTheirPages) {
  cancel_queued_and_running(false);
  cancel_queued_and_running(true);
}

TEST(Scheduler, OnTokenReturningFalseCancelsTheRequest) {
  const auto m = small_model();
  Scheduler s(*m, SchedulerOptions{});
  RequestOptions o;
  o.max_new_tokens = 10;
  Collector c;
  int seen = 0;
  s.submit({1, 2, 3}, o, [&](const TokenEvent&) { return ++seen < 3; }, c.on_done());
  const RequestResult r = c.wait();
  EXPECT_EQ(r.generation.finish, FinishReason::kCancelled);
  EXPECT_EQ(r.generation.tokens.size(), 3u);
}

TEST(Scheduler, ZeroNewTokensEndsAtOnceWithLength) {
  const auto m = small_model();
  Scheduler s(*m, SchedulerOptions{});
  RequestOptions o;
  o.max_new_tokens = 0;
  Collector c;
  s.submit({1, 2}, o, c.on_token(), c.on_done());
  const RequestResult r = c.wait();
  EXPECT_EQ(r.generation.finish, FinishReason::kLength);
  EXPECT_TRUE(r.generation.tokens.empty());
}

TEST(Scheduler, QueueFullPastMaxQueued) {
  const auto m = small_model();
  SchedulerOptions so;
  so.max_batch = 1;
  so.max_queued = 2;
  Scheduler s(*m, so);
  RequestOptions o;
  o.max_new_tokens = 4;
  Gate gate;
  Collector a, b, c;
  s.submit({1, 2}, o, gate.hold(), a.on_done());
  gate.entered.get_future().wait();  // the scheduler's thread is in a's callback: nothing leaves the queue
  s.submit({3}, o, b.on_token(), b.on_done());
  s.submit({4}, o, c.on_token(), c.on_done());
  EXPECT_THROW(s.submit({5}, o, {}, {}), decode::QueueFull);
  gate.open.set_value();
  EXPECT_EQ(a.wait().generation.tokens.size(), 4u);
  EXPECT_EQ(b.wait().generation.tokens.size(), 4u);
  EXPECT_EQ(c.wait().generation.tokens.size(), 4u);
}

TEST(Scheduler, MaxQueuedZeroAcceptsOnlyWhileTheBatchHasAPlace) {
  const auto m = small_model();
  SchedulerOptions so;
  so.max_batch = 2;
  so.max_queued = 0;
  Scheduler s(*m, so);
  RequestOptions o;
  o.max_new_tokens = 3;
  Gate gate;
  Collector a, b;
  s.submit({1, 2}, o, gate.hold(), a.on_done());
  gate.entered.get_future().wait();  // a runs: one place left
  s.submit({3}, o, b.on_token(), b.on_done());
  EXPECT_THROW(s.submit({4}, o, {}, {}), decode::QueueFull);
  gate.open.set_value();
  EXPECT_EQ(a.wait().generation.tokens.size(), 3u);
  EXPECT_EQ(b.wait().generation.tokens.size(), 3u);
}

TEST(Scheduler, InvalidArgumentsAreRefusedAtSubmit) {
  const auto m = small_model(32);
  SchedulerOptions so;
  so.page_size = 4;
  so.kv_tokens = 24;  // 6 pages
  Scheduler s(*m, so);
  RequestOptions ok;
  ok.max_new_tokens = 4;
  auto bad = [&](std::vector<int64_t> prompt, RequestOptions o) {
    EXPECT_THROW(s.submit(std::move(prompt), o, {}, {}), std::invalid_argument);
  };
  bad({}, ok);
  bad({1, kVocab}, ok);
  bad({-1}, ok);
  bad(std::vector<int64_t>(32, 1), ok);  // fills the context
  RequestOptions o = ok;
  o.max_new_tokens = -1;
  bad({1}, o);
  o = ok;
  o.sampling.temperature = -1.0f;
  bad({1}, o);
  o = ok;
  o.sampling.top_p = 0.0f;
  bad({1}, o);
  o = ok;
  o.stop_ids = {kVocab};
  bad({1}, o);
  o = ok;
  o.top_logprobs = -2;
  bad({1}, o);
  bad(std::vector<int64_t>(22, 1), ok);  // 22 + 4 - 1 positions need 7 pages of the 6
  Collector fits;
  s.submit(std::vector<int64_t>(21, 1), ok, fits.on_token(), fits.on_done());  // 24 positions: 6 pages
  EXPECT_EQ(fits.wait().generation.tokens.size(), 4u);
  s.shutdown(true);
  EXPECT_THROW(s.submit({1}, ok, {}, {}), std::runtime_error);
  SchedulerOptions b;
  b.max_batch = 0;
  EXPECT_THROW(Scheduler(*m, b), std::invalid_argument);
  b = SchedulerOptions{};
  b.page_size = 0;
  EXPECT_THROW(Scheduler(*m, b), std::invalid_argument);
  b = SchedulerOptions{};
  b.kv_tokens = -1;
  EXPECT_THROW(Scheduler(*m, b), std::invalid_argument);
  b = SchedulerOptions{};
  b.max_queued = -1;
  EXPECT_THROW(Scheduler(*m, b), std::invalid_argument);
  b = SchedulerOptions{};
  b.threads = -1;
  EXPECT_THROW(Scheduler(*m, b), std::invalid_argument);
}

TEST(Scheduler, SmallKvBudgetMakesRequestsWaitNotFail) {
  const auto m = small_model();
  SchedulerOptions so;
  so.max_batch = 4;
  so.page_size = 4;
  so.kv_tokens = 40;  // room for about one request at a time
  Scheduler s(*m, so);
  RequestOptions o;
  o.max_new_tokens = 12;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::unique_ptr<Collector>> got;
  for (int64_t i = 0; i < 4; ++i) {
    prompts.push_back(random_prompt(10 + i, 900 + static_cast<uint64_t>(i), kVocab));
    got.push_back(std::make_unique<Collector>());
    s.submit(prompts.back(), o, got.back()->on_token(), got.back()->on_done());
  }
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(got[i]->wait().generation.tokens, alone(*m, prompts[i], o, 4).tokens) << "request " << i;
  s.shutdown(true);
  EXPECT_LE(s.stats().kv_pages_used, s.stats().kv_pages_total);
}

TEST(Scheduler, ShutdownTrueFinishesEveryRequest) {
  const auto m = small_model();
  SchedulerOptions so;
  so.max_batch = 2;
  Scheduler s(*m, so);
  RequestOptions o;
  o.max_new_tokens = 7;
  std::vector<std::unique_ptr<Collector>> got;
  for (int64_t i = 0; i < 5; ++i) {
    got.push_back(std::make_unique<Collector>());
    s.submit(random_prompt(2 + i, 1000 + static_cast<uint64_t>(i), kVocab), o, got.back()->on_token(),
             got.back()->on_done());
  }
  s.shutdown(true);
  for (auto& c : got) {
    EXPECT_TRUE(c->finished);
    EXPECT_EQ(c->result.generation.finish, FinishReason::kLength);
    EXPECT_EQ(c->result.generation.tokens.size(), 7u);
  }
  EXPECT_EQ(s.stats().tokens, 35);
}

TEST(Scheduler, ShutdownFalseCancelsEveryRequest) {
  const auto m = small_model();
  SchedulerOptions so;
  so.max_batch = 1;
  Scheduler s(*m, so);
  RequestOptions o;
  o.max_new_tokens = 60;
  Gate gate;
  Collector a, b, c;
  s.submit({1, 2, 3}, o, gate.hold(), a.on_done());
  gate.entered.get_future().wait();
  s.submit({4, 5}, o, b.on_token(), b.on_done());
  s.submit({6}, o, c.on_token(), c.on_done());
  std::thread stopper([&] { s.shutdown(false); });
  // shutdown has begun once submit refuses; then the callback returns.
  for (;;) {
    try {
      s.submit({1}, o, {}, {});  // accepted before shutdown began: it is cancelled with the others
    } catch (const decode::QueueFull&) {
    } catch (const std::runtime_error&) {
      break;
    }
    std::this_thread::yield();
  }
  gate.open.set_value();
  stopper.join();
  for (Collector* x : {&a, &b, &c}) {
    EXPECT_TRUE(x->finished);
    EXPECT_EQ(x->result.generation.finish, FinishReason::kCancelled);
    EXPECT_EQ(x->done_calls, 1);
  }
  EXPECT_TRUE(b.events.empty());
  EXPECT_TRUE(c.events.empty());
  s.shutdown(true);  // a second shutdown returns at once
}

// The requests submitted together (max_batch: all of them) -> their results, in order.
std::vector<RequestResult> serve_all(const models::LlamaForCausalLM& m, const std::vector<std::vector<int64_t>>& prompts,
                                     const std::vector<RequestOptions>& options, SchedulerOptions so) {
  so.max_batch = static_cast<int64_t>(prompts.size());
  Scheduler s(m, so);
  std::vector<std::unique_ptr<Collector>> got;
  for (size_t i = 0; i < prompts.size(); ++i) {
    got.push_back(std::make_unique<Collector>());
    s.submit(prompts[i], options[i], got.back()->on_token(), got.back()->on_done());
  }
  std::vector<RequestResult> out;
  for (auto& c : got) out.push_back(c->wait());
  return out;
}

// The real model as stored (Q4_1 products): 8 prompts of different lengths decoded together get the tokens each
// gets alone, on 2 threads and on 1.
TEST(Scheduler, SmolLM2EightGreedyRequestsTogetherGetTheirAloneTokens) {
  const auto m = models::LlamaForCausalLM::from_gguf(testing::smollm2_gguf(), std::nullopt);
  std::vector<std::vector<int64_t>> prompts;
  std::vector<RequestOptions> options;
  const int64_t lengths[] = {2, 13, 32, 33, 35, 37, 38, 55};  // 32 .. 38: one to three key tiles
  for (int64_t i = 0; i < 8; ++i) {
    prompts.push_back(random_prompt(lengths[i], 1100 + static_cast<uint64_t>(i), 2000));
    RequestOptions o;
    o.max_new_tokens = 10 + i;
    options.push_back(o);
  }
  std::vector<decode::Generation> want;
  for (size_t i = 0; i < prompts.size(); ++i) want.push_back(alone(*m, prompts[i], options[i], 16));
  const int saved = omp_get_max_threads();
  for (int64_t threads : {2, 1}) {
    SchedulerOptions so;
    so.threads = threads;
    const std::vector<RequestResult> got = serve_all(*m, prompts, options, so);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got[i].generation.tokens, want[i].tokens) << "request " << i << ", " << threads << " threads";
      EXPECT_EQ(got[i].generation.finish, want[i].finish) << "request " << i;
    }
  }
  omp_set_num_threads(1);  // alone on one thread too
  for (size_t i = 0; i < prompts.size(); i += 3)
    EXPECT_EQ(alone(*m, prompts[i], options[i], 16).tokens, want[i].tokens) << "alone on 1 thread, request " << i;
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace qkv
