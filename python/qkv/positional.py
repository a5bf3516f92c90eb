"""qkv.positional: positional encodings over NumPy arrays (sinusoidal table, RoPE, ALiBi, T5 relative buckets).

Shapes: T sequence length, E model width, D head dim, H heads, Tq/Tk query/key lengths. Every bias returned here
is additive: pass it to qkv.attention(..., mask=bias, mask_kind="additive") or as a float attn_mask.
"""
from . import _calls
from ._qkv import positional as _positional

# Calls whose arguments match no signature raise a one-line TypeError (never a dump of the arrays passed).
sinusoidal_table = _calls.function(_positional.sinusoidal_table, "sinusoidal_table")
add_sinusoidal = _calls.function(_positional.add_sinusoidal, "add_sinusoidal")
rope_apply = _calls.function(_positional.rope_apply, "rope_apply")
alibi_slopes = _calls.function(_positional.alibi_slopes, "alibi_slopes")
alibi_bias = _calls.function(_positional.alibi_bias, "alibi_bias")
t5_relative_bucket = _calls.function(_positional.t5_relative_bucket, "t5_relative_bucket")
t5_relative_bias = _calls.function(_positional.t5_relative_bias, "t5_relative_bias")

__all__ = ["sinusoidal_table", "add_sinusoidal", "rope_apply", "alibi_slopes", "alibi_bias", "t5_relative_bucket",
           "t5_relative_bias"]
