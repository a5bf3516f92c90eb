// Positional encodings, one header per family: absolute (sinusoidal, learned), relative (Shaw, T5 buckets),
// rotary (RoPE) and linear biases (ALiBi). Each plugs into qkv::attention as an input transform or an additive mask.
#pragma once

#include "qkv/ops/positional/alibi.h"
#include "qkv/nn/positional/learned.h"
#include "qkv/nn/positional/relative.h"
#include "qkv/ops/positional/rope.h"
#include "qkv/nn/positional/sinusoidal.h"
#include "qkv/nn/positional/t5_bias.h"
