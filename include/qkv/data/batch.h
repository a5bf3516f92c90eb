// Batching: padded id matrices with their lengths and padding masks, seq2seq and decoder-only (LM) batches, and a
// sampler whose epoch orders are deterministic shuffles from a seed (resumable from (epoch, position) alone).
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/core/ids.h"

namespace qkv::data {

// One training pair as ids without specials (BOS/EOS are added by the batch builders).
struct Example {
  std::vector<int64_t> src;
  std::vector<int64_t> tgt;
};

struct Padded {
  Ids ids;                       // (B, T), T = longest sequence (at least min_len); PAD after each sequence
  std::vector<int64_t> lengths;  // B real lengths
  Tensor padding_mask;           // (B, T) float: 1 at padding (MaskKind::kBlock key_padding_mask), 0 elsewhere
};

// seqs: B sequences (B >= 1) -> padded to the longest (or min_len when longer) with `pad`.
Padded pad_sequences(const std::vector<std::vector<int64_t>>& seqs, int64_t pad = 0, int64_t min_len = 0);

// An encoder-decoder batch (teacher forcing).
struct Seq2SeqBatch {
  Padded src;      // (B, Ts): src ids (no BOS/EOS)
  Padded tgt_in;   // (B, Tt): BOS + tgt            (decoder input)
  Padded tgt_out;  // (B, Tt): tgt + EOS, PAD after (cross-entropy targets, ignore_index = PAD)
  int64_t num_target_tokens = 0;  // non-PAD entries of tgt_out
};
// examples: B >= 1 pairs. With add_src_eos the source gets EOS appended (then no source is empty).
Seq2SeqBatch make_seq2seq_batch(const std::vector<const Example*>& examples, bool add_src_eos = false);

// A decoder-only batch: each row is  src + BOS + tgt + EOS  shifted by one. Loss only on the target part.
struct LmBatch {
  Padded input;                 // (B, T): (src + BOS + tgt)
  std::vector<int64_t> targets; // B*T: next token where it is a target token (tgt + EOS), PAD elsewhere
  std::vector<int64_t> prompt_lengths;  // B: |src| + 1 (the BOS is the last prompt token)
  int64_t num_target_tokens = 0;
};
LmBatch make_lm_batch(const std::vector<const Example*>& examples);

// A Fisher-Yates permutation of [0, n) drawing rng.below().
std::vector<int64_t> shuffled_indices(int64_t n, Rng& rng);

// Hands out batches of example indices: each epoch is a fresh permutation from Rng(mix(seed, epoch)); the last
// batch of an epoch may be short (never empty). The whole state is (epoch, position), so resuming needs no RNG state.
class Sampler {
 public:
  // n >= 1, batch_size >= 1.
  Sampler(int64_t n, int64_t batch_size, uint64_t seed);
  std::vector<int64_t> next();
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return pos_; }
  // Restores (epoch, position) as reported before; position in [0, n].
  void seek(int64_t epoch, int64_t position);

 private:
  void reshuffle();
  int64_t n_, batch_size_;
  uint64_t seed_;
  int64_t epoch_ = 0, pos_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace qkv::data
