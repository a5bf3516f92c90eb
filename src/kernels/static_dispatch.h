// Private (not installed): run-time counts as template arguments, written once for the kernels' dispatch switches
// (a register block's rows, a vector count, a block type). Plain C++: included by kernels of every ISA.
#pragma once

#include <cstdint>
#include <utility>

namespace qkv::kernels::detail {

// f.template operator()<I>() for the I in [0, kN) equal to i (nothing where none is).
template <int kN, class F>
inline void with_index(int64_t i, const F& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((i == I ? f.template operator()<I>() : void()), ...);
  }(std::make_integer_sequence<int, kN>());
}

// block.template operator()<R>(r0) for the blocks of R rows that cover [0, rows): R = kRows, then the rest (< kRows).
template <int kRows, class Block>
inline void for_row_blocks(int64_t rows, const Block& block) {
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) block.template operator()<kRows>(r);
  with_index<kRows>(rows - r, [&]<int R>() {
    if constexpr (R > 0) block.template operator()<R>(r);
  });
}

}  // namespace qkv::kernels::detail
