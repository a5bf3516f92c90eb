// AVX2+FMA build of the GELU, tanh and sigmoid loops in activations_impl.h (compiled with -mavx2 -mfma; called
// only when active_isa() allows AVX2, see activations.cpp).
#include "qkv/kernels/activations.h"

#define QKV_ACT_LANES 8
#define QKV_ACT_BUILD avx2
#include "activations_impl.h"
