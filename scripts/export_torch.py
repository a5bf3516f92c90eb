#!/usr/bin/env python3
"""Save any PyTorch module's state_dict to safetensors, with PyTorch's names, so qkv loads it with no renaming.

For the layers qkv can run from a file (TransformerEncoderLayer / DecoderLayer, MultiheadAttention, GRU, LSTM) the
hyper-parameters that the weights' shapes do not tell (nhead, activation, norm_first, eps, ...) go into the file's
metadata, which `qkv run-layer` reads.

Library use (what the parity tests do):
    from export_torch import export, state_dict_numpy
    export(layer, "w.safetensors")          # the file
    qkv_layer.load_state_dict(state_dict_numpy(layer))   # or straight into a qkv module

Command line (run with .venv/bin/python):
    export_torch.py --module "nn.TransformerEncoderLayer(64, 4, batch_first=True)" --seed 0 --out w.safetensors
    export_torch.py --checkpoint model.pt --out w.safetensors      # a saved state_dict or whole module
"""
import argparse
import sys

import numpy as np
import torch
from safetensors.torch import save_file


def state_dict_numpy(module, dtype=np.float32):
    """{name: C-contiguous ndarray} of module.state_dict(); floating tensors cast to `dtype` (None keeps them)."""
    out = {}
    for name, t in module.state_dict().items():
        a = t.detach().cpu()
        if a.is_floating_point() and dtype is not None:
            a = a.to(torch.float64).numpy().astype(dtype)
        else:
            a = a.numpy()
        out[name] = np.ascontiguousarray(a)
    return out


def layer_metadata(module):
    """str -> str hyper-parameters of the modules qkv knows; {} for any other module."""
    nn = torch.nn
    meta = {"module": type(module).__name__}
    if isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
        meta["layer"] = "encoder" if isinstance(module, nn.TransformerEncoderLayer) else "decoder"
        meta["nhead"] = str(module.self_attn.num_heads)
        meta["d_model"] = str(module.self_attn.embed_dim)
        meta["dim_feedforward"] = str(module.linear1.out_features)
        meta["norm_first"] = "true" if module.norm_first else "false"
        meta["layer_norm_eps"] = repr(float(module.norm1.eps))
        act = module.activation  # F.relu / F.gelu for the strings, or a module / callable
        F = torch.nn.functional
        if act is F.relu or isinstance(act, nn.ReLU):
            meta["activation"] = "relu"
        elif act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
            meta["activation"] = "gelu"
        elif isinstance(act, nn.GELU) and act.approximate == "tanh":
            meta["activation"] = "gelu_tanh"
        else:  # qkv run-layer refuses it with this name in the message
            meta["activation"] = "unsupported:" + getattr(act, "__name__", type(act).__name__)
        meta["batch_first"] = "true" if module.self_attn.batch_first else "false"
    elif isinstance(module, nn.MultiheadAttention):
        meta.update(embed_dim=str(module.embed_dim), num_heads=str(module.num_heads), kdim=str(module.kdim),
                    vdim=str(module.vdim), batch_first="true" if module.batch_first else "false")
    elif isinstance(module, (nn.GRU, nn.LSTM)):
        meta.update(input_size=str(module.input_size), hidden_size=str(module.hidden_size),
                    num_layers=str(module.num_layers), bias="true" if module.bias else "false",
                    batch_first="true" if module.batch_first else "false")
    return meta


def export(module_or_state_dict, path, metadata=None, dtype=torch.float32):
    """Write the state_dict to `path` as safetensors; floating tensors as `dtype` (None keeps them).

    Tied or shared tensors are cloned, so every name gets its own bytes. Returns the metadata written.
    """
    if isinstance(module_or_state_dict, torch.nn.Module):
        sd = module_or_state_dict.state_dict()
        meta = layer_metadata(module_or_state_dict)
    else:
        sd = dict(module_or_state_dict)
        meta = {}
    meta.update({str(k): str(v) for k, v in (metadata or {}).items()})
    tensors = {}
    for name, t in sd.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"export_torch: state_dict['{name}'] is a {type(t).__name__}, not a torch.Tensor")
        t = t.detach().cpu()
        if t.is_floating_point() and dtype is not None:
            t = t.to(dtype)
        tensors[name] = t.clone().contiguous()
    save_file(tensors, path, metadata=meta)
    return meta


def _build_module(expr, seed):
    torch.manual_seed(seed)
    env = {"torch": torch, "nn": torch.nn}
    module = eval(expr, {"__builtins__": {}}, env)  # noqa: S307 - a trusted command-line expression
    if not isinstance(module, torch.nn.Module):
        raise SystemExit(f"export_torch: --module must build a torch.nn.Module, got {type(module).__name__}")
    return module.eval()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--module", help='a module expression, e.g. "nn.TransformerEncoderLayer(64, 4, batch_first=True)"')
    src.add_argument("--checkpoint", help="a file saved by torch.save: a state_dict or a whole module")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed before building --module")
    p.add_argument("--out", required=True, help="the .safetensors file to write")
    p.add_argument("--keep-dtype", action="store_true", help="keep floating dtypes (default: float32)")
    p.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE", help="extra metadata (repeatable)")
    a = p.parse_args(argv)

    if a.module:
        obj = _build_module(a.module, a.seed)
    else:
        try:
            obj = torch.load(a.checkpoint, map_location="cpu", weights_only=True)
        except Exception:  # a whole pickled module needs the full unpickler; only for files you trust
            obj = torch.load(a.checkpoint, map_location="cpu", weights_only=False)
    extra = dict(kv.split("=", 1) for kv in a.meta)
    meta = export(obj, a.out, extra, dtype=None if a.keep_dtype else torch.float32)
    n = len(obj.state_dict() if isinstance(obj, torch.nn.Module) else obj)
    sys.stderr.write(f"export_torch: wrote {n} tensors to {a.out} (metadata {meta})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
