// Entry points for ggml's block formats: argument checks, then the dequantizer (today the portable reference of
// quant_reference.cpp for every type), whole GGUF tensors to float32 Tensors, and rows of a quantized table
// (a token embedding) to float32.
#include <stdexcept>

#include "qkv/core/error.h"
#include "qkv/core/shape.h"
#include "qkv/kernels/quant.h"
#include "qkv/kernels/quant_gemm.h"

namespace qkv::kernels {

bool can_dequantize(gguf::Type type) {
  using gguf::Type;
  switch (type) {
    case Type::F32: case Type::F16: case Type::BF16: case Type::Q4_0: case Type::Q4_1: case Type::Q5_0:
    case Type::Q5_1: case Type::Q8_0: case Type::Q8_1: case Type::Q2_K: case Type::Q3_K: case Type::Q4_K:
    case Type::Q5_K: case Type::Q6_K: case Type::Q8_K: return true;
    default: return false;
  }
}

void dequantize_row(gguf::Type type, const void* blocks, float* out, int64_t n) {
  QKV_CHECK_RUNTIME(can_dequantize(type), "[dequantize] no dequantizer for ", gguf::type_name(type));
  const int64_t block = gguf::block_size(type);
  QKV_CHECK_ARG(n >= 0 && n % block == 0, "[dequantize] ", n, " elements of ", gguf::type_name(type),
                " are not a whole number of ", block, "-element blocks");
  if (n == 0) return;
  QKV_CHECK_ARG(blocks != nullptr && out != nullptr, "[dequantize] null pointer for ", n, " elements");
  portable::dequantize_row(type, blocks, out, n);
}

Tensor dequantize(const gguf::TensorInfo& tensor) {
  QKV_CHECK_RUNTIME(can_dequantize(tensor.type), "[dequantize] tensor '", tensor.name, "': no dequantizer for ",
                    gguf::type_name(tensor.type));
  const Shape shape = tensor.shape();
  Tensor out = Tensor::empty(shape);
  const int64_t n = tensor.numel();
  if (n == 0) return out;
  const int64_t row = tensor.ne.empty() ? 1 : tensor.ne[0];
  const int64_t rows = n / row;
  const int64_t stride = gguf::row_bytes(tensor.type, row);
  float* dst = out.data();
  for (int64_t r = 0; r < rows; ++r) dequantize_row(tensor.type, tensor.data + r * stride, dst + r * row, row);
  return out;
}

void embedding_rows(const QuantMatrix& w, const int64_t* ids, int64_t count, float* out) {
  QKV_CHECK_ARG(w.defined() && count >= 0 && ((ids != nullptr && out != nullptr) || count == 0),
                "[embedding_rows] ", count, " ids of the ", gguf::type_name(w.type), " table (", w.rows, ", ",
                w.cols, "): null ids or out, or a negative count");
  for (int64_t i = 0; i < count; ++i)
    QKV_CHECK_ARG(ids[i] >= 0 && ids[i] < w.rows, "[embedding_rows] id ", ids[i], " at position ", i,
                  " outside the table's ", w.rows, " rows (", gguf::type_name(w.type), " (", w.rows, ", ", w.cols,
                  "))");
  QKV_CHECK_RUNTIME(w.data != nullptr || count == 0, "[embedding_rows] the ", gguf::type_name(w.type), " table (",
                    w.rows, ", ", w.cols, ") was kept as repacked tiles only (packed_only)");
  for (int64_t i = 0; i < count; ++i) dequantize_row(w.type, w.data + ids[i] * w.row_bytes, out + i * w.cols, w.cols);
}

}  // namespace qkv::kernels
