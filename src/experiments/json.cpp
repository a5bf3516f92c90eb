// The experiment-results JSON writer: escaping per RFC 8259 and a stable layout, so results.json diffs cleanly.
#include "qkv/experiments/json.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace qkv::experiments {

Json::Json(const std::vector<double>& v) : type_(Type::kArray) {
  for (double x : v) items_.emplace_back(x);
}
Json::Json(const std::vector<int64_t>& v) : type_(Type::kArray) {
  for (int64_t x : v) items_.emplace_back(x);
}
Json::Json(const std::vector<std::string>& v) : type_(Type::kArray) {
  for (const auto& x : v) items_.emplace_back(x);
}

Json Json::array() {
  Json j;
  j.type_ = Type::kArray;
  return j;
}
Json Json::object() {
  Json j;
  j.type_ = Type::kObject;
  return j;
}

Json& Json::push(Json v) {
  if (type_ == Type::kNull) type_ = Type::kArray;
  if (type_ != Type::kArray) throw std::invalid_argument("[json] push on a value that is not an array");
  items_.push_back(std::move(v));
  return *this;
}

Json& Json::set(const std::string& key, Json v) {
  if (type_ == Type::kNull) type_ = Type::kObject;
  if (type_ != Type::kObject) throw std::invalid_argument("[json] set('" + key + "') on a value that is not an object");
  for (auto& m : members_)
    if (m.first == key) {
      m.second = std::move(v);
      return *this;
    }
  members_.emplace_back(key, std::move(v));
  return *this;
}

const Json& Json::at(const std::string& key) const {
  if (type_ != Type::kObject) throw std::invalid_argument("[json] at('" + key + "') on a value that is not an object");
  for (const auto& m : members_)
    if (m.first == key) return m.second;
  throw std::invalid_argument("[json] no member '" + key + "'");
}

bool Json::contains(const std::string& key) const {
  if (type_ != Type::kObject) return false;
  for (const auto& m : members_)
    if (m.first == key) return true;
  return false;
}

size_t Json::size() const {
  return type_ == Type::kArray ? items_.size() : type_ == Type::kObject ? members_.size() : 0;
}

namespace {

void quote(std::string& out, const std::string& s) {
  out.push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
}

void newline(std::string& out, int indent, int depth) {
  if (indent <= 0) return;
  out.push_back('\n');
  out.append(static_cast<size_t>(indent) * depth, ' ');
}

}  // namespace

void Json::write(std::string& out, int indent, int depth) const {
  switch (type_) {
    case Type::kNull: out += "null"; return;
    case Type::kBool: out += bool_ ? "true" : "false"; return;
    case Type::kNumber: {
      if (integer_) {
        out += std::to_string(int_);
      } else if (!std::isfinite(num_)) {
        out += "null";
      } else if (num_ == std::floor(num_) && std::abs(num_) < 1e15) {
        out += std::to_string(static_cast<int64_t>(num_));
      } else {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.10g", num_);
        out += buf;
      }
      return;
    }
    case Type::kString: quote(out, str_); return;
    case Type::kArray: {
      bool flat = true;  // arrays of scalars stay on one line
      for (const Json& j : items_) flat = flat && j.type_ != Type::kArray && j.type_ != Type::kObject;
      out.push_back('[');
      for (size_t i = 0; i < items_.size(); ++i) {
        if (i) out += flat || indent <= 0 ? ", " : ",";
        if (!flat) newline(out, indent, depth + 1);
        items_[i].write(out, indent, depth + 1);
      }
      if (!flat && !items_.empty()) newline(out, indent, depth);
      out.push_back(']');
      return;
    }
    case Type::kObject: {
      out.push_back('{');
      for (size_t i = 0; i < members_.size(); ++i) {
        if (i) out.push_back(',');
        newline(out, indent, depth + 1);
        if (indent <= 0 && i) out.push_back(' ');
        quote(out, members_[i].first);
        out += ": ";
        members_[i].second.write(out, indent, depth + 1);
      }
      if (!members_.empty()) newline(out, indent, depth);
      out.push_back('}');
      return;
    }
  }
}

std::string Json::dump(int indent) const {
  std::string out;
  write(out, indent, 0);
  if (indent > 0) out.push_back('\n');
  return out;
}

}  // namespace qkv::experiments
