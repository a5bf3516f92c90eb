// The packed int8 product (qkv/kernels/lowp.h) with AVX-VNNI: micro_int8.h on the VEX-encoded vpdpbusd ymm, for
// CPUs with AVX2 but no AVX-512 (Alder Lake and later). The packed layout, the +128 offset activations and the exact
// int32 sums per block of kInt8Group k, scaled into float sums by fused multiply-adds in block order, are those of
// the avx512vnni build (lowp_avx512.cpp), so the bits are the same. 16 ymm registers: blocks of 6 rows by 16
// columns (12 int32 sums, 2 weight registers, 1 broadcast; the float sums go to the stack, touched once per block).
// This file alone is compiled with -mavx2 -mfma -mavxvnni (no AVX-512); it holds no inline code from the standard
// library, so nothing built here can stand in for another unit's copy on an older CPU.
#include "micro_int8.h"

namespace qkv::kernels::avxvnni {
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  detail::int8_packed_block<detail::Lanes256, 6>(a, w, bias, c, ldc, m0, m1, n0, n1);
}
}  // namespace qkv::kernels::avxvnni
