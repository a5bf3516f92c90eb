"""qkv: attention from Seq2Seq to self-attention, with a PyTorch-shaped API over NumPy arrays.

Shapes use one alphabet: B batch, H heads, T (Tq/Tk) sequence, D (Dk/Dv) head dim, E model width.
"""
from ._qkv import __version__  # noqa: F401
from ._qkv import attention  # noqa: F401
from ._qkv import manual_seed  # noqa: F401
from ._qkv import scaled_dot_product_attention, scaled_dot_product_attention_backward  # noqa: F401
from ._qkv import MultiheadAttention  # noqa: F401
from ._qkv import TransformerDecoderLayer, TransformerEncoderLayer  # noqa: F401
from ._qkv import GRU, LSTM  # noqa: F401
from . import positional  # noqa: F401
from ._qkv import load_safetensors, save_safetensors  # noqa: F401
from ._qkv import SentenceEncoder, WordPieceTokenizer  # noqa: F401
