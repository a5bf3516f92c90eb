"""qkv.viz: attention weights -> one self-contained HTML page (qkv's viewer; no network, works from file://).

Shapes follow bertviz: ``attentions`` is one array per layer, each (1, H, T, T) (or (H, T, T)); rows are queries,
columns keys. The page data is written by the library, as `qkv viz` writes it: the weights as base64 float16 (uint8,
or sparse uint8 maps with thumbnails for large inputs) and per-head statistics; the page draws them on canvas.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["write_html", "page_html", "viewer_template", "MAX_F16_BYTES"]

# Pages whose float16 payload would exceed this many base64 bytes carry uint8 weights instead (steps of 1/255).
MAX_F16_BYTES = 8_000_000
_PLACEHOLDER = "__QKV_DATA__"


def viewer_template() -> str:
    """The viewer page without data (web/viewer.html, installed beside this module)."""
    here = Path(__file__).resolve().parent
    for p in (here / "viewer.html", here.parent.parent / "web" / "viewer.html"):
        if p.is_file():
            return p.read_text(encoding="utf-8")
    raise RuntimeError(f"[viz] viewer.html was not found beside {here}")


def _layers(name: str, attentions, tq: int, tk: int) -> np.ndarray:
    """attentions (list of L arrays (1, H, Tq, Tk) or (H, Tq, Tk), or one (L, [1,] H, Tq, Tk) array) -> (L, H, Tq, Tk)."""
    if attentions is None:
        raise ValueError(f"[viz] {name}: attentions are required")
    arrs = list(attentions) if isinstance(attentions, (list, tuple)) else list(np.asarray(attentions))
    if not arrs:
        raise ValueError(f"[viz] {name}: attentions is empty (one array per layer expected)")
    out = []
    for i, a in enumerate(arrs):
        a = np.asarray(a.detach().cpu().numpy() if hasattr(a, "detach") else a, dtype=np.float32)
        if a.ndim == 4 and a.shape[0] == 1:
            a = a[0]
        if a.ndim != 3 or a.shape[1:] != (tq, tk):
            raise ValueError(f"[viz] {name}: layer {i} has shape {tuple(np.shape(arrs[i]))}, expected (1, H, {tq}, {tk}) "
                             f"for {tq} query and {tk} key tokens")
        if out and a.shape[0] != out[0].shape[0]:
            raise ValueError(f"[viz] {name}: layer {i} has {a.shape[0]} heads, layer 0 has {out[0].shape[0]}")
        out.append(a)
    w = np.stack(out)
    if not np.isfinite(w).all():
        raise ValueError(f"[viz] {name}: attentions {w.shape} hold NaN or infinite values")
    if w.min() < -1e-6 or w.max() > 1 + 1e-3:
        raise ValueError(f"[viz] {name}: attention weights must lie in [0, 1], got [{w.min():.4g}, {w.max():.4g}]")
    return np.clip(w, 0.0, 1.0)


def _page_data(snapshots, title: str, dtype: str, lang: str) -> str:
    """The page data, written by the library as `qkv viz` writes it (qkv::plot::viz_data), as the <script> text."""
    if dtype not in ("auto", "f16", "u8", "sparse"):
        raise ValueError(f"[viz] dtype must be 'auto', 'f16', 'u8' or 'sparse', got {dtype!r}")
    from . import _qkv

    specs = [(str(lab), [(n, k, [str(t) for t in q], [str(t) for t in kk], np.ascontiguousarray(w, dtype=np.float32),
                          bool(c)) for (n, k, q, kk, w, c) in groups]) for lab, groups in snapshots]
    return _qkv._viz_page_data(specs, str(title), dtype, lang)


def page_html(tokens=None, attentions=None, *, encoder_attention=None, decoder_attention=None,
              cross_attention=None, encoder_tokens=None, decoder_tokens=None, checkpoints=None,
              checkpoint_labels=None, title: str = "", causal: bool = False, dtype: str = "auto",
              lang: str = "en") -> str:
    """The viewer page as a string; see write_html for the arguments."""
    if lang not in ("en", "zh"):
        raise ValueError(f"[viz] lang must be 'en' or 'zh', got {lang!r}")
    # Each snapshot is a list of (name, kind, q_tokens, k_tokens, attentions, causal).
    if encoder_attention is not None or decoder_attention is not None or cross_attention is not None:
        if tokens is not None or attentions is not None or checkpoints is not None:
            raise ValueError("[viz] pass either tokens + attentions or the encoder/decoder/cross arguments, not both")
        if encoder_tokens is None or (decoder_tokens is None and (decoder_attention is not None or cross_attention is not None)):
            raise ValueError("[viz] encoder_tokens (and decoder_tokens with decoder or cross attention) are required")
        specs = []
        if encoder_attention is not None:
            specs.append(("encoder self-attention", "self", encoder_tokens, encoder_tokens, encoder_attention, False))
        if decoder_attention is not None:
            specs.append(("decoder self-attention", "self", decoder_tokens, decoder_tokens, decoder_attention, True))
        if cross_attention is not None:
            specs.append(("cross-attention", "cross", decoder_tokens, encoder_tokens, cross_attention, False))
        snapshots = [("", specs)]
    else:
        if tokens is None:
            raise ValueError("[viz] tokens are required (a list of T strings)")
        tokens = [str(t) for t in tokens]
        if checkpoints is not None:
            if attentions is not None:
                raise ValueError("[viz] pass attentions or checkpoints, not both")
            checkpoints = list(checkpoints)
            if not checkpoints:
                raise ValueError("[viz] checkpoints is empty")
            labels = list(checkpoint_labels) if checkpoint_labels is not None else [str(i) for i in range(len(checkpoints))]
            if len(labels) != len(checkpoints):
                raise ValueError(f"[viz] {len(labels)} checkpoint labels for {len(checkpoints)} checkpoints")
            snapshots = [(str(lab), [("self-attention", "self", tokens, tokens, a, causal)]) for lab, a in zip(labels, checkpoints)]
        else:
            snapshots = [("", [("self-attention", "self", tokens, tokens, attentions, causal)])]

    arrays = [[(n, k, q, kk, _layers(n, a, len(q), len(kk)), c) for (n, k, q, kk, a, c) in specs] for _, specs in snapshots]
    shapes0 = [g[4].shape for g in arrays[0]]
    for s, groups in enumerate(arrays):
        if [g[4].shape for g in groups] != shapes0:
            raise ValueError(f"[viz] checkpoint {s} has attention shapes {[g[4].shape for g in groups]}, checkpoint 0 {shapes0}")
    text = _page_data([(lab, groups) for (lab, _), groups in zip(snapshots, arrays)], title, dtype, lang)
    template = viewer_template()
    if template.count(_PLACEHOLDER) != 1:
        raise RuntimeError("[viz] viewer.html must hold the data placeholder exactly once")
    return template.replace(_PLACEHOLDER, text)


def write_html(path, tokens=None, attentions=None, **kwargs) -> str:
    """Writes the viewer page for these attention weights to `path` (atomically) and returns the path.

    tokens: T strings; attentions: one (1, H, T, T) array per layer (bertviz's / transformers' output_attentions).
    Encoder-decoder models: encoder_attention, decoder_attention, cross_attention (each one array per layer, the
    cross maps (1, H, T_dec, T_enc)) with encoder_tokens and decoder_tokens; the cross view is the source x target
    alignment. checkpoints: a list of `attentions` (same tokens), with checkpoint_labels, drawn with a slider.
    causal marks the masked upper triangle; dtype 'auto' (float16 unless the page would get large, then uint8, then
    sparse uint8 maps), 'f16', 'u8' or 'sparse'; lang 'en' or 'zh' for the labels. Raises ValueError on inconsistent shapes or non-finite weights.
    """
    html = page_html(tokens, attentions, **kwargs)
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".viz-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(html)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as a plainly created file, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
