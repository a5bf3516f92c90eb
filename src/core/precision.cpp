// Names of the compute precisions (qkv/core/precision.h).
#include "qkv/core/precision.h"

#include "qkv/core/error.h"

namespace qkv {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFloat32: return "fp32";
    case Precision::kBFloat16: return "bf16";
    case Precision::kInt8: return "int8";
  }
  return "unknown";
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFloat32;
  if (name == "bf16") return Precision::kBFloat16;
  if (name == "int8") return Precision::kInt8;
  QKV_CHECK_ARG(false, "[precision] '", name, "' is not one of fp32, bf16, int8");
  return Precision::kFloat32;
}

}  // namespace qkv
