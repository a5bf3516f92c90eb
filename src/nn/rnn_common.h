// Private helpers shared by gru.cpp and lstm.cpp: row views, operand checks, length handling (the gate math is
// qkv/kernels/rnn_cells.h).
// Not installed; the public API is include/qkv/nn/rnn.h.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/core/tensor.h"

namespace qkv::nn::detail {

// A (rows, cols) matrix whose last dim is unit-stride: `t` itself, or a contiguous copy.
inline Tensor unit_last_stride(const Tensor& t) {
  return (t.size(-1) <= 1 || t.stride(-1) == 1) ? t : t.contiguous();
}

// Row stride (in elements) of a rank-2 tensor with unit last stride.
inline int64_t row_stride(const Tensor& t) { return t.size(0) <= 1 ? t.size(1) : t.stride(0); }

// Checks the cell-step operands; `op` names the caller ("[gru_cell]").
void check_cell(const char* op, int64_t gates, const Tensor& gi, const Tensor& h, const Tensor& w_hh,
                const Tensor& b_hh);

// Checks the operands of a full cell (x with its own input projection).
void check_cell_input(const char* op, int64_t gates, const Tensor& x, const Tensor& h, const Tensor& w_ih,
                      const Tensor& b_ih);

// For time step t: which batch rows are still inside their sequence.
inline bool row_active(const std::vector<int64_t>& lengths, int64_t b, int64_t t) {
  return lengths.empty() || t < lengths[static_cast<size_t>(b)];
}

}  // namespace qkv::nn::detail
