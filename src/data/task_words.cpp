// The deterministic maps behind the text tasks: numbers to English and Chinese words, calendar arithmetic and
// human-readable date formats.
#include <cstdio>
#include <string>

#include "qkv/core/error.h"
#include "qkv/data/tasks.h"

namespace qkv::data {
namespace {

constexpr int64_t kNumberLimit = 1000000000000LL;  // 10^12

const char* const kOnes[20] = {"zero",    "one",     "two",       "three",    "four",     "five",    "six",
                               "seven",   "eight",   "nine",      "ten",      "eleven",   "twelve",  "thirteen",
                               "fourteen", "fifteen", "sixteen",  "seventeen", "eighteen", "nineteen"};
const char* const kTens[10] = {"", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"};

std::string english_below_1000(int64_t n) {
  std::string out;
  const int64_t h = n / 100, r = n % 100;
  if (h > 0) out = std::string(kOnes[h]) + " hundred";
  if (r > 0) {
    if (!out.empty()) out += ' ';
    if (r < 20) {
      out += kOnes[r];
    } else {
      out += kTens[r / 10];
      if (r % 10) out += std::string("-") + kOnes[r % 10];
    }
  }
  return out;
}

const char* const kZhDigits[10] = {"零", "一", "二", "三", "四", "五", "六", "七", "八", "九"};
const char* const kZhUnits[4] = {"", "十", "百", "千"};

// A 4-digit section (1..9999) with inner 零s; `leading` drops the 一 of a leading 一十.
std::string chinese_section(int64_t s, bool leading) {
  std::string out;
  bool any = false, zero = false;
  for (int pos = 3; pos >= 0; --pos) {
    int64_t p10 = 1;
    for (int i = 0; i < pos; ++i) p10 *= 10;
    const int64_t d = (s / p10) % 10;
    if (d == 0) {
      if (any) zero = true;
      continue;
    }
    if (zero) out += kZhDigits[0];
    zero = false;
    if (!(leading && !any && pos == 1 && d == 1)) out += kZhDigits[d];
    out += kZhUnits[pos];
    any = true;
  }
  return out;
}

const char* const kMonths[12] = {"January", "February", "March",     "April",   "May",      "June",
                                 "July",    "August",   "September", "October", "November", "December"};
const char* const kWeekdays[7] = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"};
const char* const kZhWeekdays[7] = {"一", "二", "三", "四", "五", "六", "日"};

std::string ordinal(int d) {
  const char* suffix = "th";
  if (d % 100 < 11 || d % 100 > 13) {
    if (d % 10 == 1) suffix = "st";
    else if (d % 10 == 2) suffix = "nd";
    else if (d % 10 == 3) suffix = "rd";
  }
  return std::to_string(d) + suffix;
}

std::string two(int v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%02d", v);
  return buf;
}

void check_date(const Date& d) {
  QKV_CHECK_ARG(d.year >= 1 && d.year <= 9999 && d.month >= 1 && d.month <= 12 && d.day >= 1 &&
                    d.day <= days_in_month(d.year, d.month),
                "[date] ", d.year, "-", d.month, "-", d.day, " is not a valid date in years 1..9999");
}

}  // namespace

std::string number_to_english(int64_t n) {
  QKV_CHECK_ARG(n >= 0 && n < kNumberLimit, "[number_to_english] ", n, " is outside [0, 10^12)");
  if (n == 0) return "zero";
  static const char* const kScales[4] = {"billion", "million", "thousand", ""};
  static const int64_t kScaleValues[4] = {1000000000LL, 1000000LL, 1000LL, 1LL};
  std::string out;
  for (int i = 0; i < 4; ++i) {
    const int64_t g = (n / kScaleValues[i]) % 1000;
    if (g == 0) continue;
    if (!out.empty()) out += ' ';
    out += english_below_1000(g);
    if (kScales[i][0]) out += std::string(" ") + kScales[i];
  }
  return out;
}

std::string number_to_chinese(int64_t n) {
  QKV_CHECK_ARG(n >= 0 && n < kNumberLimit, "[number_to_chinese] ", n, " is outside [0, 10^12)");
  if (n == 0) return kZhDigits[0];
  const int64_t sections[3] = {n / 100000000LL, (n / 10000) % 10000, n % 10000};
  const char* const units[3] = {"亿", "万", ""};
  std::string out;
  bool started = false, gap = false;
  for (int i = 0; i < 3; ++i) {
    const int64_t s = sections[i];
    if (s == 0) {
      if (started) gap = true;
      continue;
    }
    if (started && (gap || s < 1000)) out += kZhDigits[0];
    out += chinese_section(s, !started);
    out += units[i];
    started = true;
    gap = false;
  }
  return out;
}

int days_in_month(int year, int month) {
  QKV_CHECK_ARG(month >= 1 && month <= 12, "[date] month ", month, " is outside 1..12");
  static const int kDays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  return month == 2 && leap ? 29 : kDays[month - 1];
}

int weekday(const Date& d) {
  check_date(d);
  // Days since 1970-01-01 (a Thursday) by Howard Hinnant's days_from_civil.
  const int y = d.year - (d.month <= 2 ? 1 : 0);
  const int era = (y >= 0 ? y : y - 399) / 400;
  const int yoe = y - era * 400;
  const int mp = (d.month + 9) % 12;
  const int doy = (153 * mp + 2) / 5 + d.day - 1;
  const int doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  const int64_t days = static_cast<int64_t>(era) * 146097 + doe - 719468;
  const int64_t w = (days % 7 + 7 + 3) % 7;  // 1970-01-01 -> 3 (Thursday)
  return static_cast<int>(w);
}

std::string iso_date(const Date& d) {
  check_date(d);
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02d", d.year, d.month, d.day);
  return buf;
}

std::string format_date(const Date& d, DateFormat f) {
  check_date(d);
  const std::string month = kMonths[d.month - 1];
  const std::string mon = month.substr(0, 3);
  const std::string day = std::to_string(d.day);
  const std::string year = std::to_string(d.year);
  const int wd = weekday(d);
  switch (f) {
    case DateFormat::kMonthDayYear: return month + " " + day + ", " + year;
    case DateFormat::kMonDayYear: return mon + " " + day + ", " + year;
    case DateFormat::kDayMonthYear: return day + " " + month + " " + year;
    case DateFormat::kDayMonYear: return day + " " + mon + " " + year;
    case DateFormat::kDayOrdinalOfMonth: return ordinal(d.day) + " of " + month + " " + year;
    case DateFormat::kMonthDayOrdinal: return month + " " + ordinal(d.day) + ", " + year;
    case DateFormat::kWeekdayMonthDayYear:
      return std::string(kWeekdays[wd]) + ", " + month + " " + day + ", " + year;
    case DateFormat::kWeekdayDayMonYear:
      return std::string(kWeekdays[wd]).substr(0, 3) + " " + day + " " + mon + " " + year;
    case DateFormat::kSlashDayMonthYear: return two(d.day) + "/" + two(d.month) + "/" + year;
    case DateFormat::kDotDayMonthYear: return day + "." + std::to_string(d.month) + "." + year;
    case DateFormat::kSlashYearMonthDay: return year + "/" + two(d.month) + "/" + two(d.day);
    case DateFormat::kChinese: return year + "年" + std::to_string(d.month) + "月" + day + "日";
    case DateFormat::kChineseWeekday:
      return year + "年" + std::to_string(d.month) + "月" + day + "日星期" + kZhWeekdays[wd];
  }
  throw std::invalid_argument(detail::concat("[format_date] unknown format ", static_cast<int>(f)));
}

}  // namespace qkv::data
