// Private (not installed): the row blocking shared by the register-blocked products of attention_flash_avx512.cpp
// (float32) and attention_flash_avx512bf16.cpp (bf16 pairs): whole blocks of R rows, then one block of the rest.
#pragma once

#include <cstdint>

namespace qkv::kernels::flash {
namespace {

// block.template operator()<RR>(r0) for the blocks of RR rows that cover [0, rows): RR = R, then the rest (< R).
template <int R, class Block>
inline void for_row_blocks(int64_t rows, const Block& block) {
  static_assert(R >= 5 && R <= 12, "the rest's switch covers 1 to 11 rows");
  int64_t r = 0;
  for (; r + R <= rows; r += R) block.template operator()<R>(r);
  switch (rows - r) {
    case 11: if constexpr (R > 11) block.template operator()<11>(r); break;
    case 10: if constexpr (R > 10) block.template operator()<10>(r); break;
    case 9: if constexpr (R > 9) block.template operator()<9>(r); break;
    case 8: if constexpr (R > 8) block.template operator()<8>(r); break;
    case 7: if constexpr (R > 7) block.template operator()<7>(r); break;
    case 6: if constexpr (R > 6) block.template operator()<6>(r); break;
    case 5: block.template operator()<5>(r); break;
    case 4: block.template operator()<4>(r); break;
    case 3: block.template operator()<3>(r); break;
    case 2: block.template operator()<2>(r); break;
    case 1: block.template operator()<1>(r); break;
    default: break;
  }
}

}  // namespace
}  // namespace qkv::kernels::flash
