// Tests of qkv::parallel at any group size: ctest runs this binary as one process (the group of one) and again under
// `mpirun -np 2/3/4` (CMakeLists.txt: dist_test_mpirun_np*). Every rank builds the same global inputs from one seed,
// computes the one-process fused attention as the reference, and checks its own shard of the ring's results. Also
// here: train::DataParallel's all-reduce overlapped with the backward against the blocking sum, and the Llama kind
// under context parallelism against one process.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops_testing.h"
#include "tiny_llama.h"
#include "qkv/core/rng.h"
#include "qkv/data/batch.h"
#include "qkv/parallel/comm.h"
#include "qkv/parallel/ring_attention.h"
#include "qkv/models/llama.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/functional.h"
#include "qkv/train/data_parallel.h"
#include "qkv/train/loss.h"
#include "qkv/train/text_model.h"
#include "qkv/train/trainer.h"

namespace qkv {
namespace {

using parallel::Communicator;

// Normwise relative error bounds of the ring against one process (the merge and the per-block kernels round
// differently): forward max|a - ref| <= 1e-5 max|ref|, backward 1e-4.
constexpr double kForwardRtol = 1e-5;
constexpr double kBackwardRtol = 1e-4;

// max |a - ref| / max |ref| over finite entries; a -inf (fully masked row's lse) must be -inf in both.
double normwise_error(const Tensor& a, const Tensor& ref) {
  const std::vector<float> x = a.to_vector(), r = ref.to_vector();
  if (x.size() != r.size()) return std::numeric_limits<double>::infinity();
  double err = 0.0, mag = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isinf(r[i]) || std::isinf(x[i])) {
      if (x[i] != r[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isnan(x[i]) || std::isnan(r[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::fabs(static_cast<double>(x[i]) - r[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(r[i])));
  }
  return mag == 0.0 ? err : err / mag;
}

TEST(DistComm, CollectivesAgreeOnEveryRank) {
  Communicator& c = Communicator::world();
  const int n = c.size(), r = c.rank();
  ASSERT_GE(n, 1);
  ASSERT_TRUE(r >= 0 && r < n);
  EXPECT_EQ(c.uses_mpi(), n > 1 || c.uses_mpi());
  std::vector<float> sum = {static_cast<float>(r + 1), -2.0f * static_cast<float>(r)};
  c.allreduce_sum(sum.data(), 2);
  EXPECT_EQ(sum[0], static_cast<float>(n * (n + 1) / 2));
  EXPECT_EQ(sum[1], static_cast<float>(-n * (n - 1)));
  std::vector<float> mx = {static_cast<float>(r), static_cast<float>(-r)};
  c.allreduce_max(mx.data(), 2);
  EXPECT_EQ(mx[0], static_cast<float>(n - 1));
  EXPECT_EQ(mx[1], 0.0f);
  const int root = n - 1;
  std::vector<float> b = {static_cast<float>(r == root ? 7.5 : -1.0), static_cast<float>(r)};
  c.broadcast(b.data(), 2, root);
  EXPECT_EQ(b[0], 7.5f);
  EXPECT_EQ(b[1], static_cast<float>(root));
  char word[6] = {0};
  if (r == 0) std::snprintf(word, sizeof word, "ranks");
  c.broadcast_bytes(word, sizeof word, 0);
  EXPECT_EQ(std::string(word), "ranks");
  c.barrier();
}

TEST(DistComm, IallreduceSumIsTheSumOnEveryRankOnceTestSaysDone) {
  Communicator& c = Communicator::world();
  const int n = c.size(), r = c.rank();
  std::vector<float> x(1000);  // integers: every summation order gives the same bits
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((r + 1) * static_cast<int>(i % 17) - 3 * r);
  std::vector<float> blocking = x;
  c.allreduce_sum(blocking.data(), static_cast<int64_t>(blocking.size()));
  const int64_t sent = c.bytes_sent();
  parallel::Request req = c.iallreduce_sum(x.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(c.bytes_sent() - sent, static_cast<int64_t>(sizeof(float) * x.size()));
  EXPECT_EQ(req.pending(), n > 1);
  int polls = 0;
  while (!c.test(req)) ++polls;  // test() alone drives MPI's progress to completion
  EXPECT_FALSE(req.pending());
  EXPECT_TRUE(c.test(req));
  c.wait(req);  // a completed request waits for nothing
  EXPECT_EQ(x, blocking) << "after " << polls << " polls";
  EXPECT_EQ(x[5], static_cast<float>(5 * n * (n + 1) / 2 - 3 * n * (n - 1) / 2));
  try {
    c.iallreduce_sum(x.data(), -1);
    ADD_FAILURE() << "a negative count passed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[dist.iallreduce] count -1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c.iallreduce_sum(nullptr, 3), std::invalid_argument);
}

TEST(DistComm, RingOfNonBlockingMessages) {
  Communicator& c = Communicator::world();
  const int n = c.size(), r = c.rank();
  if (n == 1) {  // no peer: a message to oneself is a caller mistake that names the op
    std::vector<float> x(3);
    EXPECT_THROW(c.isend(x.data(), 3, 0, 0), std::invalid_argument);
    try {
      c.irecv(x.data(), 3, 1, 0);
      ADD_FAILURE() << "irecv from a missing rank did not throw";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("[dist.irecv] source 1"), std::string::npos) << e.what();
    }
    return;
  }
  std::vector<float> out = {static_cast<float>(r), static_cast<float>(10 * r)}, in(2, -1.0f);
  parallel::Request recv = c.irecv(in.data(), 2, (r + n - 1) % n, 5);
  parallel::Request send = c.isend(out.data(), 2, (r + 1) % n, 5);
  c.wait(recv);
  c.wait(send);
  EXPECT_FALSE(recv.pending());
  EXPECT_EQ(in[0], static_cast<float>((r + n - 1) % n));
  EXPECT_EQ(in[1], static_cast<float>(10 * ((r + n - 1) % n)));
  EXPECT_THROW(c.isend(out.data(), 2, n, 0), std::invalid_argument);
  EXPECT_THROW(c.isend(out.data(), 2, (r + 1) % n, -1), std::invalid_argument);
}

TEST(DistComm, CheckSameRefusesADifferingRank) {
  Communicator& c = Communicator::world();
  EXPECT_NO_THROW(c.check_same(parallel::hash_bytes("config", 6), "config"));
  if (c.size() == 1) return;
  try {
    c.check_same(c.rank() == c.size() - 1 ? 1u : 0u, "the model width");
    ADD_FAILURE() << "differing values passed";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[dist.check_same] the model width differs"), std::string::npos) << what;
    EXPECT_NE(what.find("rank " + std::to_string(c.size() - 1)), std::string::npos) << what;
  }
}

TEST(DistComm, HashSeesEveryBit) {
  std::vector<float> a = {1.0f, -0.0f, 3.5f};
  const uint64_t h = parallel::hash_floats(a.data(), 3);
  EXPECT_EQ(h, parallel::hash_floats(a.data(), 3));
  a[1] = 0.0f;  // equal as floats, different bits
  EXPECT_NE(h, parallel::hash_floats(a.data(), 3));
  EXPECT_NE(parallel::hash_floats(a.data(), 2), parallel::hash_floats(a.data(), 3));
}

TEST(RingShard, ZigzagPositionsCoverTheSequenceOnce) {
  for (int n : {1, 2, 3, 4}) {
    for (Causal causal : {Causal::kNone, Causal::kTopLeft}) {
      std::vector<int> seen(24, 0);
      for (int r = 0; r < n; ++r)
        for (int64_t p : parallel::ring_positions(24, r, n, causal)) ++seen[static_cast<size_t>(p)];
      for (int s : seen) EXPECT_EQ(s, 1) << "n " << n;
    }
  }
  EXPECT_EQ(parallel::ring_positions(8, 1, 2, Causal::kTopLeft), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_THROW(parallel::ring_positions(10, 0, 3, Causal::kNone), std::invalid_argument);
  EXPECT_THROW(parallel::ring_positions(12, 0, 4, Causal::kTopLeft), std::invalid_argument);
}

struct RingCase {
  Causal causal;
  MaskKind mask;
};

// The per-key mask of the global sequence, (B, 1, 1, T), in `kind`'s convention: about a quarter of the keys
// blocked, and every key of batch 1's first query chunk blocked for kKeep, so that some rows see no key at all.
Tensor key_mask(MaskKind kind, int64_t b, int64_t t, uint64_t seed) {
  Rng rng(seed);
  Tensor m = Tensor::empty({b, 1, 1, t});
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < t; ++j) {
      const bool blocked = rng.bernoulli(0.25f) || (kind == MaskKind::kKeep && i == 1 && j < 3);
      float value = 0.0f;
      if (kind == MaskKind::kKeep) value = blocked ? 0.0f : 1.0f;
      if (kind == MaskKind::kBlock) value = blocked ? 1.0f : 0.0f;
      if (kind == MaskKind::kAdditive)
        value = blocked ? -std::numeric_limits<float>::infinity() : rng.normal(0.0f, 0.5f);
      m.at({i, 0, 0, j}) = value;
    }
  return m;
}

class RingAttention : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingAttention, MatchesOneProcessForwardAndBackward) {
  Communicator& c = Communicator::world();
  const RingCase rc = GetParam();
  const int64_t B = 2, H = 2, T = 24, Dk = 8, Dv = 6;  // T divides by 2N for N = 1..4
  const Tensor q = testing::randn({B, H, T, Dk}, 11), k = testing::randn({B, H, T, Dk}, 12);
  const Tensor v = testing::randn({B, H, T, Dv}, 13), d_out = testing::randn({B, H, T, Dv}, 14);
  AttentionOptions global;
  global.causal = rc.causal;
  global.return_lse = true;
  if (rc.mask != MaskKind::kNone) {
    global.mask = key_mask(rc.mask, B, T, 15);
    global.mask_kind = rc.mask;
  }
  const AttentionResult ref = attention_fused(q, k, v, global);
  const AttentionGrads ref_g = attention_backward(q, k, v, ref.out, ref.lse, d_out, global);

  const int n = c.size(), r = c.rank();
  const auto shard = [&](const Tensor& x, int64_t axis) { return parallel::ring_shard(x, axis, r, n, rc.causal); };
  AttentionOptions local = global;
  local.return_lse = false;
  if (rc.mask != MaskKind::kNone) local.mask = shard(global.mask, -1);
  const Tensor ql = shard(q, -2), kl = shard(k, -2), vl = shard(v, -2);
  const int64_t sent0 = c.bytes_sent();
  const AttentionResult got = parallel::ring_attention(ql, kl, vl, c, local);
  const int64_t sent1 = c.bytes_sent();
  EXPECT_LE(normwise_error(got.out, shard(ref.out, -2)), kForwardRtol);
  EXPECT_LE(normwise_error(got.lse, shard(ref.lse, -1)), kForwardRtol);
  const AttentionGrads g = parallel::ring_attention_backward(ql, kl, vl, got.out, got.lse, shard(d_out, -2), c, local);
  // The communication volume of docs/DISTRIBUTED.md's model: N - 1 K/V(+mask) blocks out per rank in the forward;
  // as many again in the backward, plus N dK/dV blocks.
  const int64_t kv = kl.numel() + vl.numel(), block = kv + (rc.mask != MaskKind::kNone ? B * T / n : 0);
  EXPECT_EQ(sent1 - sent0, static_cast<int64_t>(sizeof(float)) * (n - 1) * block);
  EXPECT_EQ(c.bytes_sent() - sent1, static_cast<int64_t>(sizeof(float)) * ((n - 1) * block + (n > 1 ? n : 0) * kv));
  EXPECT_LE(normwise_error(g.dq, shard(ref_g.dq, -2)), kBackwardRtol);
  EXPECT_LE(normwise_error(g.dk, shard(ref_g.dk, -2)), kBackwardRtol);
  EXPECT_LE(normwise_error(g.dv, shard(ref_g.dv, -2)), kBackwardRtol);
}

INSTANTIATE_TEST_SUITE_P(
    CausalAndMasks, RingAttention,
    ::testing::Values(RingCase{Causal::kNone, MaskKind::kNone}, RingCase{Causal::kTopLeft, MaskKind::kNone},
                      RingCase{Causal::kBottomRight, MaskKind::kNone}, RingCase{Causal::kNone, MaskKind::kKeep},
                      RingCase{Causal::kTopLeft, MaskKind::kKeep}, RingCase{Causal::kNone, MaskKind::kBlock},
                      RingCase{Causal::kTopLeft, MaskKind::kAdditive}, RingCase{Causal::kNone, MaskKind::kAdditive}));

// Grouped-query heads (k, v with Hkv < Hq heads, read in place) and soft-capped scores pass through the ring: the
// same out, lse and gradients as one process's fused attention, causal and not.
TEST(RingAttention, GqaAndSoftcapMatchOneProcess) {
  Communicator& c = Communicator::world();
  const int n = c.size(), r = c.rank();
  const int64_t B = 2, Hq = 4, Hkv = 2, T = 24, D = 8;
  for (Causal causal : {Causal::kNone, Causal::kTopLeft}) {
    // Scores of several units, so that the cap at 2 changes them.
    const Tensor q = ad::scale(ad::Var(testing::randn({B, Hq, T, D}, 31)), 3.0f).value;
    const Tensor k = testing::randn({B, Hkv, T, D}, 32), v = testing::randn({B, Hkv, T, D}, 33);
    const Tensor d_out = testing::randn({B, Hq, T, D}, 34);
    AttentionOptions global;
    global.causal = causal;
    global.enable_gqa = true;
    global.softcap = 2.0f;
    global.return_lse = true;
    const AttentionResult ref = attention_fused(q, k, v, global);
    const AttentionGrads ref_g = attention_backward(q, k, v, ref.out, ref.lse, d_out, global);
    AttentionOptions uncapped = global;
    uncapped.softcap = 0.0f;
    ASSERT_GT(normwise_error(attention_fused(q, k, v, uncapped).out, ref.out), 100 * kForwardRtol)
        << "the cap must matter for this test";

    const auto shard = [&](const Tensor& x, int64_t axis) { return parallel::ring_shard(x, axis, r, n, causal); };
    AttentionOptions local = global;
    local.return_lse = false;
    const Tensor ql = shard(q, -2), kl = shard(k, -2), vl = shard(v, -2);
    const AttentionResult got = parallel::ring_attention(ql, kl, vl, c, local);
    EXPECT_LE(normwise_error(got.out, shard(ref.out, -2)), kForwardRtol);
    EXPECT_LE(normwise_error(got.lse, shard(ref.lse, -1)), kForwardRtol);
    const AttentionGrads g = parallel::ring_attention_backward(ql, kl, vl, got.out, got.lse, shard(d_out, -2), c, local);
    EXPECT_EQ(g.dk.shape(), kl.shape());
    EXPECT_LE(normwise_error(g.dq, shard(ref_g.dq, -2)), kBackwardRtol);
    EXPECT_LE(normwise_error(g.dk, shard(ref_g.dk, -2)), kBackwardRtol);
    EXPECT_LE(normwise_error(g.dv, shard(ref_g.dv, -2)), kBackwardRtol);
  }
}

// The tape form (what context-parallel training records): one node on strided head views, whose backward gives
// the gradients of ring_attention_backward bit for bit, and so the one-process gradients within kBackwardRtol.
TEST(RingAttentionTape, BackwardThroughTheTapeIsTheRingBackward) {
  Communicator& c = Communicator::world();
  const int n = c.size(), r = c.rank();
  const int64_t B = 2, H = 2, T = 24, D = 4;
  // (B, T, H, D) activations viewed as heads (B, H, T, D): not contiguous, as nn::MultiheadAttention's views.
  const Tensor q = testing::randn({B, T, H, D}, 21), k = testing::randn({B, T, H, D}, 22);
  const Tensor v = testing::randn({B, T, H, D}, 23), d_out = testing::randn({B, H, T, D}, 24);
  AttentionOptions o;
  o.causal = Causal::kTopLeft;
  const auto shard = [&](const Tensor& x, int64_t axis) { return parallel::ring_shard(x, axis, r, n, o.causal); };
  ad::Tape tape;
  const ad::Var ql = tape.leaf(shard(q, 1)), kl = tape.leaf(shard(k, 1)), vl = tape.leaf(shard(v, 1));
  const ad::Var out = parallel::ring_attention(ad::transpose(ql, 1, 2), ad::transpose(kl, 1, 2),
                                           ad::transpose(vl, 1, 2), c, o);
  tape.backward(out, shard(d_out, -2));

  const auto heads = [](const ad::Var& x) { return x.value.transpose(1, 2).contiguous(); };
  AttentionOptions with_lse = o;
  const AttentionResult f = parallel::ring_attention(heads(ql), heads(kl), heads(vl), c, with_lse);
  EXPECT_EQ(out.value.to_vector(), f.out.to_vector());
  const AttentionGrads g =
      parallel::ring_attention_backward(heads(ql), heads(kl), heads(vl), f.out, f.lse, shard(d_out, -2), c, o);
  EXPECT_EQ(ql.grad().transpose(1, 2).contiguous().to_vector(), g.dq.to_vector());
  EXPECT_EQ(kl.grad().transpose(1, 2).contiguous().to_vector(), g.dk.to_vector());
  EXPECT_EQ(vl.grad().transpose(1, 2).contiguous().to_vector(), g.dv.to_vector());

  AttentionOptions global = o;
  global.return_lse = true;
  const Tensor qh = q.transpose(1, 2).contiguous(), kh = k.transpose(1, 2).contiguous();
  const Tensor vh = v.transpose(1, 2).contiguous();
  const AttentionResult ref = attention_fused(qh, kh, vh, global);
  const AttentionGrads ref_g = attention_backward(qh, kh, vh, ref.out, ref.lse, d_out, global);
  EXPECT_LE(normwise_error(g.dq, shard(ref_g.dq, -2)), kBackwardRtol);
  EXPECT_LE(normwise_error(g.dk, shard(ref_g.dk, -2)), kBackwardRtol);
}

TEST(RingAttentionErrors, RefusesWhatDoesNotShard) {
  Communicator& c = Communicator::world();
  const Tensor q = testing::randn({1, 6, 4}, 1), k = testing::randn({1, 6, 4}, 2), v = testing::randn({1, 6, 4}, 3);
  AttentionOptions full_mask;
  full_mask.mask = Tensor::ones({6, 6});
  full_mask.mask_kind = MaskKind::kKeep;
  EXPECT_THROW(parallel::ring_attention(q, k, v, c, full_mask), std::invalid_argument);
  try {
    parallel::ring_attention(q, k, v, c, full_mask);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[ring_attention] the mask must be per key"), std::string::npos) << e.what();
  }
  AttentionOptions weights;
  weights.return_weights = true;
  EXPECT_THROW(parallel::ring_attention(q, k, v, c, weights), std::invalid_argument);
  AttentionOptions causal;
  causal.causal = Causal::kTopLeft;
  const Tensor k_short = testing::randn({1, 4, 4}, 4);
  EXPECT_THROW(parallel::ring_attention(q, k_short, k_short, c, causal), std::invalid_argument);
  const AttentionResult f = parallel::ring_attention(q, k, v, c);
  EXPECT_THROW(parallel::ring_attention_backward(q, k, v, f.out, Tensor(), f.out, c), std::invalid_argument);
  AttentionOptions window = causal;
  window.window_left = 3;
  window.window_right = 0;
  try {
    parallel::ring_attention(q, k, v, c, window);
    ADD_FAILURE() << "a sliding window passed";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[ring_attention] q (1, 6, 4) k (1, 6, 4): a sliding window (window_size (3, 0))"),
              std::string::npos)
        << what;
  }
}

// --- data parallelism: the all-reduce overlapped with the backward ----------------------------------------------

using qkv::testing::tiny_tied_gqa_llama;

// This rank's batch: ids of its own seed.
Ids rank_ids(int rank, int64_t b, int64_t t, int64_t vocab) {
  Rng rng(100 + static_cast<uint64_t>(rank));
  Ids ids{std::vector<int64_t>(static_cast<size_t>(b * t)), Shape{b, t}};
  for (int64_t& x : ids.data) x = static_cast<int64_t>(rng.below(static_cast<uint64_t>(vocab)));
  return ids;
}

// Every rank: its own batch and loss weight (rank + 1 loss terms), a parameter that only rank 0's loss reads and
// one that no rank's reads. The overlapped reduction must equal the blocking sum of the scaled gradients.
TEST(DataParallelOverlap, ReducedGradientsEqualTheBlockingSum) {
  Communicator& c = Communicator::world();
  const int n = c.size(), r = c.rank();
  const int64_t V = 13, B = 2, T = 6;
  Rng init(9);
  models::LlamaForCausalLM model(tiny_tied_gqa_llama(V), init);
  Tensor rank0_only = testing::randn({5}, 41), unused = testing::randn({3}, 42);
  // First in the set, so last in the buckets' (reverse) order: a parameter no node reads holds back its bucket and
  // every later one until reduce_gradients().
  ad::ParameterSet params;
  params.add("rank0_only", &rank0_only);
  params.add("unused", &unused);
  for (auto& [name, t] : model.named_parameters()) params.add(name, t);
  const Ids ids = rank_ids(r, B, T, V);
  std::vector<int64_t> targets(ids.data.begin() + 1, ids.data.end());
  targets.push_back(0);
  const auto backward = [&](ad::Tape& tape) {
    params.zero_grad();
    tape.clear();
    nn::Context ctx(tape, params);
    ad::Var loss = train::cross_entropy(model.forward(ctx, ids), targets);
    if (r == 0) loss = ad::add(loss, ad::sum(ad::mul(ctx.param(rank0_only), ctx.param(rank0_only))));
    tape.backward(loss);
    return static_cast<double>(loss.value.item());
  };
  const double weight = r + 1, total = n * (n + 1) / 2.0;

  // The reference: a plain backward, then every gradient scaled and summed with the blocking all-reduce.
  ad::Tape plain;
  backward(plain);
  std::vector<std::vector<float>> ref(params.size());
  std::vector<float> has(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    ref[i] = params[i].has_grad ? params[i].grad.to_vector() : std::vector<float>(params[i].value->numel(), 0.0f);
    for (float& g : ref[i]) g *= static_cast<float>(weight / total);
    c.allreduce_sum(ref[i].data(), static_cast<int64_t>(ref[i].size()));
    has[i] = params[i].has_grad ? 1.0f : 0.0f;
  }
  c.allreduce_max(has.data(), static_cast<int64_t>(has.size()));

  train::DataParallel dp(c, params, 64);  // small buckets: many of them
  ASSERT_GT(dp.num_buckets(), 3u);
  ad::Tape tape;
  tape.set_on_param_ready([&](ad::Parameter& p, size_t nodes_left) { dp.parameter_ready(p, nodes_left); });
  dp.set_local_weight(weight);
  EXPECT_TRUE(std::isfinite(dp.global_loss(1.0)));
  backward(tape);
  dp.reduce_gradients();
  EXPECT_GE(dp.buckets_started_during_backward(), 1) << "no bucket started before the backward's last node";
  EXPECT_LT(dp.buckets_started_during_backward(), static_cast<int64_t>(dp.num_buckets()))
      << "the buckets of the embeddings, final after the first node only, cannot start earlier";
  uint64_t h = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const ad::Parameter& p = params[i];
    EXPECT_EQ(p.has_grad, has[i] != 0.0f) << p.name;
    if (!p.has_grad) continue;
    EXPECT_LE(normwise_error(p.grad, Tensor::from_vector(p.value->shape(), ref[i])), 1e-6) << p.name;
    h = parallel::hash_floats(p.grad.data(), p.grad.numel(), h ^ i);
  }
  EXPECT_TRUE(params[0].has_grad) << "rank 0's gradient reaches every rank";
  EXPECT_FALSE(params[1].has_grad);
  EXPECT_NO_THROW(c.check_same(h, "the reduced gradients"));
}

// The trainer sets the hook: with overlap on, buckets start inside the backward; with it off, none does, and the
// parameters after two steps are the same bits (the same all-reduces, in the same order, of the same buffers).
TEST(DataParallelOverlap, TrainerOverlapsAndNoOverlapGivesTheSameBits) {
  Communicator& c = Communicator::world();
  const int r = c.rank();
  const int64_t V = 13, B = 2, T = 6;
  uint64_t hashes[2] = {0, 0};
  for (int overlap = 0; overlap < 2; ++overlap) {
    Rng init(10);
    models::LlamaForCausalLM model(tiny_tied_gqa_llama(V), init);
    ad::ParameterSet params(model);
    train::SgdOptions so;
    so.lr = 0.1;
    train::SGD opt(params, so);
    train::LrSchedule schedule;
    schedule.lr = 0.1;
    Rng dropout(1);
    train::Trainer trainer(params, opt, schedule, dropout);
    train::DataParallel dp(c, params, 64);
    dp.set_overlap(overlap != 0);
    trainer.set_data_parallel(&dp);
    for (int64_t step = 1; step <= 2; ++step) {
      const Ids ids = rank_ids(r + 10 * static_cast<int>(step), B, T, V);
      const std::vector<int64_t> targets(ids.data.rbegin(), ids.data.rend());
      trainer.step(step, [&](nn::Context& ctx) { return train::cross_entropy(model.forward(ctx, ids), targets); });
      EXPECT_NO_THROW(dp.check_replicas(step));
      if (overlap != 0) {
        EXPECT_GE(dp.buckets_started_during_backward(), 1);
      } else {
        EXPECT_EQ(dp.buckets_started_during_backward(), 0);
      }
    }
    hashes[overlap] = dp.parameter_hash();
  }
  EXPECT_EQ(hashes[0], hashes[1]);
}

// --- the Llama kind under context parallelism -------------------------------------------------------------------

// Context parallelism's loss (each rank's share of the global token mean) and gradients (summed over the ranks)
// against one process's, for a Llama with grouped-query attention and soft-capped scores: rotary angles of the
// global positions, every attention around the ring.
TEST(LlamaContextParallel, LossAndGradientsEqualOneProcess) {
  Communicator& c = Communicator::world();
  train::TextModelConfig tc;
  tc.kind = train::TextModelKind::kLlama;
  tc.llama = tiny_tied_gqa_llama(12);
  tc.llama.num_attention_heads = 4;
  tc.llama.head_dim = 2;
  tc.llama.num_key_value_heads = 2;
  tc.llama.attn_logit_softcapping = 1.5f;
  Rng data_rng(5);
  std::vector<data::Example> examples;
  for (int64_t len : {3, 7, 5}) {
    data::Example e;
    for (int64_t i = 0; i < len; ++i) e.src.push_back(4 + static_cast<int64_t>(data_rng.below(8)));
    e.tgt = e.src;
    examples.push_back(e);
  }
  std::vector<const data::Example*> batch;
  for (const data::Example& e : examples) batch.push_back(&e);

  const auto run = [&](const train::ContextParallel* cp, std::vector<std::vector<float>>& grads) {
    Rng init(6);
    std::unique_ptr<train::TextModel> m = train::make_text_model(tc, init);
    ad::ParameterSet params(m->module());
    ad::Tape tape;
    nn::Context ctx(tape, params);
    if (cp != nullptr) ctx.set_sequence_shard(cp);
    const train::TeacherForced tf = m->teacher_forced(ctx, batch);
    train::CrossEntropyOptions ce;
    ce.ignore_index = 0;
    ad::Var loss;
    double value = 0.0;
    if (cp == nullptr) {
      loss = train::cross_entropy(tf.logits, tf.targets, ce);
      value = loss.value.item();
    } else {
      ce.reduction = train::Reduction::kSum;
      const double total = cp->global_sum(static_cast<double>(train::count_targets(tf.targets, 0)));
      loss = ad::scale(train::cross_entropy(tf.logits, tf.targets, ce), static_cast<float>(1.0 / total));
      value = cp->global_sum(loss.value.item());
    }
    tape.backward(loss);
    grads.clear();
    for (size_t i = 0; i < params.size(); ++i) {
      grads.push_back(params[i].has_grad ? params[i].grad.to_vector()
                                         : std::vector<float>(params[i].value->numel(), 0.0f));
      if (cp != nullptr) c.allreduce_sum(grads.back().data(), static_cast<int64_t>(grads.back().size()));
    }
    return value;
  };
  std::vector<std::vector<float>> ref, got;
  const double ref_loss = run(nullptr, ref);
  const train::ContextParallel cp(c);
  const double loss = run(&cp, got);
  EXPECT_LE(std::fabs(loss - ref_loss), 1e-5 * std::fabs(ref_loss)) << loss << " vs " << ref_loss;
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    const Shape s{static_cast<int64_t>(ref[i].size())};
    EXPECT_LE(normwise_error(Tensor::from_vector(s, got[i]), Tensor::from_vector(s, ref[i])), kBackwardRtol)
        << "parameter " << i;
  }

  // A sliding window has no ring form: refused, naming the option.
  tc.llama.sliding_window = 4;
  tc.llama.layer_sliding.assign(2, true);
  try {
    std::vector<std::vector<float>> unused;
    run(&cp, unused);
    ADD_FAILURE() << "a sliding window passed under context parallelism";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[llama] sliding_window 4"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qkv
