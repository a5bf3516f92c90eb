// Built-in seq2seq tasks generated from a seed, each with a disjoint train/test split: copy, reverse and sort of
// digit or letter strings, multi-digit addition, date normalisation to ISO 8601, and numbers to English / Chinese words.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qkv/data/tokenizer.h"
#include "qkv/data/tsv.h"

namespace qkv::data {

struct TaskOptions {
  int64_t train_size = 10000;  // >= 1
  int64_t test_size = 1000;    // >= 0
  // copy / reverse / sort: sequence length; addition: digits of each operand; num2words-*: digits of the number.
  // Ignored by dates (years 1900..2099).
  int64_t min_len = 1;
  int64_t max_len = 10;
  std::string alphabet = "digits";  // copy / reverse / sort: "digits" (0-9) or "letters" (a-z)
  uint64_t seed = 0;
};

struct Task {
  std::string name;
  TokenizerKind tokenizer = TokenizerKind::kChar;  // every built-in task is character-level
  std::vector<TextPair> train;
  std::vector<TextPair> test;  // disjoint from train: no source and no underlying item (date, number) in both
};

// Names: "copy", "reverse", "sort", "addition", "dates", "num2words-en", "num2words-zh".
const std::vector<std::string>& task_names();
// One line per task saying what it maps, e.g. "copy: 4821 -> 4821".
std::string task_help();

// Draws train_size + test_size distinct items from Rng(seed) and splits them in order (train first).
// Throws invalid_argument "[task NAME] ..." for an unknown name, bad options, or a space too small to hold that
// many distinct items (e.g. copy of 1 digit has 10).
Task make_task(const std::string& name, const TaskOptions& options);

// --- the deterministic maps behind the tasks (exposed for tests and tools) ------------------------------------
// American English without "and": 1234 -> "one thousand two hundred thirty-four", 0 -> "zero". 0 <= n < 10^12.
std::string number_to_english(int64_t n);
// Chinese numerals with 二 (never 两) and the 零 rules: 1004 -> 一千零四, 10 -> 十, 100000 -> 十万, 10010 -> 一万零一十,
// 100000000 -> 一亿, 100001000 -> 一亿零一千. A leading 一十 becomes 十 (also before 万/亿: 十万, 十亿). 0 <= n < 10^12.
std::string number_to_chinese(int64_t n);

struct Date {
  int year = 2000;  // 1 .. 9999
  int month = 1;    // 1 .. 12
  int day = 1;      // 1 .. days_in_month
};
int days_in_month(int year, int month);  // Gregorian
int weekday(const Date& d);              // 0 = Monday .. 6 = Sunday
std::string iso_date(const Date& d);     // "2021-03-05"

// Human formats of a date. Numeric forms with slashes or dots are DAY FIRST (European): 05/03/2021 is 5 March.
enum class DateFormat {
  kMonthDayYear,         // March 5, 2021
  kMonDayYear,           // Mar 5, 2021
  kDayMonthYear,         // 5 March 2021
  kDayMonYear,           // 5 Mar 2021
  kDayOrdinalOfMonth,    // 5th of March 2021
  kMonthDayOrdinal,      // March 5th, 2021
  kWeekdayMonthDayYear,  // Friday, March 5, 2021
  kWeekdayDayMonYear,    // Fri 5 Mar 2021
  kSlashDayMonthYear,    // 05/03/2021   (DD/MM/YYYY)
  kDotDayMonthYear,      // 5.3.2021     (D.M.YYYY, German)
  kSlashYearMonthDay,    // 2021/03/05   (YYYY/MM/DD)
  kChinese,              // 2021年3月5日
  kChineseWeekday,       // 2021年3月5日星期五
};
inline constexpr int kNumDateFormats = 13;
std::string format_date(const Date& d, DateFormat format);

}  // namespace qkv::data
