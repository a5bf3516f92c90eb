// Checkpoints of a training run: RUN/checkpoints/step-NNNNNNNN/{model.safetensors, optimizer.safetensors,
// trainer.json}. Each is written into a temporary directory (files fsynced), renamed into place (atomic) and the
// parent fsynced; only then are older ones removed, so a SIGKILL at any moment leaves the last good one.
#pragma once

#include <cstdint>
#include <string>

#include "qkv/nn/module.h"

namespace qkv::train {

// Everything besides weights and optimizer state that a bit-exact resume needs.
struct TrainerState {
  int64_t step = 0;            // optimizer steps done
  int64_t epoch = 0;           // data::Sampler position
  int64_t position = 0;
  uint64_t dropout_rng_state = 0;  // the training Context's dropout Rng (seeded from the run seed)
  double last_loss = 0.0;
  double elapsed_s = 0.0;      // training time so far
};

// Saves step `state.step` of a `model_kind` run under run_dir and keeps the newest `keep` checkpoints.
// Returns the checkpoint's directory. Throws runtime_error "[checkpoint] ..." on I/O failure.
std::string save_checkpoint(const std::string& run_dir, const std::string& model_kind, const nn::StateDict& weights,
                            const nn::StateDict& optimizer, const TrainerState& state, int64_t keep);

// The newest complete checkpoint directory of a run, or "" when there is none.
std::string latest_checkpoint(const std::string& run_dir);

struct LoadedCheckpoint {
  std::string path;
  nn::StateDict weights;
  nn::StateDict optimizer;
  TrainerState state;
};

// Loads a checkpoint directory; throws invalid_argument "[checkpoint] PATH holds a 'rnn' model, not 'transformer'"
// when it belongs to another model kind, and "[checkpoint] ..." on a damaged file.
LoadedCheckpoint load_checkpoint(const std::string& path, const std::string& model_kind);

// The newest complete checkpoint of a run, loaded; path "" when there is none. Safe while a training run writes
// and prunes: a checkpoint pruned between listing and reading is skipped for the next newest.
LoadedCheckpoint load_latest_checkpoint(const std::string& run_dir, const std::string& model_kind);

// Parses trainer.json; throws invalid_argument "[checkpoint] NAME: ..." on any malformed or missing field.
TrainerState parse_trainer_state(const std::string& text, const std::string& name);

// fsync of a directory (so that a rename inside it is durable). Throws runtime_error on failure.
void fsync_directory(const std::string& dir);

}  // namespace qkv::train
