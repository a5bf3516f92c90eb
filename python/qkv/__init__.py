"""qkv: attention from Seq2Seq to self-attention, with a PyTorch-shaped API over NumPy arrays.

Shapes use one alphabet: B batch, H heads, T (Tq/Tk) sequence, D (Dk/Dv) head dim, E model width.
"""
from ._qkv import __version__  # noqa: F401
from ._qkv import attention  # noqa: F401
