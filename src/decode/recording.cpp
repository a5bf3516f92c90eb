// RecordingDecoder: one row of the cached decoding step (decode_batch.h), each forward recording.
#include "qkv/decode/recording.h"

#include <utility>

#include "decode_batch.h"
#include "qkv/core/error.h"

namespace qkv::decode {

RecordingDecoder::RecordingDecoder(const models::LlamaForCausalLM& model, int64_t page_size, int64_t capacity,
                                   Precision kv_cache) {
  QKV_CHECK_ARG(page_size >= 1, "[RecordingDecoder] page_size must be >= 1, got ", page_size);
  batch_ = std::make_unique<detail::Batch>(model, page_size, capacity, kv_cache);
}

RecordingDecoder::~RecordingDecoder() = default;

models::CausalLMOutput RecordingDecoder::prefill(const std::vector<int64_t>& prompt,
                                                 const models::ForwardOptions& options) {
  QKV_CHECK_ARG(batch_->rows() == 0, "[RecordingDecoder] prefill once, before any step");
  QKV_CHECK_ARG(!prompt.empty(), "[RecordingDecoder] the prompt is empty");
  detail::Record record{options, {}};
  batch_->add(prompt, {}, 0, &record);
  return std::move(record.output);
}

models::CausalLMOutput RecordingDecoder::step(int64_t token, const models::ForwardOptions& options) {
  QKV_CHECK_ARG(batch_->rows() == 1, "[RecordingDecoder] step before prefill");
  detail::Record record{options, {}};
  batch_->step({token}, &record);
  return std::move(record.output);
}

int64_t RecordingDecoder::length() const { return batch_->rows() == 0 ? 0 : batch_->row_length(0); }

}  // namespace qkv::decode
