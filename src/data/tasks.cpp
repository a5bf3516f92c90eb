// Built-in tasks: each draws distinct items (keyed so that train and test never share one) from Rng(seed) and
// splits them in draw order.
#include "qkv/data/tasks.h"

#include <algorithm>
#include <functional>
#include <unordered_set>

#include "qkv/core/error.h"
#include "qkv/core/rng.h"

namespace qkv::data {
namespace {

struct Item {
  std::string key;  // what must not repeat across the split
  TextPair pair;
};
using Draw = std::function<Item(Rng&)>;

int64_t uniform_int(Rng& rng, int64_t lo, int64_t hi) {  // [lo, hi]
  return lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(hi - lo + 1)));
}

// A number with exactly `digits` digits (0..9 for one digit).
int64_t number_with_digits(Rng& rng, int64_t digits) {
  if (digits == 1) return uniform_int(rng, 0, 9);
  int64_t lo = 1;
  for (int64_t i = 1; i < digits; ++i) lo *= 10;
  return uniform_int(rng, lo, lo * 10 - 1);
}

Draw sequence_task(const std::string& name, const TaskOptions& o) {
  QKV_CHECK_ARG(o.alphabet == "digits" || o.alphabet == "letters", "[task ", name, "] alphabet must be 'digits' or ",
                "'letters', got '", o.alphabet, "'");
  QKV_CHECK_ARG(o.min_len >= 1 && o.min_len <= o.max_len && o.max_len <= 1000, "[task ", name, "] lengths [",
                o.min_len, ", ", o.max_len, "] must satisfy 1 <= min_len <= max_len <= 1000");
  const std::string chars = o.alphabet == "digits" ? "0123456789" : "abcdefghijklmnopqrstuvwxyz";
  const int64_t lo = o.min_len, hi = o.max_len;
  return [=](Rng& rng) {
    const int64_t n = uniform_int(rng, lo, hi);
    std::string s;
    for (int64_t i = 0; i < n; ++i) s += chars[rng.below(chars.size())];
    std::string t = s;
    if (name == "reverse") std::reverse(t.begin(), t.end());
    if (name == "sort") std::sort(t.begin(), t.end());
    return Item{s, {s, t}};
  };
}

Draw addition_task(const TaskOptions& o) {
  QKV_CHECK_ARG(o.min_len >= 1 && o.min_len <= o.max_len && o.max_len <= 17, "[task addition] operand digits [",
                o.min_len, ", ", o.max_len, "] must satisfy 1 <= min_len <= max_len <= 17");
  const int64_t lo = o.min_len, hi = o.max_len;
  return [=](Rng& rng) {
    const int64_t a = number_with_digits(rng, uniform_int(rng, lo, hi));
    const int64_t b = number_with_digits(rng, uniform_int(rng, lo, hi));
    const std::string s = std::to_string(a) + "+" + std::to_string(b);
    return Item{s, {s, std::to_string(a + b)}};
  };
}

Draw dates_task() {
  return [](Rng& rng) {
    Date d;
    d.year = static_cast<int>(uniform_int(rng, 1900, 2099));
    d.month = static_cast<int>(uniform_int(rng, 1, 12));
    d.day = static_cast<int>(uniform_int(rng, 1, days_in_month(d.year, d.month)));
    const auto f = static_cast<DateFormat>(rng.below(kNumDateFormats));
    const std::string iso = iso_date(d);
    return Item{iso, {format_date(d, f), iso}};  // one format per date: a test date is never seen in training
  };
}

Draw number_task(const std::string& name, const TaskOptions& o) {
  QKV_CHECK_ARG(o.min_len >= 1 && o.min_len <= o.max_len, "[task ", name, "] digits [", o.min_len, ", ", o.max_len,
                "] must satisfy 1 <= min_len <= max_len");
  const int64_t lo = o.min_len, hi = std::min<int64_t>(o.max_len, 9);
  QKV_CHECK_ARG(lo <= hi, "[task ", name, "] numbers have at most 9 digits, got min_len ", lo);
  const bool zh = name == "num2words-zh";
  return [=](Rng& rng) {
    const int64_t n = number_with_digits(rng, uniform_int(rng, lo, hi));
    const std::string s = std::to_string(n);
    return Item{s, {s, zh ? number_to_chinese(n) : number_to_english(n)}};
  };
}

}  // namespace

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names = {"copy",  "reverse",      "sort",        "addition",
                                                 "dates", "num2words-en", "num2words-zh"};
  return names;
}

std::string task_help() {
  return "copy: 4821 -> 4821\n"
         "reverse: 4821 -> 1284\n"
         "sort: 4821 -> 1248\n"
         "addition: 123+45 -> 168\n"
         "dates: March 5, 2021 | 05/03/2021 (day first) | 2021年3月5日 | ... -> 2021-03-05\n"
         "num2words-en: 1234 -> one thousand two hundred thirty-four\n"
         "num2words-zh: 1234 -> 一千二百三十四\n";
}

Task make_task(const std::string& name, const TaskOptions& o) {
  Draw draw;
  if (name == "copy" || name == "reverse" || name == "sort") draw = sequence_task(name, o);
  else if (name == "addition") draw = addition_task(o);
  else if (name == "dates") draw = dates_task();
  else if (name == "num2words-en" || name == "num2words-zh") draw = number_task(name, o);
  else {
    std::string all;
    for (const auto& n : task_names()) all += (all.empty() ? "" : ", ") + n;
    throw std::invalid_argument("[task] unknown task '" + name + "' (choose " + all + ")");
  }
  QKV_CHECK_ARG(o.train_size >= 1 && o.test_size >= 0, "[task ", name, "] train_size ", o.train_size,
                " must be >= 1 and test_size ", o.test_size, " >= 0");
  const int64_t want = o.train_size + o.test_size;
  QKV_CHECK_ARG(want <= 100000000, "[task ", name, "] ", want, " examples is too many (at most 10^8)");
  Rng rng(o.seed);
  std::unordered_set<std::string> seen;
  Task task;
  task.name = name;
  task.train.reserve(static_cast<size_t>(o.train_size));
  task.test.reserve(static_cast<size_t>(o.test_size));
  const int64_t max_draws = 30 * want + 1000;
  int64_t draws = 0;
  while (static_cast<int64_t>(seen.size()) < want) {
    QKV_CHECK_ARG(draws < max_draws, "[task ", name, "] found only ", seen.size(), " distinct examples in ", draws,
                  " draws but ", want, " (train ", o.train_size, " + test ", o.test_size,
                  ") were asked for: widen the length range or ask for fewer");
    ++draws;
    Item it = draw(rng);
    if (!seen.insert(it.key).second) continue;
    if (static_cast<int64_t>(task.train.size()) < o.train_size) task.train.push_back(std::move(it.pair));
    else task.test.push_back(std::move(it.pair));
  }
  return task;
}

}  // namespace qkv::data
