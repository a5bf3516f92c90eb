// Teacher-forced forwards of the Transformer models on a Graph: the encoder-decoder (models::Seq2SeqTransformer)
// and the decoder-only causal LM (models::DecoderOnlyTransformer). Same math as the models' forward-only code.
#pragma once

#include "qkv/models/transformer.h"
#include "qkv/ops/embedding.h"
#include "qkv/train/graph.h"

namespace qkv::train {

// src: ids (B, Ts)  tgt: ids (B, Tt)  ->  logits (B, Tt, Vt), as models::Seq2SeqTransformer::forward.
Var seq2seq_transformer_logits(Graph& g, const models::Seq2SeqTransformer& m, const Ids& src, const Ids& tgt,
                               const models::Seq2SeqMasks& masks = {});

// ids: (B, T), T <= max_len  key_padding_mask: optional (B, T), nonzero = padding  ->  logits (B, T, V),
// as models::DecoderOnlyTransformer::forward.
Var decoder_only_logits(Graph& g, const models::DecoderOnlyTransformer& m, const Ids& ids,
                        const Tensor& key_padding_mask = {});

}  // namespace qkv::train
