// A small JSON value for writing experiment results: null, bool, number, string, array and ordered object, with a
// deterministic pretty printer. Writing only; non-finite numbers are written as null (JSON has no NaN).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace qkv::experiments {

class Json {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  Json() = default;  // null
  Json(bool b) : type_(Type::kBool), bool_(b) {}                     // NOLINT
  Json(double v) : type_(Type::kNumber), num_(v) {}                  // NOLINT
  Json(float v) : Json(static_cast<double>(v)) {}                    // NOLINT
  Json(int v) : Json(static_cast<double>(v)) {}                      // NOLINT
  Json(int64_t v) : type_(Type::kNumber), num_(static_cast<double>(v)), integer_(true), int_(v) {}  // NOLINT
  Json(uint64_t v) : Json(static_cast<int64_t>(v)) {}                // NOLINT
  Json(const char* s) : type_(Type::kString), str_(s) {}             // NOLINT
  Json(std::string s) : type_(Type::kString), str_(std::move(s)) {}  // NOLINT
  Json(const std::vector<double>& v);                                // NOLINT: an array of numbers
  Json(const std::vector<int64_t>& v);                               // NOLINT
  Json(const std::vector<std::string>& v);                           // NOLINT

  static Json array();
  static Json object();

  Type type() const { return type_; }
  // Array: appends (a null value becomes an empty array first). Returns *this.
  Json& push(Json v);
  Json& push_back(Json v) { return push(std::move(v)); }
  // Object: inserts or replaces `key`, keeping first-insertion order (a null value becomes an empty object first).
  Json& set(const std::string& key, Json v);
  // Object member; throws std::invalid_argument "[json] ..." when this is not an object or the key is absent.
  const Json& at(const std::string& key) const;
  bool contains(const std::string& key) const;
  size_t size() const;  // elements of an array or members of an object, else 0

  // Pretty-printed with `indent` spaces (0 = one line). Numbers: integers exactly, others with 10 significant digits.
  std::string dump(int indent = 2) const;

 private:
  void write(std::string& out, int indent, int depth) const;
  Type type_ = Type::kNull;
  bool bool_ = false;
  double num_ = 0.0;
  bool integer_ = false;
  int64_t int_ = 0;
  std::string str_;
  std::vector<Json> items_;
  std::vector<std::pair<std::string, Json>> members_;
};

}  // namespace qkv::experiments
