"""qkv.positional: positional encodings over NumPy arrays (sinusoidal table, RoPE, ALiBi, T5 relative buckets).

Shapes: T sequence length, E model width, D head dim, H heads, Tq/Tk query/key lengths. Every bias returned here
is additive: pass it to qkv.attention(..., mask=bias, mask_kind="additive") or as a float attn_mask.
"""
from ._qkv import positional as _positional

sinusoidal_table = _positional.sinusoidal_table
add_sinusoidal = _positional.add_sinusoidal
rope_apply = _positional.rope_apply
alibi_slopes = _positional.alibi_slopes
alibi_bias = _positional.alibi_bias
t5_relative_bucket = _positional.t5_relative_bucket
t5_relative_bias = _positional.t5_relative_bias

__all__ = ["sinusoidal_table", "add_sinusoidal", "rope_apply", "alibi_slopes", "alibi_bias", "t5_relative_bucket",
           "t5_relative_bias"]
