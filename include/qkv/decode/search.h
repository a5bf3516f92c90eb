// Greedy and beam search over any model that extends target prefixes one token at a time (StepModel): the RNN
// Seq2Seq, the Transformer with its KV cache, or a full-recomputation reference.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "qkv/core/tensor.h"
#include "qkv/decode/sampling.h"

namespace qkv::decode {

// A batch of target prefixes ("rows") that grows by one token per step() for every row at once. Rows are
// renumbered at each call, which is how a search forks (beam) and drops (finished) hypotheses.
class StepModel {
 public:
  virtual ~StepModel() = default;
  virtual int64_t num_sources() const = 0;  // S >= 1: the inputs being decoded
  virtual int64_t vocab_size() const = 0;
  // How many step() calls fit after start() (positions of a learned table, ...); unlimited by default.
  virtual int64_t capacity() const { return std::numeric_limits<int64_t>::max(); }
  // Bytes one row holds after `steps` step() calls (its KV caches), for the memory estimate of a beam search;
  // 0 when unknown or small.
  virtual int64_t row_bytes(int64_t steps) const { (void)steps; return 0; }
  // Starts over with S rows, row s holding source s's empty prefix.
  virtual void start() = 0;
  // rows: N indices into the previous rows (after start(): source indices), the row each new row extends (a row
  // may be taken several times or not at all); tokens: N tokens, the one appended to each new row (BOS first).
  // -> logits (N, V) of the next token of each new row. N >= 1.
  virtual Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) = 0;
  // Attention of the last step over the source (N, Ts) (heads averaged; the last layer for Transformers), when
  // record_attention(true) was asked and the model has one; undefined otherwise.
  virtual void record_attention(bool on) { (void)on; }
  virtual Tensor last_attention() const { return {}; }
};

// Bytes of float32 keys and values of `layers` layers, `width` values (heads x head_dim) each, over `positions`
// positions: what one row of a KV-cached step model holds (its row_bytes). Saturates at INT64_MAX.
int64_t kv_row_bytes(int64_t layers, int64_t width, int64_t positions);

struct SearchOptions {
  int64_t max_len = 64;  // at most this many tokens generated per source (EOS included); >= 1
  int64_t bos = 1;       // the first token fed to every row
  int64_t eos = 2;       // ends a hypothesis; -1: none (every hypothesis runs to max_len)
};

struct Hypothesis {
  std::vector<int64_t> tokens;  // generated tokens without BOS; ends with EOS when finished
  double log_prob = 0.0;        // sum of log-softmax (double) of the chosen tokens
  double score = 0.0;           // log_prob / length_penalty(tokens.size())  (greedy: log_prob)
  bool finished = false;        // ended with EOS (else cut at max_len)
};

// One row per source, its next token drawn from the row's logits by sample_token (decode/sampling.h: temperature,
// top-k, top-p) until EOS or max_len; finished rows leave the batch. Source s draws from its own Rng, seeded from
// sampling.seed and s, so its tokens do not depend on which other sources run beside it or when they finish.
// Temperature 0 is greedy_search. -> one hypothesis per source (log_prob: of the drawn tokens under the model's
// unfiltered softmax; score = log_prob). Throws "[sampling] ..." for bad sampling options.
std::vector<Hypothesis> sample_search(StepModel& model, const SearchOptions& options, const SamplingOptions& sampling);

// Argmax at every step (the lowest id on ties) until EOS or max_len; finished rows leave the batch: sample_search
// at temperature 0. -> one hypothesis per source.
std::vector<Hypothesis> greedy_search(StepModel& model, const SearchOptions& options);

enum class LengthPenalty {
  kNone,     // lp = 1: plain log-probability (favours short outputs)
  kGnmt,     // lp = ((5 + |Y|) / 6)^alpha   (Wu et al. 2016, GNMT; alpha 0.6 .. 1)
  kAverage,  // lp = |Y|^alpha               (alpha = 1: mean log-probability per token)
};

struct BeamOptions {
  int64_t beam_size = 4;  // >= 1
  LengthPenalty penalty = LengthPenalty::kGnmt;
  double alpha = 0.6;     // >= 0
  // > 0: refuse (invalid_argument, naming the estimate and this limit) a search whose memory estimate,
  // S * beam_size * (row_bytes(max_len) + V * (candidate + logit bytes)), exceeds this many bytes. 0: no limit.
  int64_t max_bytes = 0;
};

// The divisor of a hypothesis' log-probability. |Y| counts the generated tokens including EOS. length >= 1.
double length_penalty(int64_t length, LengthPenalty penalty, double alpha);

// Beam search: each source keeps beam_size live hypotheses; every step scores all (hypothesis, token) extensions,
// takes the best 2·beam_size, moves those ending in EOS to the finished list (scored with the length penalty) and
// keeps the best beam_size others alive. A source stops when it has beam_size finished hypotheses and no live one
// can still beat the worst of them (bound: live log_prob / lp(max_len), valid as lp never decreases), or at max_len,
// where live hypotheses join the list unfinished. Ties break by lower hypothesis index, then lower token id.
// A beam wider than V searches exhaustively for a few steps (V^t < beam_size); BeamOptions::max_bytes bounds it.
// -> per source, up to beam_size hypotheses, best score first.
std::vector<std::vector<Hypothesis>> beam_search(StepModel& model, const SearchOptions& options,
                                                 const BeamOptions& beam);

// Feeds BOS + tokens[s] (teacher forcing, all sources padded by repeating EOS) with record_attention on and
// collects each source's attention -> per source (|tokens[s]|, Ts), or empty tensors when the model has none.
std::vector<Tensor> forced_attention(StepModel& model, const std::vector<std::vector<int64_t>>& tokens,
                                     int64_t bos);

}  // namespace qkv::decode
