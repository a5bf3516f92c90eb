// Greedy and beam search over a StepModel; log-probabilities in double, deterministic tie-breaking.
#include "qkv/decode/search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <numeric>

#include "qkv/core/error.h"
#include "qkv/core/rng.h"
#include "qkv/ops/shape_ops.h"

namespace qkv::decode {
namespace {

void check_options(StepModel& model, const SearchOptions& o, const char* op) {
  const int64_t V = model.vocab_size();
  QKV_CHECK_ARG(model.num_sources() >= 1, "[", op, "] the model has no sources to decode");
  QKV_CHECK_ARG(o.max_len >= 1, "[", op, "] max_len must be >= 1, got ", o.max_len);
  QKV_CHECK_ARG(o.bos >= 0 && o.bos < V, "[", op, "] bos ", o.bos, " must be in [0, ", V, ")");
  QKV_CHECK_ARG(o.eos >= -1 && o.eos < V, "[", op, "] eos ", o.eos, " must be in [0, ", V, ") or -1 (none)");
}

// 25769803776 -> "24.00 GiB".
std::string gib(double bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

// One row of logits -> log-softmax in double.
void log_softmax_row(const float* x, int64_t V, std::vector<double>& out) {
  out.resize(static_cast<size_t>(V));
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(x[v]));
  double s = 0.0;
  for (int64_t v = 0; v < V; ++v) s += std::exp(static_cast<double>(x[v]) - m);
  const double lse = m + std::log(s);
  for (int64_t v = 0; v < V; ++v) out[static_cast<size_t>(v)] = static_cast<double>(x[v]) - lse;
}

Tensor checked_logits(const Tensor& logits, int64_t N, int64_t V, const char* op) {
  QKV_CHECK_ARG(logits.defined() && logits.shape() == Shape({N, V}), "[", op, "] the model returned logits ",
                logits.defined() ? str(logits.shape()) : std::string("(undefined)"), ", expected ",
                str(Shape{N, V}));
  return logits.contiguous();
}

}  // namespace

int64_t kv_row_bytes(int64_t layers, int64_t width, int64_t positions) {
  const double bytes = 2.0 * static_cast<double>(std::max<int64_t>(layers, 0)) *
                       static_cast<double>(std::max<int64_t>(width, 0)) *
                       static_cast<double>(std::max<int64_t>(positions, 0)) * sizeof(float);
  return bytes >= 9.0e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(bytes);
}

double length_penalty(int64_t length, LengthPenalty penalty, double alpha) {
  QKV_CHECK_ARG(length >= 1, "[length_penalty] length must be >= 1, got ", length);
  QKV_CHECK_ARG(alpha >= 0.0 && std::isfinite(alpha), "[length_penalty] alpha must be finite and >= 0, got ", alpha);
  switch (penalty) {
    case LengthPenalty::kNone: return 1.0;
    case LengthPenalty::kGnmt: return std::pow((5.0 + static_cast<double>(length)) / 6.0, alpha);
    case LengthPenalty::kAverage: return std::pow(static_cast<double>(length), alpha);
  }
  return 1.0;
}

namespace {

// greedy_search and sample_search: one row per source, the next token chosen from each row's logits.
std::vector<Hypothesis> one_row_search(StepModel& model, const SearchOptions& o, const SamplingOptions& sampling,
                                       const char* op) {
  check_options(model, o, op);
  check_sampling(sampling);
  const int64_t S = model.num_sources(), V = model.vocab_size();
  const int64_t max_len = std::min(o.max_len, model.capacity());
  QKV_CHECK_ARG(max_len >= 1, "[", op, "] the model has no room for a single step");
  std::vector<Hypothesis> out(static_cast<size_t>(S));
  std::vector<int64_t> rows(static_cast<size_t>(S)), tokens(static_cast<size_t>(S), o.bos), source(rows.size());
  std::iota(rows.begin(), rows.end(), 0);
  std::iota(source.begin(), source.end(), 0);
  std::vector<Rng> rngs;  // one stream a source (a golden-ratio step apart)
  for (int64_t s = 0; s < S; ++s) rngs.emplace_back(sampling.seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(s)));
  model.start();
  std::vector<double> lp;
  for (int64_t t = 0; t < max_len && !rows.empty(); ++t) {
    const int64_t N = static_cast<int64_t>(rows.size());
    const Tensor logits = checked_logits(model.step(rows, tokens), N, V, op);
    std::vector<int64_t> next_rows, next_tokens, next_source;
    for (int64_t i = 0; i < N; ++i) {
      const float* x = logits.data() + i * V;
      const auto src = static_cast<size_t>(source[static_cast<size_t>(i)]);
      const int64_t best = sample_token(x, V, sampling, rngs[src]);  // temperature 0: the first maximum
      log_softmax_row(x, V, lp);
      Hypothesis& h = out[src];
      h.tokens.push_back(best);
      h.log_prob += lp[static_cast<size_t>(best)];
      if (best == o.eos) {
        h.finished = true;
        continue;
      }
      next_rows.push_back(i);
      next_tokens.push_back(best);
      next_source.push_back(source[static_cast<size_t>(i)]);
    }
    rows.swap(next_rows);
    tokens.swap(next_tokens);
    source.swap(next_source);
  }
  for (Hypothesis& h : out) h.score = h.log_prob;
  return out;
}

}  // namespace

std::vector<Hypothesis> sample_search(StepModel& model, const SearchOptions& options,
                                      const SamplingOptions& sampling) {
  return one_row_search(model, options, sampling, "sample_search");
}

std::vector<Hypothesis> greedy_search(StepModel& model, const SearchOptions& options) {
  return one_row_search(model, options, SamplingOptions{}, "greedy_search");
}

std::vector<std::vector<Hypothesis>> beam_search(StepModel& model, const SearchOptions& o, const BeamOptions& b) {
  check_options(model, o, "beam_search");
  QKV_CHECK_ARG(b.beam_size >= 1, "[beam_search] beam_size must be >= 1, got ", b.beam_size);
  QKV_CHECK_ARG(b.alpha >= 0.0 && std::isfinite(b.alpha), "[beam_search] alpha must be finite and >= 0, got ",
                b.alpha);
  const int64_t S = model.num_sources(), V = model.vocab_size(), K = b.beam_size;
  const int64_t max_len = std::min(o.max_len, model.capacity());
  QKV_CHECK_ARG(max_len >= 1, "[beam_search] the model has no room for a single step");
  if (b.max_bytes > 0) {
    struct CandBytes {
      double log_prob;
      int64_t hyp, token;
    };
    const double rows = static_cast<double>(S) * static_cast<double>(K);
    const double cache = rows * static_cast<double>(model.row_bytes(max_len));
    const double cands = rows * static_cast<double>(V) * static_cast<double>(sizeof(CandBytes) + sizeof(float));
    QKV_CHECK_ARG(cache + cands <= static_cast<double>(b.max_bytes), "[beam_search] ", K, " beams x ", S,
                  " source(s) need about ", gib(cache + cands), " (KV caches ", gib(cache), " + candidate scores ",
                  gib(cands), "), more than the limit of ", gib(static_cast<double>(b.max_bytes)),
                  ": use a narrower beam or a shorter output");
  }
  const double lp_max = length_penalty(max_len, b.penalty, b.alpha);

  struct Live {
    Hypothesis h;
    int64_t row;  // its row in the model's current batch
  };
  std::vector<std::vector<Live>> live(static_cast<size_t>(S));
  std::vector<std::vector<Hypothesis>> finished(static_cast<size_t>(S));
  std::vector<int64_t> rows, tokens;
  for (int64_t s = 0; s < S; ++s) {
    live[static_cast<size_t>(s)].push_back({Hypothesis{}, s});
    rows.push_back(s);
    tokens.push_back(o.bos);
  }
  auto by_score = [](const Hypothesis& x, const Hypothesis& y) { return x.score > y.score; };
  model.start();
  std::vector<double> lp;
  struct Cand {
    double log_prob;
    int64_t hyp, token;
  };
  std::vector<Cand> cands;
  for (int64_t t = 0; t < max_len && !rows.empty(); ++t) {
    const int64_t N = static_cast<int64_t>(rows.size());
    const Tensor logits = checked_logits(model.step(rows, tokens), N, V, "beam_search");
    std::vector<int64_t> next_rows, next_tokens;
    const bool last = t + 1 == max_len;
    for (int64_t s = 0; s < S; ++s) {
      std::vector<Live>& L = live[static_cast<size_t>(s)];
      if (L.empty()) continue;
      cands.clear();
      for (int64_t j = 0; j < static_cast<int64_t>(L.size()); ++j) {
        log_softmax_row(logits.data() + L[static_cast<size_t>(j)].row * V, V, lp);
        for (int64_t v = 0; v < V; ++v)
          cands.push_back({L[static_cast<size_t>(j)].h.log_prob + lp[static_cast<size_t>(v)], j, v});
      }
      const size_t keep = std::min(cands.size(), static_cast<size_t>(2 * K));
      std::partial_sort(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(keep), cands.end(),
                        [](const Cand& x, const Cand& y) {
                          if (x.log_prob != y.log_prob) return x.log_prob > y.log_prob;
                          if (x.hyp != y.hyp) return x.hyp < y.hyp;
                          return x.token < y.token;
                        });
      std::vector<Live> next;
      std::vector<Hypothesis>& F = finished[static_cast<size_t>(s)];
      for (size_t c = 0; c < keep && static_cast<int64_t>(next.size()) < K; ++c) {
        const Cand& cd = cands[c];
        if (!std::isfinite(cd.log_prob)) break;  // a -inf extension (fully masked logits) is never taken
        Hypothesis h = L[static_cast<size_t>(cd.hyp)].h;
        h.tokens.push_back(cd.token);
        h.log_prob = cd.log_prob;
        h.score = h.log_prob / length_penalty(static_cast<int64_t>(h.tokens.size()), b.penalty, b.alpha);
        if (cd.token == o.eos) {
          h.finished = true;
          F.push_back(std::move(h));
        } else {
          next.push_back({std::move(h), L[static_cast<size_t>(cd.hyp)].row});
        }
      }
      std::stable_sort(F.begin(), F.end(), by_score);
      if (static_cast<int64_t>(F.size()) > K) F.resize(static_cast<size_t>(K));
      bool done = next.empty() || last;
      if (!done && static_cast<int64_t>(F.size()) == K) {
        double best_bound = -std::numeric_limits<double>::infinity();
        for (const Live& l : next) best_bound = std::max(best_bound, l.h.log_prob / lp_max);
        done = best_bound <= F.back().score;
      }
      if (done) {
        if (last)
          for (Live& l : next) F.push_back(std::move(l.h));  // cut at max_len: unfinished
        std::stable_sort(F.begin(), F.end(), by_score);
        if (static_cast<int64_t>(F.size()) > K) F.resize(static_cast<size_t>(K));
        next.clear();
      }
      for (Live& l : next) {
        next_rows.push_back(l.row);
        next_tokens.push_back(l.h.tokens.back());
        l.row = static_cast<int64_t>(next_rows.size()) - 1;
      }
      L = std::move(next);
    }
    rows.swap(next_rows);
    tokens.swap(next_tokens);
  }
  return finished;
}

std::vector<Tensor> forced_attention(StepModel& model, const std::vector<std::vector<int64_t>>& tokens, int64_t bos) {
  const int64_t S = model.num_sources();
  QKV_CHECK_ARG(static_cast<int64_t>(tokens.size()) == S, "[forced_attention] got ", tokens.size(),
                " token sequences for ", S, " sources");
  const int64_t V = model.vocab_size();
  QKV_CHECK_ARG(bos >= 0 && bos < V, "[forced_attention] bos ", bos, " must be in [0, ", V, ")");
  int64_t longest = 0;
  for (const auto& t : tokens) {
    for (int64_t id : t) QKV_CHECK_ARG(id >= 0 && id < V, "[forced_attention] token ", id, " is outside [0, ", V, ")");
    longest = std::max<int64_t>(longest, static_cast<int64_t>(t.size()));
  }
  QKV_CHECK_ARG(longest <= model.capacity(), "[forced_attention] ", longest, " tokens exceed the model's capacity ",
                model.capacity());
  std::vector<std::vector<Tensor>> rows_att(static_cast<size_t>(S));
  std::vector<int64_t> rows, feed, source;
  for (int64_t s = 0; s < S; ++s)
    if (!tokens[static_cast<size_t>(s)].empty()) {
      rows.push_back(s);
      feed.push_back(bos);
      source.push_back(s);
    }
  model.record_attention(true);
  model.start();
  for (int64_t t = 0; !rows.empty(); ++t) {
    model.step(rows, feed);
    const Tensor att = model.last_attention();
    std::vector<int64_t> nr, nf, ns;
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& seq = tokens[static_cast<size_t>(source[i])];
      if (att.defined()) rows_att[static_cast<size_t>(source[i])].push_back(att.select(0, static_cast<int64_t>(i)));
      if (t + 1 < static_cast<int64_t>(seq.size())) {
        nr.push_back(static_cast<int64_t>(i));
        nf.push_back(seq[static_cast<size_t>(t)]);
        ns.push_back(source[i]);
      }
    }
    rows.swap(nr);
    feed.swap(nf);
    source.swap(ns);
  }
  model.record_attention(false);
  std::vector<Tensor> out(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s)
    if (!rows_att[static_cast<size_t>(s)].empty()) out[static_cast<size_t>(s)] = stack(rows_att[static_cast<size_t>(s)], 0);
  return out;
}

}  // namespace qkv::decode
