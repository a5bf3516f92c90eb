// nn::KvCache's bfloat16 storage: the fused attention over the cache's bf16 pairs gives the bits of the float32
// attention over a float32 cache holding the bf16-rounded keys and values (every kernel set of this CPU, contiguous
// and paged, GQA, a decoding row and a prefill chunk, 1 and 2 threads), close to the float64 oracle over the rounded
// inputs; the cache's moves (growth, reorder, copy on write, take_rows, shared pools) keep the words' bits; misuse
// is refused; a Llama model decodes with it (generate, the searches' cached step, the Scheduler).
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_flash_testing.h"
#include "ops_testing.h"
#include "qkv/core/rng.h"
#include "qkv/decode/cached_step.h"
#include "qkv/decode/generate.h"
#include "qkv/decode/scheduler.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/models/llama.h"
#include "qkv/nn/attention_core.h"
#include "qkv/nn/kv_cache.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/attention_plain.h"
#include "qkv/ops/attention_varlen.h"
#include "qkv/ops/lowp.h"
#include "qkv/ops/shape_ops.h"
#include "tiny_llama.h"

namespace qkv {
namespace {

using kernels::FlashConfig;
using kernels::FlashIsa;
using nn::KvCache;
using testing::ThrowsArg;

std::vector<uint32_t> bits(const Tensor& t) {
  const std::vector<float> v = t.contiguous().to_vector();
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// The kernel sets this CPU runs (FlashIsa::kAuto's pick among them follows QKV_ISA; these are named explicitly).
std::vector<FlashIsa> isas() {
  std::vector<FlashIsa> all;
  for (FlashIsa isa : {FlashIsa::kPortable, FlashIsa::kAvx2, FlashIsa::kAvx512, FlashIsa::kAvx512Bf16,
                       FlashIsa::kAmxEmulated, FlashIsa::kAmx})
    if (testing::flash::available(isa)) all.push_back(isa);
  return all;
}

Tensor rounded_normal(Rng& rng, const Shape& shape) { return round_to_bf16(rng.normal(shape)); }

// --- (a) the kernel: bf16 pairs read in place == float32 over the rounded values ----------------------------------

TEST(KvCacheBf16, DenseForwardOverPairsIsTheFloat32ForwardOverRoundedKv) {
  struct Heads {
    int64_t hq, hkv;
  };
  for (FlashIsa isa : isas())
    for (Heads h : {Heads{9, 3}, Heads{4, 4}})
      for (int64_t d : {64, 6})
        for (int64_t tq : {1, 7, 40})
          for (int64_t tk : {37, 300})
            for (Precision p : {Precision::kFloat32, Precision::kBFloat16})
              for (int64_t tile : {0, 16})  // 16: many tile edges, odd last tiles, the bf16 pairs made per head
                for (int threads : {1, 2}) {
                  Rng rng(static_cast<uint64_t>(tq * 1000 + tk + d));
                  const Tensor q = rng.normal({1, h.hq, tq, d});
                  const Tensor k = rounded_normal(rng, {1, h.hkv, tk, d}), v = rounded_normal(rng, {1, h.hkv, tk, d});
                  AttentionOptions o;
                  o.causal = Causal::kBottomRight;
                  o.enable_gqa = h.hq != h.hkv;
                  o.precision = p;
                  FlashConfig c;
                  c.isa = isa;
                  c.threads = threads;
                  c.min_work_per_thread = 0;
                  c.fwd_q_tile = c.fwd_k_tile = tile;
                  const Shape batch{1, h.hq};
                  const AttentionResult want = kernels::attention_flash_forward(q, k, v, o, batch, 0.125f, c);
                  c.kv_bf16 = true;
                  const AttentionResult got =
                      kernels::attention_flash_forward(q, to_bf16_pairs(k), to_bf16_pairs(v), o, batch, 0.125f, c);
                  const std::string where = std::string(kernels::flash_isa_name(isa)) + " hq " +
                                            std::to_string(h.hq) + " d " + std::to_string(d) + " tq " +
                                            std::to_string(tq) + " tk " + std::to_string(tk) + " " +
                                            precision_name(p) + " tile " + std::to_string(tile) + " threads " +
                                            std::to_string(threads);
                  EXPECT_EQ(bits(got.out), bits(want.out)) << where;
                  EXPECT_EQ(bits(got.lse), bits(want.lse)) << where;
                }
}

TEST(KvCacheBf16, PagedForwardOverPairsIsTheFloat32ForwardOverRoundedPages) {
  const int64_t blocks = 12, bs = 16, tk = 150, d = 64;
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  std::reverse(table.begin(), table.end());  // the logical blocks out of order in the pool
  for (FlashIsa isa : isas())
    for (int64_t hkv : {3, 4})
      for (int64_t tq : {1, 7})
        for (Precision p : {Precision::kFloat32, Precision::kBFloat16})
          for (int threads : {1, 2}) {
            const int64_t hq = hkv == 3 ? 9 : 4;
            Rng rng(static_cast<uint64_t>(hkv * 10 + tq));
            const Tensor kc = rounded_normal(rng, {blocks, bs, hkv, d}), vc = rounded_normal(rng, {blocks, bs, hkv, d});
            const Tensor q = rng.normal({hq, tq, d});
            AttentionOptions o;
            o.causal = Causal::kBottomRight;
            o.precision = p;
            FlashConfig c;
            c.isa = isa;
            c.threads = threads;
            c.min_work_per_thread = 0;
            c.split_keys = false;
            kernels::KvPages kv{kc, vc, table.data(), tk};
            const AttentionResult want = kernels::attention_flash_forward_paged(q, kv, o, 0.125f, c);
            kv.k_cache = to_bf16_pairs(kc);
            kv.v_cache = to_bf16_pairs(vc);
            c.kv_bf16 = true;
            const AttentionResult got = kernels::attention_flash_forward_paged(q, kv, o, 0.125f, c);
            const std::string where = std::string(kernels::flash_isa_name(isa)) + " hkv " + std::to_string(hkv) +
                                      " tq " + std::to_string(tq) + " " + precision_name(p) + " threads " +
                                      std::to_string(threads);
            EXPECT_EQ(bits(got.out), bits(want.out)) << where;
            EXPECT_EQ(bits(got.lse), bits(want.lse)) << where;
          }
}

// attention_with_kvcache appends into bf16 pages (rounding the new rows) and reads them as float32 pages holding
// the rounded rows would be read.
TEST(KvCacheBf16, AttentionWithKvcacheAppendsAndReadsBf16Pages) {
  const int64_t B = 2, blocks = 8, bs = 8, hkv = 3, hq = 9, d = 16, tnew = 5;
  Rng rng(11);
  const Tensor k32 = rounded_normal(rng, {blocks, bs, hkv, d}), v32 = rounded_normal(rng, {blocks, bs, hkv, d});
  const Tensor k_new = rng.normal({B, tnew, hkv, d}), v_new = rng.normal({B, tnew, hkv, d});
  const Tensor q = rng.normal({B, tnew, hq, d});
  const std::vector<int32_t> table{5, 1, 7, 2, 0, 3, 6, 4}, seqlens{9, 14};
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  o.return_lse = true;
  Tensor kf = k32.contiguous().clone(), vf = v32.contiguous().clone();
  Tensor kw = to_bf16_pairs(k32), vw = to_bf16_pairs(v32);
  const AttentionResult want = attention_with_kvcache(q, kf, vf, round_to_bf16(k_new), round_to_bf16(v_new), seqlens,
                                                      table, 4, o);
  const AttentionResult got =
      attention_with_kvcache(q, kw, vw, k_new, v_new, seqlens, table, 4, o, Precision::kBFloat16);
  EXPECT_EQ(bits(got.out), bits(want.out));
  EXPECT_EQ(bits(got.lse), bits(want.lse));
  EXPECT_EQ(bits(kw), bits(to_bf16_pairs(kf)));  // the appended rows, as pairs
  EXPECT_EQ(bits(vw), bits(to_bf16_pairs(vf)));
}

// nn::attend over KvCaches: a prefill chunk, then decoding rows; the bf16 cache against a float32 one fed the
// rounded keys and values. The fused path (in place), and the paths that read widened copies (a key mask, weights
// with the output).
struct AttendCase {
  int64_t hq, hkv, page;
  bool masked;
};

TEST(KvCacheBf16, AttendOverABf16CacheIsAttendOverRoundedFloat32Cache) {
  const int saved = omp_get_max_threads();
  for (AttendCase ac : {AttendCase{9, 3, 0, false}, AttendCase{4, 4, 0, false}, AttendCase{9, 3, 16, false},
                        AttendCase{4, 4, 5, false}, AttendCase{9, 3, 0, true}, AttendCase{4, 4, 16, true}})
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      const int64_t B = 2, d = 64;
      KvCache bf, fp;
      bf.reset(B, ac.hkv, d, 4, ac.page, Precision::kBFloat16);
      fp.reset(B, ac.hkv, d, 4, ac.page);
      Rng rng(static_cast<uint64_t>(ac.hq + ac.page));
      int64_t len = 0;
      for (int64_t tn : {7, 1, 1, 3, 1}) {  // a prefill chunk, decoding rows, another chunk
        const Tensor q = rng.normal({B, ac.hq, tn, d});
        const Tensor k = rng.normal({B, ac.hkv, tn, d}), v = rng.normal({B, ac.hkv, tn, d});
        len += tn;
        nn::AttendOptions o;
        o.attention.causal = Causal::kBottomRight;
        if (ac.masked) {  // row 1's first key is padding
          std::vector<float> m(static_cast<size_t>(B * len), 1.0f);
          m[static_cast<size_t>(len)] = 0.0f;
          o.attention.mask = Tensor::from_vector({B, 1, 1, len}, m);
          o.attention.mask_kind = MaskKind::kKeep;
          o.weights = nn::AttendWeights::kWithOutput;
        }
        o.cache = &bf;
        const nn::AttendResult got = nn::attend(nn::Context(), ad::Var(q), ad::Var(k), ad::Var(v), o);
        o.cache = &fp;
        const nn::AttendResult want = nn::attend(nn::Context(), ad::Var(q), ad::Var(round_to_bf16(k)),
                                                 ad::Var(round_to_bf16(v)), o);
        const std::string where = "hq " + std::to_string(ac.hq) + " hkv " + std::to_string(ac.hkv) + " page " +
                                  std::to_string(ac.page) + (ac.masked ? " masked" : "") + " threads " +
                                  std::to_string(threads) + " len " + std::to_string(len);
        EXPECT_EQ(bits(got.out.value), bits(want.out.value)) << where;
        if (ac.masked) EXPECT_EQ(bits(got.weights), bits(want.weights)) << where;
        EXPECT_EQ(bits(bf.keys()), bits(fp.keys())) << where;
        EXPECT_EQ(bits(bf.values()), bits(fp.values())) << where;
      }
    }
  omp_set_num_threads(saved);
}

// --- (b) against the float64 oracle over the rounded keys and values ----------------------------------------------

TEST(KvCacheBf16, DecodingIsCloseToTheFloat64OracleOverRoundedKv) {
  for (int64_t page : {0, 16}) {
    const int64_t B = 1, hq = 9, hkv = 3, d = 64, len = 90;
    Rng rng(21);
    KvCache cache;
    cache.reset(B, hkv, d, 16, page, Precision::kBFloat16);
    const Tensor k = rng.normal({B, hkv, len, d}), v = rng.normal({B, hkv, len, d});
    const Tensor q0 = rng.normal({B, hq, len - 1, d});
    nn::AttendOptions o;
    o.attention.causal = Causal::kBottomRight;
    o.cache = &cache;
    nn::attend(nn::Context(), ad::Var(q0), ad::Var(k.slice(2, 0, len - 1)), ad::Var(v.slice(2, 0, len - 1)), o);
    const Tensor q = rng.normal({B, hq, 1, d});
    const Tensor out =
        nn::attend(nn::Context(), ad::Var(q), ad::Var(k.slice(2, len - 1, len)), ad::Var(v.slice(2, len - 1, len)), o)
            .out.value;
    AttentionOptions po;
    po.causal = Causal::kBottomRight;
    po.enable_gqa = true;
    const PlainAttention ref = attention_plain(q, round_to_bf16(k), round_to_bf16(v), po);
    const std::vector<float> got = out.contiguous().to_vector();
    ASSERT_EQ(got.size(), ref.out.size());
    double err = 0.0, mag = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      err = std::max(err, std::abs(got[i] - ref.out[i]));
      mag = std::max(mag, std::abs(ref.out[i]));
    }
    // The float32 forward's tolerance against the oracle: the rounding of K and V is in both sides.
    EXPECT_LE(err, testing::flash::kForwardRtol * mag) << "page " << page;
  }
}

// --- (c) the cache's moves keep the words' bits --------------------------------------------------------------------

TEST(KvCacheBf16, KeysAreTheRoundedRowsThroughGrowthReorderAndCopyOnWrite) {
  for (int64_t page : {0, 3}) {
    const int64_t hkv = 2, d = 8;
    Rng rng(31);
    KvCache c;
    c.reset(2, hkv, d, 2, page, Precision::kBFloat16);
    EXPECT_EQ(c.storage(), Precision::kBFloat16);
    const Tensor k0 = rng.normal({2, hkv, 5, d}), v0 = rng.normal({2, hkv, 5, d});
    c.append(k0, v0);  // grows past its capacity of 2
    EXPECT_EQ(bits(c.keys()), bits(round_to_bf16(k0)));
    EXPECT_EQ(bits(c.values()), bits(round_to_bf16(v0)));
    EXPECT_EQ(c.key_pages().size(-1), d / 2);
    // Fork row 1 twice and drop row 0 (paged: the rows share row 1's pages, its last one partly filled).
    c.reorder({1, 1});
    const Tensor k1 = rng.normal({2, hkv, 2, d}), v1 = rng.normal({2, hkv, 2, d});
    c.append(k1, v1);  // each fork writes into a page of its own (copy on write)
    const Tensor row1k = round_to_bf16(k0.slice(0, 1, 2)), row1v = round_to_bf16(v0.slice(0, 1, 2));
    for (int64_t r = 0; r < 2; ++r) {
      const Tensor want_k = concat({row1k, round_to_bf16(k1.slice(0, r, r + 1))}, 2);
      const Tensor want_v = concat({row1v, round_to_bf16(v1.slice(0, r, r + 1))}, 2);
      EXPECT_EQ(bits(c.keys().slice(0, r, r + 1)), bits(want_k)) << "page " << page << " row " << r;
      EXPECT_EQ(bits(c.values().slice(0, r, r + 1)), bits(want_v)) << "page " << page << " row " << r;
    }
  }
}

TEST(KvCacheBf16, SharedPoolsMoveRowsWithTheirWords) {
  const int64_t hkv = 3, d = 4, page = 2;
  Rng rng(41);
  KvCache batch, fresh;
  batch.reset(0, hkv, d, page, page, Precision::kBFloat16);
  fresh.reset_shared(batch);
  EXPECT_EQ(fresh.storage(), Precision::kBFloat16);
  std::vector<Tensor> ks, vs;
  for (int64_t len : {3, 6}) {
    const Tensor k = rng.normal({1, hkv, len, d}), v = rng.normal({1, hkv, len, d});
    fresh.reset_shared(batch, 1);
    fresh.append(k, v);
    batch.take_rows(fresh);
    ks.push_back(k);
    vs.push_back(v);
  }
  // Retained pages seed a new row that shares them; the words read back unchanged.
  const std::vector<int32_t> pages = batch.row_pages(1);
  batch.retain_pages(pages);
  batch.reorder({1});
  const int64_t row = batch.add_row(pages, 6);
  for (int64_t r : {int64_t{0}, row}) {
    KvCache one;
    one.reset_shared(batch);
    one.add_row(batch.row_pages(r), 6);
    EXPECT_EQ(bits(one.keys()), bits(round_to_bf16(ks[1]))) << "row " << r;
    EXPECT_EQ(bits(one.values()), bits(round_to_bf16(vs[1]))) << "row " << r;
    one.reorder({});
  }
  batch.release_pages(pages);
}

// --- (d) misuse ------------------------------------------------------------------------------------------------------

TEST(KvCacheBf16, MisuseIsRefused) {
  KvCache c;
  EXPECT_TRUE(ThrowsArg([&] { c.reset(1, 2, 5, 4, 0, Precision::kBFloat16); }, "[KvCache] bf16 storage"));
  EXPECT_TRUE(ThrowsArg([&] { c.reset(1, 2, 4, 4, 0, Precision::kInt8); }, "[KvCache] storage int8"));
  KvCache bf, fp;
  bf.reset(0, 2, 4, 4, 2, Precision::kBFloat16);
  fp.reset(1, 2, 4, 4, 2);
  EXPECT_TRUE(ThrowsArg([&] { bf.take_rows(fp); }, "[KvCache] take_rows from a fp32 cache into a bf16 one"));
  Tensor kc = Tensor::zeros({2, 2, 1, 2}), vc = Tensor::zeros({2, 2, 1, 2});
  const Tensor q = Tensor::zeros({1, 1, 1, 4});
  const std::vector<int32_t> lens{1};
  EXPECT_TRUE(ThrowsArg([&] { attention_with_kvcache(q, kc, vc, {}, {}, lens, {}, 1, {}, Precision::kInt8); },
                        "[attention_with_kvcache] cache storage int8"));
  // float32 caches of D read as if they held bf16 pairs (2·D): D must agree with q's.
  Tensor k4 = Tensor::zeros({1, 2, 1, 4}), v4 = Tensor::zeros({1, 2, 1, 4});
  EXPECT_TRUE(ThrowsArg([&] { attention_with_kvcache(q, k4, v4, {}, {}, lens, {}, 1, {}, Precision::kBFloat16); },
                        "D must agree"));
  Rng rng(1);
  models::LlamaForCausalLM model(testing::tiny_gqa_llama(false), rng);
  decode::GenerateOptions g;
  g.kv_cache = Precision::kInt8;
  EXPECT_TRUE(ThrowsArg([&] { decode::generate(model, {1, 2}, g); }, "[generate] kv_cache int8"));
  decode::SchedulerOptions so;
  so.kv_cache = Precision::kInt8;
  EXPECT_TRUE(ThrowsArg([&] { decode::Scheduler s(model, so); }, "[scheduler] kv_cache int8"));
  // The pairs themselves, and the kernel and op that read them.
  EXPECT_TRUE(ThrowsArg([&] { to_bf16_pairs(Tensor::zeros({2, 3})); }, "[to_bf16_pairs] x (2, 3)"));
  EXPECT_TRUE(ThrowsArg([&] { from_bf16_pairs(Tensor()); }, "[from_bf16_pairs]"));
  const Tensor q3 = Tensor::zeros({1, 2, 4}), kv3 = Tensor::zeros({1, 2, 4});
  FlashConfig pairs;
  pairs.kv_bf16 = true;
  EXPECT_TRUE(ThrowsArg([&] { kernels::attention_flash_forward(q3, kv3, kv3, {}, Shape{1}, 1.0f, pairs); },
                        "[attention] k (1, 2, 4) of bf16 pairs must hold Dk / 2 words"));
  const Tensor half = Tensor::zeros({1, 2, 2}), lse = Tensor::zeros({1, 2});
  EXPECT_TRUE(ThrowsArg(
      [&] { kernels::attention_flash_backward(q3, half, half, q3, lse, q3, {}, Shape{1}, 1.0f, pairs); },
      "[attention_backward] k and v of bf16 pairs"));
  EXPECT_TRUE(ThrowsArg([&] { attention_kv_bf16(q3, Tensor::zeros({4}), half); }, "of bf16 pairs must have rank >= 2"));
}

// --- (e) a Llama model decoding with a bf16 cache --------------------------------------------------------------------

// Logits of each step with bf16 caches against float32 ones (contiguous and paged, plain Llama and Gemma 2's
// switches). Each layer reads K and V rounded to bf16, a relative change of at most 2^-9 each; at this random
// initialisation the scores stay O(1), so an attention output moves by a few 2^-9 of its size, and the layers' changes
// add through the residual stream. The bound 8 · layers · 2^-8 of the largest logit is that with room for the norms'
// and the MLP's gain; a cache read wrongly (pair order, stale or float32-misread pages) moves the logits by O(1)
// of their size. The difference must not be 0 either: the rounding took place.
TEST(KvCacheBf16, LlamaLogitsWithABf16CacheStayWithinTheRounding) {
  for (bool gemma : {false, true})
    for (int64_t page : {0, 3}) {
      Rng rng(7);
      const models::LlamaConfig cfg = testing::tiny_gqa_llama(gemma);
      const models::LlamaForCausalLM model(cfg, rng);
      std::vector<nn::KvCache> fp = model.new_caches(2, 2, page);
      std::vector<nn::KvCache> bf = model.new_caches(2, 2, page, Precision::kBFloat16);
      EXPECT_EQ(bf[0].storage(), Precision::kBFloat16);
      const Ids prompt{{3, 7, 1, 19, 5, 2, 8, 0}, {2, 4}};
      double worst = 0.0, mag = 0.0;
      auto compare = [&](const Tensor& a, const Tensor& b) {
        const std::vector<float> x = a.contiguous().to_vector(), y = b.contiguous().to_vector();
        for (size_t i = 0; i < x.size(); ++i) {
          worst = std::max(worst, double{std::abs(x[i] - y[i])});
          mag = std::max(mag, double{std::abs(y[i])});
        }
      };
      compare(model.forward(nn::Context(), prompt, &bf).value, model.forward(nn::Context(), prompt, &fp).value);
      for (int64_t t = 0; t < 6; ++t) {
        const Ids next{{(5 * t + 1) % 23, (7 * t + 4) % 23}, {2, 1}};
        compare(model.forward(nn::Context(), next, &bf).value, model.forward(nn::Context(), next, &fp).value);
      }
      const double bound = 8.0 * static_cast<double>(cfg.num_hidden_layers) * std::ldexp(1.0, -8) * mag;
      EXPECT_LE(worst, bound) << "gemma " << gemma << " page " << page;
      EXPECT_GT(worst, 0.0) << "gemma " << gemma << " page " << page;
    }
}

// generate() with GenerateOptions::kv_cache: the contiguous and the paged step both decode over bf16 caches (the
// option reaches the caches decode::Batch makes), the same tokens on every run.
TEST(KvCacheBf16, GenerateHonoursTheKvCacheOption) {
  Rng rng(9);
  const models::LlamaForCausalLM model(testing::tiny_gqa_llama(false), rng);
  for (int64_t page : {0, 4}) {
    decode::GenerateOptions o;
    o.max_new_tokens = 6;
    o.page_size = page;
    o.kv_cache = Precision::kBFloat16;
    const decode::Generation a = decode::generate(model, {3, 7, 1, 19}, o);
    const decode::Generation b = decode::generate(model, {3, 7, 1, 19}, o);
    EXPECT_EQ(a.tokens.size(), 6u) << "page " << page;
    EXPECT_EQ(a.tokens, b.tokens) << "page " << page;
  }
  // The searches' cached step: bf16 caches hold half the bytes a row.
  const int64_t fp = decode::cached_step(model, {{3, 7}}).row_bytes(10);
  EXPECT_EQ(decode::cached_step(model, {{3, 7}}, 0, Precision::kBFloat16).row_bytes(10) * 2, fp);
}

// The Scheduler's pool honours SchedulerOptions::kv_cache: its greedy tokens are generate()'s with the same page
// size and storage (the same paged step), and its log-probabilities differ from a float32 pool's (the rounding took
// place there).
TEST(KvCacheBf16, SchedulerPoolTakesTheStorage) {
  Rng rng(13);
  const models::LlamaForCausalLM model(testing::tiny_gqa_llama(false), rng);
  const std::vector<int64_t> prompt{3, 7, 1, 19, 5, 2, 8};
  decode::RequestOptions r;
  r.max_new_tokens = 5;
  r.top_logprobs = 0;
  auto run = [&](Precision storage) {
    decode::SchedulerOptions so;
    so.max_batch = 2;
    so.page_size = 4;
    so.kv_cache = storage;
    decode::Scheduler s(model, so);
    std::mutex mu;
    std::condition_variable cv;
    std::vector<decode::TokenEvent> events;
    bool done = false;
    s.submit(
        prompt, r,
        [&](const decode::TokenEvent& e) {
          std::lock_guard<std::mutex> lock(mu);
          events.push_back(e);
          return true;
        },
        [&](const decode::RequestResult&) {
          std::lock_guard<std::mutex> lock(mu);
          done = true;
          cv.notify_all();
        });
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return done; }));
    return events;
  };
  const std::vector<decode::TokenEvent> bf = run(Precision::kBFloat16), fp = run(Precision::kFloat32);
  decode::GenerateOptions o;
  o.max_new_tokens = 5;
  o.page_size = 4;
  o.kv_cache = Precision::kBFloat16;
  const std::vector<int64_t> want = decode::generate(model, prompt, o).tokens;
  ASSERT_EQ(bf.size(), want.size());
  ASSERT_EQ(fp.size(), want.size());
  bool differ = false;
  for (size_t i = 0; i < bf.size(); ++i) {
    EXPECT_EQ(bf[i].id, want[i]) << "token " << i;
    differ = differ || bf[i].logprob != fp[i].logprob;
  }
  EXPECT_TRUE(differ);
}

}  // namespace
}  // namespace qkv
