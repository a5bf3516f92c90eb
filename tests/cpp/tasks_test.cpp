// Tests of the built-in tasks: hand-checked examples of every map (numbers in English and Chinese, dates),
// disjoint train/test splits, determinism from the seed, and the errors for bad options.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "ops_testing.h"
#include "qkv/data/tasks.h"

namespace qkv::data {
namespace {

using qkv::testing::ThrowsArg;

TEST(NumberToEnglish, HandCheckedExamples) {
  EXPECT_EQ(number_to_english(0), "zero");
  EXPECT_EQ(number_to_english(7), "seven");
  EXPECT_EQ(number_to_english(13), "thirteen");
  EXPECT_EQ(number_to_english(40), "forty");
  EXPECT_EQ(number_to_english(21), "twenty-one");
  EXPECT_EQ(number_to_english(100), "one hundred");
  EXPECT_EQ(number_to_english(105), "one hundred five");
  EXPECT_EQ(number_to_english(1234), "one thousand two hundred thirty-four");
  EXPECT_EQ(number_to_english(1004), "one thousand four");
  EXPECT_EQ(number_to_english(90019), "ninety thousand nineteen");
  EXPECT_EQ(number_to_english(1000000), "one million");
  EXPECT_EQ(number_to_english(100000000), "one hundred million");
  EXPECT_EQ(number_to_english(2000000301), "two billion three hundred one");
  EXPECT_EQ(number_to_english(999999999999),
            "nine hundred ninety-nine billion nine hundred ninety-nine million nine hundred ninety-nine thousand "
            "nine hundred ninety-nine");
  EXPECT_TRUE(ThrowsArg([] { number_to_english(-1); }, "[number_to_english]"));
  EXPECT_TRUE(ThrowsArg([] { number_to_english(1000000000000); }, "[number_to_english]"));
}

TEST(NumberToChinese, HandCheckedExamplesWithZeroRules) {
  EXPECT_EQ(number_to_chinese(0), "零");
  EXPECT_EQ(number_to_chinese(2), "二");
  EXPECT_EQ(number_to_chinese(10), "十");
  EXPECT_EQ(number_to_chinese(15), "十五");
  EXPECT_EQ(number_to_chinese(20), "二十");
  EXPECT_EQ(number_to_chinese(110), "一百一十");
  EXPECT_EQ(number_to_chinese(101), "一百零一");
  EXPECT_EQ(number_to_chinese(1234), "一千二百三十四");
  EXPECT_EQ(number_to_chinese(1004), "一千零四");
  EXPECT_EQ(number_to_chinese(1010), "一千零一十");
  EXPECT_EQ(number_to_chinese(1100), "一千一百");
  EXPECT_EQ(number_to_chinese(10001), "一万零一");
  EXPECT_EQ(number_to_chinese(10010), "一万零一十");
  EXPECT_EQ(number_to_chinese(11000), "一万一千");
  EXPECT_EQ(number_to_chinese(100000), "十万");
  EXPECT_EQ(number_to_chinese(150000), "十五万");
  EXPECT_EQ(number_to_chinese(1000100), "一百万零一百");
  EXPECT_EQ(number_to_chinese(20030040), "二千零三万零四十");
  EXPECT_EQ(number_to_chinese(100000000), "一亿");
  EXPECT_EQ(number_to_chinese(100000001), "一亿零一");
  EXPECT_EQ(number_to_chinese(100001000), "一亿零一千");
  EXPECT_EQ(number_to_chinese(110000000), "一亿一千万");
  EXPECT_EQ(number_to_chinese(1000000000), "十亿");
  EXPECT_TRUE(ThrowsArg([] { number_to_chinese(-5); }, "[number_to_chinese]"));
}

TEST(Dates, CalendarRules) {
  EXPECT_EQ(days_in_month(2021, 2), 28);
  EXPECT_EQ(days_in_month(2020, 2), 29);
  EXPECT_EQ(days_in_month(1900, 2), 28);
  EXPECT_EQ(days_in_month(2000, 2), 29);
  EXPECT_EQ(weekday({2021, 3, 5}), 4);   // Friday
  EXPECT_EQ(weekday({1970, 1, 1}), 3);   // Thursday
  EXPECT_EQ(weekday({1900, 1, 1}), 0);   // Monday
  EXPECT_EQ(weekday({2000, 2, 29}), 1);  // Tuesday
  EXPECT_EQ(iso_date({2021, 3, 5}), "2021-03-05");
  EXPECT_TRUE(ThrowsArg([] { iso_date({2021, 2, 29}); }, "[date] 2021-2-29 is not a valid date"));
  EXPECT_TRUE(ThrowsArg([] { days_in_month(2021, 13); }, "[date] month 13"));
}

TEST(Dates, EveryFormatOfMarchFifth2021) {
  const Date d{2021, 3, 5};
  EXPECT_EQ(format_date(d, DateFormat::kMonthDayYear), "March 5, 2021");
  EXPECT_EQ(format_date(d, DateFormat::kMonDayYear), "Mar 5, 2021");
  EXPECT_EQ(format_date(d, DateFormat::kDayMonthYear), "5 March 2021");
  EXPECT_EQ(format_date(d, DateFormat::kDayMonYear), "5 Mar 2021");
  EXPECT_EQ(format_date(d, DateFormat::kDayOrdinalOfMonth), "5th of March 2021");
  EXPECT_EQ(format_date(d, DateFormat::kMonthDayOrdinal), "March 5th, 2021");
  EXPECT_EQ(format_date(d, DateFormat::kWeekdayMonthDayYear), "Friday, March 5, 2021");
  EXPECT_EQ(format_date(d, DateFormat::kWeekdayDayMonYear), "Fri 5 Mar 2021");
  EXPECT_EQ(format_date(d, DateFormat::kSlashDayMonthYear), "05/03/2021");
  EXPECT_EQ(format_date(d, DateFormat::kDotDayMonthYear), "5.3.2021");
  EXPECT_EQ(format_date(d, DateFormat::kSlashYearMonthDay), "2021/03/05");
  EXPECT_EQ(format_date(d, DateFormat::kChinese), "2021年3月5日");
  EXPECT_EQ(format_date(d, DateFormat::kChineseWeekday), "2021年3月5日星期五");
  EXPECT_TRUE(ThrowsArg([&] { format_date(d, static_cast<DateFormat>(99)); }, "[format_date] unknown format"));
}

TEST(Dates, OrdinalSuffixesIncludingTeens) {
  EXPECT_EQ(format_date({2021, 1, 1}, DateFormat::kMonthDayOrdinal), "January 1st, 2021");
  EXPECT_EQ(format_date({2021, 1, 2}, DateFormat::kMonthDayOrdinal), "January 2nd, 2021");
  EXPECT_EQ(format_date({2021, 1, 3}, DateFormat::kMonthDayOrdinal), "January 3rd, 2021");
  EXPECT_EQ(format_date({2021, 1, 11}, DateFormat::kMonthDayOrdinal), "January 11th, 2021");
  EXPECT_EQ(format_date({2021, 1, 12}, DateFormat::kMonthDayOrdinal), "January 12th, 2021");
  EXPECT_EQ(format_date({2021, 1, 22}, DateFormat::kMonthDayOrdinal), "January 22nd, 2021");
  EXPECT_EQ(format_date({2021, 1, 31}, DateFormat::kDayOrdinalOfMonth), "31st of January 2021");
}

TaskOptions small(uint64_t seed = 1) {
  TaskOptions o;
  o.train_size = 300;
  o.test_size = 100;
  o.min_len = 3;
  o.max_len = 6;
  o.seed = seed;
  return o;
}

TEST(Tasks, EveryTaskMapsItsSourceCorrectly) {
  for (const std::string& name : task_names()) {
    const Task t = make_task(name, small());
    ASSERT_EQ(t.train.size(), 300u) << name;
    ASSERT_EQ(t.test.size(), 100u) << name;
    for (const TextPair& p : t.train) {
      if (name == "copy") {
        EXPECT_EQ(p.src, p.tgt);
      } else if (name == "reverse") {
        EXPECT_EQ(std::string(p.src.rbegin(), p.src.rend()), p.tgt);
      } else if (name == "sort") {
        std::string s = p.src;
        std::sort(s.begin(), s.end());
        EXPECT_EQ(s, p.tgt);
      } else if (name == "addition") {
        const size_t plus = p.src.find('+');
        ASSERT_NE(plus, std::string::npos);
        EXPECT_EQ(std::stoll(p.src.substr(0, plus)) + std::stoll(p.src.substr(plus + 1)), std::stoll(p.tgt));
      } else if (name == "num2words-en") {
        EXPECT_EQ(number_to_english(std::stoll(p.src)), p.tgt);
      } else if (name == "num2words-zh") {
        EXPECT_EQ(number_to_chinese(std::stoll(p.src)), p.tgt);
      } else if (name == "dates") {
        ASSERT_EQ(p.tgt.size(), 10u);
        const Date d{std::stoi(p.tgt.substr(0, 4)), std::stoi(p.tgt.substr(5, 2)), std::stoi(p.tgt.substr(8, 2))};
        bool some_format = false;
        for (int f = 0; f < kNumDateFormats; ++f) some_format |= format_date(d, static_cast<DateFormat>(f)) == p.src;
        EXPECT_TRUE(some_format) << p.src << " -> " << p.tgt;
      }
    }
  }
}

TEST(Tasks, LengthRangeIsRespected) {
  TaskOptions o = small();
  o.alphabet = "letters";
  const Task t = make_task("reverse", o);
  for (const TextPair& p : t.train) {
    EXPECT_GE(p.src.size(), 3u);
    EXPECT_LE(p.src.size(), 6u);
    for (char c : p.src) EXPECT_TRUE(c >= 'a' && c <= 'z');
  }
  const Task a = make_task("addition", o);
  for (const TextPair& p : a.train) {
    const size_t plus = p.src.find('+');
    EXPECT_GE(plus, 3u);
    EXPECT_LE(plus, 6u);
    EXPECT_NE(p.src[0], '0');
  }
}

TEST(Tasks, TrainAndTestAreDisjoint) {
  for (const std::string& name : task_names()) {
    const Task t = make_task(name, small(5));
    std::set<std::string> train_src, train_tgt;
    for (const auto& p : t.train) {
      train_src.insert(p.src);
      train_tgt.insert(p.tgt);
    }
    EXPECT_EQ(train_src.size(), t.train.size()) << name << ": duplicate sources in train";
    for (const auto& p : t.test) {
      EXPECT_EQ(train_src.count(p.src), 0u) << name << ": test source in train: " << p.src;
      if (name == "dates" || name.rfind("num2words", 0) == 0)  // the underlying item never repeats either
        EXPECT_EQ(train_tgt.count(p.tgt), 0u) << name << ": test item in train: " << p.tgt;
    }
  }
}

TEST(Tasks, SameSeedSameDataDifferentSeedDifferentData) {
  for (const std::string& name : task_names()) {
    const Task a = make_task(name, small(11)), b = make_task(name, small(11)), c = make_task(name, small(12));
    EXPECT_EQ(a.train, b.train) << name;
    EXPECT_EQ(a.test, b.test) << name;
    EXPECT_NE(a.train, c.train) << name;
  }
}

TEST(Tasks, DatesUseManyFormats) {
  TaskOptions o = small();
  o.train_size = 2000;
  const Task t = make_task("dates", o);
  std::set<int> used;
  for (const auto& p : t.train) {
    const Date d{std::stoi(p.tgt.substr(0, 4)), std::stoi(p.tgt.substr(5, 2)), std::stoi(p.tgt.substr(8, 2))};
    for (int f = 0; f < kNumDateFormats; ++f)
      if (format_date(d, static_cast<DateFormat>(f)) == p.src) used.insert(f);
  }
  EXPECT_EQ(static_cast<int>(used.size()), kNumDateFormats);
}

TEST(Tasks, SpaceTooSmallIsAClearError) {
  TaskOptions o;
  o.min_len = o.max_len = 1;
  o.train_size = 8;
  o.test_size = 3;  // only 10 one-digit strings exist
  EXPECT_TRUE(ThrowsArg([&] { make_task("copy", o); }, "[task copy] found only 10 distinct examples"));
  o.test_size = 2;
  EXPECT_EQ(make_task("copy", o).train.size(), 8u);
}

TEST(Tasks, BadOptionsNameTheTask) {
  TaskOptions o;
  EXPECT_TRUE(ThrowsArg([&] { make_task("translate", o); }, "[task] unknown task 'translate'"));
  o.alphabet = "hex";
  EXPECT_TRUE(ThrowsArg([&] { make_task("sort", o); }, "[task sort] alphabet"));
  o = TaskOptions{};
  o.min_len = 5;
  o.max_len = 4;
  EXPECT_TRUE(ThrowsArg([&] { make_task("copy", o); }, "[task copy] lengths"));
  EXPECT_TRUE(ThrowsArg([&] { make_task("addition", o); }, "[task addition] operand digits"));
  o.min_len = 10;
  o.max_len = 12;
  EXPECT_TRUE(ThrowsArg([&] { make_task("num2words-en", o); }, "[task num2words-en] numbers have at most 9"));
  o = TaskOptions{};
  o.train_size = 0;
  EXPECT_TRUE(ThrowsArg([&] { make_task("dates", o); }, "[task dates] train_size"));
  EXPECT_NE(task_help().find("一千二百三十四"), std::string::npos);
}

}  // namespace
}  // namespace qkv::data
