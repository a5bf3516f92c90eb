"""qkv's GGUF reader and reference dequantizers against the gguf package (llama.cpp's gguf-py): tiny files of every
type qkv decodes, written by gguf.GGUFWriter, must dequantize to gguf.quants.dequantize's float32 bits exactly, and
the real SmolLM2-135M-Instruct Q4_1 file must read the same through both (metadata, tensor infos, values)."""
import os
import struct

import gguf
import numpy as np
import pytest
import qkv
from gguf import GGMLQuantizationType as Q
from smollm2 import gguf_path

# Where each type keeps its fp16 scales (byte offsets inside a block): random blocks get finite scales there.
SCALES = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,),
    Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,),
}
# The types gguf.quants can quantize (the K-quants it can only decode).
QUANTIZABLE = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)


def random_blocks(rng, qtype, rows, cols):
    """rows x cols elements of `qtype` as random bytes, each fp16 scale replaced by a finite value (zero, tiny,
    subnormal and negative ones included)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    choices = np.float16([0.0, -0.0, 6e-8, 1e-5, -3e-3, 0.0123, -0.5, 1.0, 7.25, -65504.0])
    for at in SCALES[qtype]:
        scale = np.where(rng.random(n) < 0.3, rng.choice(choices, n), rng.standard_normal(n) * 0.05).astype(np.float16)
        raw[:, at:at + 2] = scale.view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, cols // block * size)


def write(path, tensors, metadata=None, alignment=None):
    """tensors: name -> (array, raw_dtype or None); metadata: a list of (method, key, value)."""
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for method, key, value in metadata or []:
        getattr(w, method)(key, value)
    for name, (array, raw_dtype) in tensors.items():
        w.add_tensor(name, array, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def reference(path):
    """name -> (ggml type, row-major shape, gguf.quants.dequantize's float32 values)."""
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).reshape(shape)
        out[t.name] = (int(t.tensor_type), shape, values)
    return out


def assert_same_bits(got, want, what):
    assert got.dtype == np.float32 and got.shape == want.shape, (what, got.shape, want.shape)
    diff = np.flatnonzero(got.view(np.uint32).ravel() != want.view(np.uint32).ravel())
    assert diff.size == 0, f"{what}: {diff.size} elements differ, first at {diff[0]}: {got.ravel()[diff[0]]!r} " \
                           f"vs {want.ravel()[diff[0]]!r}"


@pytest.mark.parametrize("qtype", list(SCALES), ids=lambda q: q.name)
def test_random_blocks_match_gguf_py(tmp_path, qtype):
    rng = np.random.default_rng(int(qtype))
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    tensors = {
        "matrix": (random_blocks(rng, qtype, 3, 2 * block), qtype),
        "cube": (random_blocks(rng, qtype, 6, block).reshape(2, 3, -1), qtype),
        "row": (random_blocks(rng, qtype, 1, block)[0], qtype),
    }
    path = write(tmp_path / "r.gguf", tensors)
    want = reference(path)
    _, infos = qkv.gguf_read(path)
    assert [t["name"] for t in infos] == ["matrix", "cube", "row"]
    for info in infos:
        kind, shape, values = want[info["name"]]
        assert info["type"] == kind and info["type_name"] == qtype.name and info["shape"] == shape
        assert_same_bits(qkv.gguf_dequantize(path, info["name"]), values, f"{qtype.name} {info['name']}")


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda q: q.name)
def test_quantized_by_gguf_py_match(tmp_path, qtype):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 96)) * np.float32(0.3)).astype(np.float32)
    x[0, :32] = 0  # an all-zero block
    path = write(tmp_path / "q.gguf", {"w": (gguf.quants.quantize(x, qtype), qtype)})
    _, _, want = reference(path)["w"]
    assert_same_bits(qkv.gguf_dequantize(path, "w"), want, qtype.name)
    assert np.abs(want - x).max() < 0.2  # and it is x, roughly


def test_float_types(tmp_path):
    rng = np.random.default_rng(1)
    f32 = rng.standard_normal((3, 5)).astype(np.float32)
    f16 = np.float16([[1, -0.0, 6e-8, 65504, np.inf, -np.inf, np.nan, 0.1]])
    bf16 = gguf.quants.quantize(np.float32([[1.0, -2.5, 3.1415927, 1e-40, 3e38, -0.0]]), Q.BF16)
    path = write(tmp_path / "f.gguf", {"f32": (f32, None), "f16": (f16, None), "bf16": (bf16, Q.BF16)})
    want = reference(path)
    for name in ("f32", "f16", "bf16"):
        assert_same_bits(qkv.gguf_dequantize(path, name), want[name][2], name)
    assert_same_bits(qkv.gguf_dequantize(path, "f32"), f32, "f32 itself")


def test_metadata_round_trip(tmp_path):
    meta = [
        ("add_uint8", "u8", 255), ("add_int8", "i8", -128), ("add_uint16", "u16", 65535), ("add_int16", "i16", -2),
        ("add_uint32", "u32", 4_000_000_000), ("add_int32", "i32", -7), ("add_float32", "f32", 0.1),
        ("add_uint64", "u64", 2**64 - 1), ("add_int64", "i64", -(2**63)), ("add_float64", "f64", 0.1),
        ("add_bool", "yes", True), ("add_bool", "no", False), ("add_string", "s", "h\u00e9llo \u2581"),
        ("add_array", "tokens", ["<s>", "", "\u2581the"]), ("add_array", "scores", [0.5, -1.25]),
        ("add_array", "ints", [1, -2, 3]), ("add_array", "flags", [True, False]),
    ]
    path = write(tmp_path / "m.gguf", {"x": (np.float32([1, 2]), None)}, meta, alignment=64)
    md, infos = qkv.gguf_read(path)
    assert list(md) == ["general.architecture", "general.alignment"] + [k for _, k, _ in meta]
    assert md["general.architecture"] == "llama" and md["general.alignment"] == 64
    for _, key, value in meta:
        if key == "f32":
            assert md[key] == float(np.float32(0.1))
        elif key == "scores":
            assert md[key] == [0.5, -1.25]
        else:
            assert md[key] == value and type(md[key]) is type(value), key
    assert infos == [{"name": "x", "type": 0, "type_name": "F32", "shape": (2,), "offset": 0}]


def test_errors(tmp_path):
    good = write(tmp_path / "g.gguf", {"x": (np.float32([1, 2]), None)})
    data = good.read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data[:4] + struct.pack("<I", 1) + data[8:])
    with pytest.raises(RuntimeError, match=r"^\[gguf\] .*bad\.gguf: GGUF version 1 is no longer supported .*at byte 4$"):
        qkv.gguf_read(bad)
    start = gguf.GGUFReader(str(good)).tensors[0].data_offset
    bad.write_bytes(data[:start + 4])  # half of x's 8 bytes
    with pytest.raises(RuntimeError, match=r"tensor 'x'\) at byte \d+$"):
        qkv.gguf_dequantize(bad, "x")
    with pytest.raises(RuntimeError, match="cannot open: No such file"):
        qkv.gguf_read(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match=r"no tensor 'y'"):
        qkv.gguf_dequantize(good, "y")
    with pytest.raises(TypeError, match="os.PathLike"):
        qkv.gguf_read(3)
    iq = write(tmp_path / "iq.gguf", {"w": (np.zeros((1, 18), np.uint8), Q.IQ4_NL)})
    assert qkv.gguf_read(iq)[1][0]["type_name"] == "IQ4_NL"
    with pytest.raises(RuntimeError, match=r"^\[dequantize\] tensor 'w': no dequantizer for IQ4_NL$"):
        qkv.gguf_dequantize(iq, "w")


# --- the real model ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    path = gguf_path()
    return path, gguf.GGUFReader(str(path)), qkv.gguf_read(path)


def test_smollm2_metadata(smollm2):
    _, reader, (md, _) = smollm2
    assert md["general.architecture"] == "llama"
    assert md["llama.block_count"] == 30
    assert len(md["tokenizer.ggml.tokens"]) == 49152
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(md) == list(fields)
    for key, field in fields.items():
        want = field.contents()
        if isinstance(want, float) or (isinstance(want, list) and want and isinstance(want[0], float)):
            assert np.array_equal(np.float64(md[key]), np.float64(want)), key
        else:
            assert md[key] == want, key


def test_smollm2_tensors(smollm2):
    path, reader, (_, infos) = smollm2
    assert len(infos) == 272
    assert [t["name"] for t in infos] == [t.name for t in reader.tensors]
    start = reader.tensors[0].data_offset
    for info, t in zip(infos, reader.tensors):
        assert info["type"] == int(t.tensor_type), t.name
        assert info["shape"] == tuple(int(d) for d in reversed(t.shape)), t.name
        assert info["offset"] == t.data_offset - start, t.name
    kinds = {t["type_name"] for t in infos}
    assert {"Q4_1", "Q8_0", "F32"} <= kinds
    embed = next(t for t in infos if t["name"] == "token_embd.weight")
    assert embed["type_name"] == "Q8_0" and embed["shape"] == (49152, 576)


@pytest.mark.parametrize("name", ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight",
                                  "blk.7.attn_norm.weight", "output_norm.weight"])
def test_smollm2_dequantized_values(smollm2, name):
    path, reader, _ = smollm2
    t = next(t for t in reader.tensors if t.name == name)
    want = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    want = want.reshape(tuple(int(d) for d in reversed(t.shape)))
    assert_same_bits(qkv.gguf_dequantize(path, name), want, name)


def test_smollm2_every_tensor_decodes(smollm2):
    path, reader, _ = smollm2
    # The rest are compared on one row each (the full comparison of 272 tensors takes minutes in gguf-py).
    for t in reader.tensors:
        got = qkv.gguf_dequantize(path, t.name)
        assert got.shape == tuple(int(d) for d in reversed(t.shape)), t.name
        first_row = t.data.reshape(-1, t.data.shape[-1])[:1]
        want = gguf.quants.dequantize(first_row, t.tensor_type).astype(np.float32, copy=False).ravel()
        assert_same_bits(got.reshape(-1, got.shape[-1])[0], want, t.name)
        assert np.isfinite(got).all(), t.name
    assert os.path.getsize(path) > 90_000_000
