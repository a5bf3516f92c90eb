// The attention of a `qkv train` run for the viewer: the model's attention over a source while it emits the latest
// checkpoint's output for it (teacher-forced), at the latest checkpoint or at every kept one. Used by `qkv viz --run`
// and `qkv serve --run`.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "qkv/data/vocab.h"
#include "run_config.h"
#include "run_model.h"
#include "viz_page.h"

namespace qkv::cli {

class RunViewer {
 public:
  // Loads RUN/config.json, vocab.txt and the latest checkpoint; a model without attention (rnn) is refused with
  // invalid_argument "[op] ...".
  RunViewer(const std::string& run_dir, const char* op);
  ~RunViewer();

  // One snapshot (the latest checkpoint), or one per kept checkpoint, oldest first, all emitting the latest
  // checkpoint's output so that they share their axes. Each holds one cross group: target x source, 1 x 1 maps.
  std::vector<VizSnapshot> snapshots(const std::string& input, bool all_checkpoints);
  // Source tokens of `input` (what the map's x axis shows).
  int64_t source_length(const std::string& input) const;
  std::string title(const std::string& input) const;
  const data::Vocabulary& vocab() const { return vocab_; }

 private:
  std::string run_dir_, op_;
  RunConfig config_;
  data::Vocabulary vocab_;
  std::unique_ptr<train::TextModel> latest_;
  int64_t step_ = 0;
};

}  // namespace qkv::cli
