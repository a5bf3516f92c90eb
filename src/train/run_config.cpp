// RunConfig: per-kind defaults, validation, and the flat JSON text of config.json (write and strict read).
#include "qkv/train/run_config.h"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/core/io.h"
#include "qkv/core/json.h"

namespace qkv::train {
namespace {

bool one_of(const std::string& v, std::initializer_list<const char*> choices) {
  for (const char* c : choices)
    if (v == c) return true;
  return false;
}


// Visits every field with its JSON name; used by both writer and reader so the two cannot drift.
struct FieldVisitor {
  std::function<void(const char*, std::string&)> str;
  std::function<void(const char*, int64_t&)> i64;
  std::function<void(const char*, uint64_t&)> u64;
  std::function<void(const char*, double&)> f64;
  std::function<void(const char*, bool&)> flag;
};

void visit(RunConfig& c, const FieldVisitor& v) {
  v.str("model", c.model);
  v.str("cell", c.cell);
  v.str("attention", c.attention);
  v.i64("d_model", c.d_model);
  v.i64("hidden", c.hidden);
  v.i64("layers", c.layers);
  v.i64("heads", c.heads);
  v.i64("ffn", c.ffn);
  v.f64("dropout", c.dropout);
  v.flag("post_ln", c.post_ln);
  v.flag("scale_embeddings", c.scale_embeddings);
  v.flag("reverse_source", c.reverse_source);
  v.i64("max_positions", c.max_positions);
  v.str("task", c.task);
  v.str("data", c.data);
  v.str("test_data", c.test_data);
  v.f64("test_fraction", c.test_fraction);
  v.str("tokenizer", c.tokenizer);
  v.i64("train_size", c.train_size);
  v.i64("test_size", c.test_size);
  v.i64("min_len", c.min_len);
  v.i64("max_len", c.max_len);
  v.str("alphabet", c.alphabet);
  v.str("data_hash", c.data_hash);
  v.i64("max_tokens", c.max_tokens);
  v.i64("max_decode_len", c.max_decode_len);
  v.str("optimizer", c.optimizer);
  v.f64("lr", c.lr);
  v.f64("weight_decay", c.weight_decay);
  v.f64("momentum", c.momentum);
  v.f64("clip", c.clip);
  v.str("schedule", c.schedule);
  v.i64("warmup", c.warmup);
  v.f64("label_smoothing", c.label_smoothing);
  v.i64("batch_size", c.batch_size);
  v.str("precision", c.precision);
  v.i64("steps", c.steps);
  v.u64("seed", c.seed);
  v.i64("eval_every", c.eval_every);
  v.i64("eval_size", c.eval_size);
  v.i64("checkpoint_every", c.checkpoint_every);
  v.i64("log_every", c.log_every);
  v.i64("keep_checkpoints", c.keep_checkpoints);
  v.f64("early_stop", c.early_stop);
  v.i64("ranks", c.ranks);
  v.i64("context_parallel", c.context_parallel);
}

}  // namespace

void RunConfig::resolve_and_check() {
  QKV_CHECK_ARG(one_of(model, {"rnn", "rnn-attn", "transformer", "decoder", "llama"}), "[train] --model '", model,
                "' is not one of rnn, rnn-attn, transformer, decoder, llama");
  const bool rnn = model == "rnn" || model == "rnn-attn";
  if (d_model == 0) d_model = 64;
  if (hidden == 0) hidden = 128;
  if (layers == 0) layers = rnn ? 1 : 2;
  if (ffn == 0 && d_model >= 1 && d_model <= (int64_t{1} << 24)) ffn = 4 * d_model;
  if (checkpoint_every == 0) checkpoint_every = eval_every;
  QKV_CHECK_ARG(one_of(cell, {"gru", "lstm"}), "[train] --cell '", cell, "' is not gru or lstm");
  QKV_CHECK_ARG(one_of(attention, {"bahdanau", "luong-dot", "luong-general"}), "[train] --attention '", attention,
                "' is not bahdanau, luong-dot or luong-general");
  // 0 means "the default of the kind" (filled above); anything else below 1 is refused by name.
  constexpr int64_t kMaxSize = int64_t{1} << 24;  // far above any model this CLI trains; keeps 4 * d_model exact
  for (const auto& [flag, v] : {std::pair<const char*, int64_t>{"--d-model", d_model}, {"--hidden", hidden},
                                {"--layers", layers}, {"--heads", heads}, {"--ffn", ffn}})
    QKV_CHECK_ARG(v >= 1 && v <= kMaxSize, "[train] ", flag, " must be in [1, ", kMaxSize, "], got ", v);
  QKV_CHECK_ARG(rnn || d_model % heads == 0, "[train] --d-model ", d_model, " must be divisible by --heads ", heads);
  QKV_CHECK_ARG(dropout >= 0.0 && dropout < 1.0, "[train] --dropout must be in [0, 1), got ", dropout);
  QKV_CHECK_ARG(!reverse_source || model == "rnn", "[train] --reverse-source applies to --model rnn only");
  QKV_CHECK_ARG(max_positions >= 0, "[train] --max-positions must be >= 0");
  QKV_CHECK_ARG(task.empty() != data.empty(), "[train] give exactly one of --task NAME and --data FILE.tsv");
  QKV_CHECK_ARG(test_fraction >= 0.0 && test_fraction < 1.0, "[train] --test-fraction must be in [0, 1)");
  QKV_CHECK_ARG(one_of(tokenizer, {"char", "word", "byte"}), "[train] --tokenizer '", tokenizer,
                "' is not char, word or byte");
  QKV_CHECK_ARG(min_len >= 1 && max_len >= min_len, "[train] --min-len must be >= 1 and --max-len >= --min-len, got ",
                min_len, " and ", max_len);
  QKV_CHECK_ARG(train_size >= 1 && test_size >= 0, "[train] --train-size must be >= 1 and --test-size >= 0");
  QKV_CHECK_ARG(max_tokens >= 1, "[train] --max-tokens must be >= 1, got ", max_tokens);
  QKV_CHECK_ARG(max_decode_len >= 0, "[train] --max-decode-len must be >= 0");
  QKV_CHECK_ARG(one_of(optimizer, {"adam", "adamw", "sgd"}), "[train] --optimizer '", optimizer,
                "' is not adam, adamw or sgd");
  QKV_CHECK_ARG(lr > 0.0 && std::isfinite(lr), "[train] --lr must be > 0, got ", lr);
  QKV_CHECK_ARG(weight_decay >= 0.0 && momentum >= 0.0 && clip >= 0.0, "[train] --weight-decay, --momentum and ",
                "--clip must be >= 0");
  QKV_CHECK_ARG(one_of(schedule, {"constant", "inverse_sqrt", "cosine"}), "[train] --schedule '", schedule,
                "' is not constant, inverse_sqrt or cosine");
  QKV_CHECK_ARG(warmup >= 0 && (schedule != "inverse_sqrt" || warmup >= 1),
                "[train] --warmup must be >= 0 (>= 1 for inverse_sqrt)");
  QKV_CHECK_ARG(label_smoothing >= 0.0 && label_smoothing <= 1.0, "[train] --label-smoothing must be in [0, 1]");
  QKV_CHECK_ARG(batch_size >= 1, "[train] --batch-size must be >= 1");
  QKV_CHECK_ARG(one_of(precision, {"fp32", "bf16"}), "[train] --precision '", precision,
                "' is not fp32 or bf16 (int8 is for inference)");
  QKV_CHECK_ARG(steps >= 1, "[train] --steps must be >= 1, got ", steps);
  QKV_CHECK_ARG(eval_every >= 1 && eval_size >= 0 && checkpoint_every >= 1 && log_every >= 1,
                "[train] --eval-every, --checkpoint-every and --log-every must be >= 1, --eval-size >= 0");
  QKV_CHECK_ARG(keep_checkpoints >= 1, "[train] --keep-checkpoints must be >= 1");
  QKV_CHECK_ARG(early_stop >= 0.0 && early_stop <= 1.0, "[train] --early-stop must be in [0, 1] (0 = off)");
  QKV_CHECK_ARG(ranks >= 1 && context_parallel >= 1, "[train] --context-parallel must be >= 1, got ",
                context_parallel);
  QKV_CHECK_ARG(context_parallel == 1 || model == "decoder" || model == "llama", "[train] --context-parallel ",
                context_parallel, " runs --model decoder or llama only (their attention goes around the ring), not '",
                model, "'");
  QKV_CHECK_ARG(context_parallel == 1 || dropout == 0.0, "[train] --context-parallel ", context_parallel,
                " with --dropout ", dropout,
                ": ring attention has no dropout on the attention weights; use --dropout 0");
}

std::string format_double(double v) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back as v
  return ec == std::errc() ? std::string(buf, end) : std::string("nan");
}

std::string RunConfig::to_json() const {
  RunConfig c = *this;
  std::string out = "{\n  \"format\": \"qkv-train-config 1\"";
  auto key = [&](const char* k) {
    out += ",\n  ";
    json::append_quoted(out, k);
    out += ": ";
  };
  FieldVisitor v;
  v.str = [&](const char* k, std::string& x) { key(k); json::append_quoted(out, x); };
  v.i64 = [&](const char* k, int64_t& x) { key(k); out += std::to_string(x); };
  v.u64 = [&](const char* k, uint64_t& x) { key(k); out += std::to_string(x); };
  v.f64 = [&](const char* k, double& x) { key(k); out += format_double(x); };
  v.flag = [&](const char* k, bool& x) { key(k); out += x ? "true" : "false"; };
  visit(c, v);
  out += "\n}\n";
  return out;
}

std::map<std::string, std::string> parse_flat_json(const std::string& text, const std::string& name) {
  json::Reader r(text, "[config] " + name);
  std::map<std::string, std::string> out;
  std::string key;
  r.begin_object();
  while (r.next_key(key)) {
    const size_t at = r.pos();
    std::string value;
    switch (r.peek_kind()) {
      case json::Kind::String: value = r.read_string(); break;
      case json::Kind::Number: value = r.read_number_text(); break;
      case json::Kind::True:
      case json::Kind::False: value = r.read_literal(); break;
      default:
        r.fail(detail::concat("the value of '", key, "' must be a string, number or boolean, not ",
                              json::kind_name(r.peek_kind())));
    }
    if (!out.emplace(key, std::move(value)).second) r.fail_at(at, "duplicate key '" + key + "'");
  }
  r.expect_end();
  return out;
}

RunConfig RunConfig::from_json(const std::string& text, const std::string& name) {
  return from_settings(parse_flat_json(text, name), name);
}

RunConfig RunConfig::with(const std::map<std::string, std::string>& settings, const std::string& name) const {
  std::map<std::string, std::string> kv = parse_flat_json(to_json(), name);
  for (const auto& [key, value] : settings) {
    const auto it = kv.find(key);
    QKV_CHECK_ARG(it != kv.end() && key != "format" && key != "data_hash" && key != "ranks", "[config] ", name,
                  ": unknown setting '", key, "'");
    it->second = value;
  }
  return from_settings(std::move(kv), name);
}

RunConfig RunConfig::resumed_with(const std::map<std::string, std::string>& settings,
                                  const std::string& run_dir) const {
  // What a resumed run may change: how long and how often (run lengths, evaluation, checkpoints), and its data
  // (when the vocabulary stays the same, which the run checks); --task or --data replaces the source.
  static const char* const kChangeable[] = {
      "steps", "eval_every", "eval_size", "checkpoint_every", "log_every", "early_stop", "keep_checkpoints",
      "task", "data", "test_data", "test_fraction", "tokenizer", "max_tokens", "train_size", "test_size",
      "min_len", "max_len", "alphabet"};
  const RunConfig given = with(settings, run_dir + "/config.json");
  const std::map<std::string, std::string> mine = parse_flat_json(to_json(), "config.json");
  const std::map<std::string, std::string> theirs = parse_flat_json(given.to_json(), "config.json");
  std::map<std::string, std::string> keep;
  for (const auto& setting : settings) {
    const std::string& key = setting.first;  // a plain reference: clang-14 cannot capture a structured binding
    const bool changeable = std::find_if(std::begin(kChangeable), std::end(kChangeable), [&](const char* k) {
                              return key == k;
                            }) != std::end(kChangeable);
    const std::string& now = theirs.at(key);
    if (changeable) {
      keep[key] = now;
      continue;
    }
    QKV_CHECK_ARG(now == mine.at(key), "[train] ", key, " ", now, " differs from the run's ", mine.at(key), " in '",
                  run_dir, "/config.json'; a resumed run keeps its settings");
  }
  if (keep.count("task") != 0) {
    keep["data"] = "";
    keep["test_data"] = "";
  } else if (keep.count("data") != 0) {
    keep["task"] = "";
  }
  return with(keep, run_dir + "/config.json");
}

RunConfig RunConfig::from_settings(std::map<std::string, std::string> kv, const std::string& name) {
  auto fmt = kv.find("format");
  QKV_CHECK_ARG(fmt != kv.end() && fmt->second == "qkv-train-config 1", "[config] ", name,
                ": not a qkv train config (format 'qkv-train-config 1' expected)");
  kv.erase(fmt);
  RunConfig c;
  kv.emplace("max_tokens", std::to_string(c.max_tokens));  // configs written before --max-tokens existed
  kv.emplace("ranks", "1");                                // ... and before the parallel layout was recorded
  kv.emplace("context_parallel", "1");
  kv.emplace("precision", "fp32");  // ... and before --precision
  auto take = [&](const char* k) {
    auto it = kv.find(k);
    QKV_CHECK_ARG(it != kv.end(), "[config] ", name, ": missing key '", k, "'");
    std::string v = it->second;
    kv.erase(it);
    return v;
  };
  auto bad = [&](const char* k, const std::string& v) {
    return std::invalid_argument("[config] " + name + ": bad value '" + v + "' for '" + k + "'");
  };
  FieldVisitor v;
  v.str = [&](const char* k, std::string& x) { x = take(k); };
  v.i64 = [&](const char* k, int64_t& x) {
    const std::string s = take(k);
    try {
      size_t n = 0;
      x = std::stoll(s, &n);
      if (n != s.size()) throw bad(k, s);
    } catch (const std::logic_error&) {
      throw bad(k, s);
    }
  };
  v.u64 = [&](const char* k, uint64_t& x) {
    const std::string s = take(k);
    try {
      size_t n = 0;
      x = std::stoull(s, &n);
      if (n != s.size() || s[0] == '-') throw bad(k, s);
    } catch (const std::logic_error&) {
      throw bad(k, s);
    }
  };
  v.f64 = [&](const char* k, double& x) {
    const std::string s = take(k);
    try {
      size_t n = 0;
      x = std::stod(s, &n);
      if (n != s.size()) throw bad(k, s);
    } catch (const std::logic_error&) {
      throw bad(k, s);
    }
  };
  v.flag = [&](const char* k, bool& x) {
    const std::string s = take(k);
    if (s != "true" && s != "false") throw bad(k, s);
    x = s == "true";
  };
  visit(c, v);
  QKV_CHECK_ARG(kv.empty(), "[config] ", name, ": unknown key '", kv.begin()->first, "'");
  return c;
}

RunConfig load_run_config(const std::string& run_dir, const char* op) {
  const std::string path = (std::filesystem::path(run_dir) / "config.json").string();
  QKV_CHECK_ARG(std::filesystem::exists(path), "[", op, "] '", run_dir, "' is not a training run (no config.json)");
  RunConfig c = RunConfig::from_json(read_file_text(path, op), path);
  c.resolve_and_check();
  return c;
}

}  // namespace qkv::train
