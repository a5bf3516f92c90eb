// Teacher-forced forward of the RNN Seq2Seq (models::Seq2Seq: no attention, Bahdanau or Luong) on a Graph.
// The recurrent layers still run on the tape through train::Graph; the Transformer models take a Context directly.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/models/seq2seq.h"
#include "qkv/ops/embedding.h"
#include "qkv/train/graph.h"

namespace qkv::train {

// src: ids (B, Ts)  src_lengths: empty or B values in [0, Ts]  tgt_in: ids (B, Tt) (bos + target[:-1])
//   ->  logits (B, Tt, Vt), as models::Seq2Seq::forward (teacher forcing). Parameters are read by their names
// ("encoder.weight_ih_l0", "attention.W.weight", ...), so the model's private layers need no accessors.
ad::Var seq2seq_rnn_logits(Graph& g, models::Seq2Seq& m, const Ids& src, const std::vector<int64_t>& src_lengths,
                       const Ids& tgt_in);

}  // namespace qkv::train
