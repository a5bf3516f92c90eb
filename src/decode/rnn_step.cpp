// RnnStep: Seq2Seq::decode_step behind the StepModel interface; encoder outputs are re-gathered only when the
// rows' sources change (beam forks), recurrent states every step.
#include "qkv/decode/rnn_step.h"

#include "qkv/core/error.h"
#include "qkv/nn/kv_cache.h"

namespace qkv::decode {
using nn::gather_rows;
using nn::is_identity;
using nn::KvCache;
namespace {
Tensor gather_if(const Tensor& t, const std::vector<int64_t>& rows, int64_t axis) {
  return t.defined() ? gather_rows(t, rows, axis) : Tensor();
}
}  // namespace

RnnStep::RnnStep(const models::Seq2Seq& model, const Ids& src, const std::vector<int64_t>& src_lengths)
    : model_(&model) {
  QKV_CHECK_ARG(src.shape.size() == 2 && src.shape[0] >= 1, "[RnnStep] src ids ", str(src.shape),
                " must be (S, Ts) with S >= 1");
  sources_ = src.shape[0];
  enc_ = model.encode(src, src_lengths);
}

void RnnStep::start() {
  row_source_.resize(static_cast<size_t>(sources_));
  for (int64_t s = 0; s < sources_; ++s) row_source_[static_cast<size_t>(s)] = s;
  state_ = model_->initial_state(enc_);
  gathered_for_.clear();
  attention_ = Tensor();
}

Tensor RnnStep::step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) {
  QKV_CHECK_ARG(!row_source_.empty(), "[RnnStep] step before start");
  QKV_CHECK_ARG(!rows.empty() && rows.size() == tokens.size(), "[RnnStep] step needs N >= 1 rows and as many tokens, ",
                "got ", rows.size(), " rows and ", tokens.size(), " tokens");
  const int64_t prev = static_cast<int64_t>(row_source_.size());
  std::vector<int64_t> src(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    QKV_CHECK_ARG(rows[i] >= 0 && rows[i] < prev, "[RnnStep] row ", rows[i], " is outside [0, ", prev, ")");
    src[i] = row_source_[static_cast<size_t>(rows[i])];
  }
  row_source_ = src;
  if (!is_identity(rows, prev)) {
    state_.h = gather_rows(state_.h, rows, 1);
    state_.c = gather_if(state_.c, rows, 1);
  }
  if (row_source_ != gathered_for_) {
    if (is_identity(row_source_, sources_)) {
      row_enc_ = enc_;
    } else {
      row_enc_.states = gather_rows(enc_.states, row_source_, 0);
      row_enc_.h_n = gather_rows(enc_.h_n, row_source_, 1);
      row_enc_.c_n = gather_if(enc_.c_n, row_source_, 1);
      row_enc_.keep_mask = gather_if(enc_.keep_mask, row_source_, 0);
      row_enc_.prepared = gather_if(enc_.prepared, row_source_, 0);
    }
    gathered_for_ = row_source_;
  }
  models::Seq2SeqStep st = model_->decode_step(row_enc_, state_, tokens);
  state_ = st.state;
  attention_ = st.weights;
  return st.logits;
}

}  // namespace qkv::decode
