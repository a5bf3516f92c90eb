// Precision: how an op computes, never what a tensor stores (tensors stay float32 at the API), as
// torch.set_float32_matmul_precision and oneDNN's fpmath mode. kFloat32 is the default and gives the same bits as an
// op without the option. kBFloat16 rounds the operands of the products to bfloat16 (round to nearest even) and keeps
// scores, softmax, LSE and every accumulation in float32. kInt8 is for linear layers only: weights symmetric per
// output channel, activations dynamic per token, int32 accumulation.
#pragma once

#include <string>

namespace qkv {

enum class Precision { kFloat32, kBFloat16, kInt8 };

// "fp32", "bf16", "int8".
const char* precision_name(Precision p);

// "fp32" | "bf16" | "int8" -> the Precision; anything else throws std::invalid_argument
// "[precision] 'x' is not one of fp32, bf16, int8".
Precision parse_precision(const std::string& name);

}  // namespace qkv
