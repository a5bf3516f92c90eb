"""qkv: attention from Seq2Seq to self-attention, with PyTorch's API and defaults over arrays.

Inputs are anything NumPy can read (NumPy arrays, torch tensors through DLPack or __array__, nested lists); float32
in memory is used without a copy. Results are NumPy arrays. `import qkv.torch` puts qkv's kernels inside torch
models (autograd included); `import qkv` alone never imports torch.

Shapes use one alphabet: B batch, H heads, T (Tq/Tk) sequence, D (Dk/Dv) head dim, E model width.
"""
from . import _calls
from . import _qkv
from ._qkv import __version__  # noqa: F401
from . import positional  # noqa: F401
from ._qkv import CausalLM, SentenceEncoder, WordPieceTokenizer  # noqa: F401
from ._qkv import ChatTemplate, find_chat_template  # noqa: F401
from ._qkv import Tokenizer  # noqa: F401

# Calls whose arguments match no signature raise a one-line TypeError (never a dump of the arrays passed).
attention = _calls.function(_qkv.attention, "attention")
manual_seed = _calls.function(_qkv.manual_seed, "manual_seed")
set_num_threads = _calls.function(_qkv.set_num_threads, "set_num_threads")
get_num_threads = _qkv.get_num_threads
cpu_info = _qkv.cpu_info
scaled_dot_product_attention = _calls.function(_qkv.scaled_dot_product_attention, "scaled_dot_product_attention")
scaled_dot_product_attention_backward = _calls.function(_qkv.scaled_dot_product_attention_backward,
                                                        "scaled_dot_product_attention_backward")
flash_attn_varlen_func = _calls.function(_qkv.flash_attn_varlen_func, "flash_attn_varlen_func")
flash_attn_varlen_backward = _calls.function(_qkv.flash_attn_varlen_backward, "flash_attn_varlen_backward")
flash_attn_with_kvcache = _calls.function(_qkv.flash_attn_with_kvcache, "flash_attn_with_kvcache")
load_safetensors = _calls.function(_qkv.load_safetensors, "load_safetensors")
save_safetensors = _calls.function(_qkv.save_safetensors, "save_safetensors")
gguf_read = _calls.function(_qkv.gguf_read, "gguf_read")
gguf_dequantize = _calls.function(_qkv.gguf_dequantize, "gguf_dequantize")
MultiheadAttention = _calls.patch_class(_qkv.MultiheadAttention)
TransformerEncoderLayer = _calls.patch_class(_qkv.TransformerEncoderLayer)
TransformerDecoderLayer = _calls.patch_class(_qkv.TransformerDecoderLayer)
TransformerEncoder = _calls.patch_class(_qkv.TransformerEncoder)
TransformerDecoder = _calls.patch_class(_qkv.TransformerDecoder)
Transformer = _calls.patch_class(_qkv.Transformer)
GRU = _calls.patch_class(_qkv.GRU)
LSTM = _calls.patch_class(_qkv.LSTM)
_calls.patch_class(CausalLM, ("from_pretrained", "logits", "generate"))
_calls.patch_class(SentenceEncoder, ("__init__", "encode", "tokenize", "attentions"))
from . import viz  # noqa: F401
from ._train import train  # noqa: F401  (qkv.train(...) and qkv.train.Run)
