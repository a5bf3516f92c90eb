"""Differential tests of qkv's safetensors reader/writer against the reference `safetensors` package.

Valid files written by the reference load in qkv with identical values, in the file's dtypes, and metadata; files
qkv writes are byte-identical to the reference's, in every numpy dtype. Broken files (one per validation rule) are rejected by both;
where the reference is lax, qkv is strict and the case below asserts and documents the difference.
"""
import json
import os
import struct
import zlib

import ml_dtypes
import numpy as np
import pytest
import safetensors
import torch
from safetensors.numpy import load_file as ref_np_load_file
from safetensors.numpy import save as ref_np_save
from safetensors.numpy import save_file as ref_np_save_file
from safetensors.torch import load_file as ref_torch_load_file
from safetensors.torch import save_file as ref_torch_save_file

import qkv

SHAPES = [(), (0,), (1,), (7,), (2, 0, 3), (1, 1, 1), (3, 5), (2, 3, 4)]
NUMPY_DTYPES = ["float64", "float32", "float16", "int64", "int32", "int16", "int8",
                "uint64", "uint32", "uint16", "uint8", "bool"]
TORCH_DTYPES = {
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "F8_E8M0": torch.float8_e8m0fnu,
}


def assert_same_float32(got, want, what=""):
    """Bitwise equality of float32 arrays, except that any NaN matches any NaN (payloads may differ)."""
    assert got.dtype == np.float32, what
    assert got.shape == want.shape, what
    with np.errstate(over="ignore"):  # F64 -> F32 overflows to inf, as it must
        want = np.ascontiguousarray(want, dtype=np.float32)
    got_nan, want_nan = np.isnan(got), np.isnan(want)
    np.testing.assert_array_equal(got_nan, want_nan, err_msg=f"{what}: NaN positions differ")
    g, w = got.view(np.uint32)[~got_nan], want.view(np.uint32)[~want_nan]
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, f"{what}: {bad.size} values differ, first qkv={g[bad[0]]:#x} ref={w[bad[0]]:#x}"


def assert_same(got, want, what=""):
    """Same dtype, same shape, same bytes (NaN payloads included: nothing is converted)."""
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, what
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), f"{what}: bytes differ"


def random_array(rng, dtype, shape):
    """Values over the dtype's whole range; float bit patterns include NaN, inf, subnormals and -0."""
    return np.asarray(_random_values(rng, np.dtype(dtype), shape)).reshape(shape)


def _random_values(rng, dtype, shape):
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if dtype == np.float64:
        vals = rng.standard_normal(size=shape) * 10.0 ** rng.integers(-300, 300, size=shape)
        flat = vals.reshape(-1)
        specials = [np.nan, np.inf, -np.inf, -0.0, 5e-324, 3.4028235677973366e38, 1e-45]
        flat[: min(len(specials), flat.size)] = specials[: flat.size]
        return vals
    bits = {np.float32: np.uint32, np.float16: np.uint16}[dtype.type]
    info = np.iinfo(bits)
    return rng.integers(0, info.max, size=shape, dtype=bits, endpoint=True).view(dtype)


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def raw_file(header, data=b""):
    hb = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(hb)) + hb + data


def read_bytes(path):
    with open(path, "rb") as fh:
        return fh.read()


def header_of(path):
    data = read_bytes(path)
    return json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


# --- valid files: same tensors, same metadata -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_numpy_dtypes_load_identically(tmp_path, dtype, shape):
    rng = np.random.default_rng(zlib.crc32(repr((dtype, shape)).encode()))
    arr = random_array(rng, dtype, shape)
    path = str(tmp_path / "t.safetensors")
    ref_np_save_file({"x": arr}, path)
    got = qkv.load_safetensors(path)
    want = ref_np_load_file(path)
    assert set(got) == set(want) == {"x"}
    assert_same(got["x"], want["x"], f"{dtype}{shape}")
    assert_same(qkv.load_safetensors(path, mmap=True)["x"], want["x"], f"mmap {dtype}{shape}")


@pytest.mark.parametrize("name", list(TORCH_DTYPES))
def test_torch_only_dtypes_every_bit_pattern(tmp_path, name):
    """BF16: all 65536 patterns, loaded as ml_dtypes.bfloat16 with the same bits; each F8 format: all 256, as
    float32. Reference values come from torch's own conversion."""
    tdtype = TORCH_DTYPES[name]
    if tdtype.itemsize == 2:
        bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    else:
        bits = torch.arange(-128, 128, dtype=torch.int16).to(torch.int8)
    t = bits.view(tdtype).reshape(-1, 8)
    path = str(tmp_path / "t.safetensors")
    ref_torch_save_file({"x": t}, path)
    assert header_of(path)["x"]["dtype"] == name
    got = qkv.load_safetensors(path)["x"]
    if name == "BF16":
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(got.view(np.int16), bits.reshape(-1, 8).numpy())
        return
    want = ref_torch_load_file(path)["x"].float().numpy()
    assert_same_float32(got, want, name)


def test_float16_every_bit_pattern(tmp_path):
    arr = np.arange(2**16, dtype=np.uint16).view(np.float16).reshape(256, 256)
    path = str(tmp_path / "t.safetensors")
    ref_np_save_file({"h": arr}, path)
    assert_same(qkv.load_safetensors(path)["h"], arr, "F16")


def test_many_tensors_mixed_dtypes_and_metadata(tmp_path):
    rng = np.random.default_rng(7)
    tensors = {}
    for i in range(40):
        dtype = NUMPY_DTYPES[i % len(NUMPY_DTYPES)]
        shape = SHAPES[(i * 5) % len(SHAPES)]
        tensors[f"layer.{i}.{dtype}"] = random_array(rng, dtype, shape)
    metadata = {"format": "pt", "unicode é😀": "line\nbreak \"quoted\" \\ \t\x01", "": ""}
    path = str(tmp_path / "m.safetensors")
    ref_np_save_file(tensors, path, metadata=metadata)
    got, got_meta = qkv.load_safetensors(path, with_metadata=True)
    with safetensors.safe_open(path, framework="np") as f:
        want_meta = f.metadata()
    assert got_meta == want_meta == metadata
    want = ref_np_load_file(path)
    assert set(got) == set(want)
    for k in want:
        assert_same(got[k], want[k], k)


def test_pytorch_state_dict_round_trips(tmp_path):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, batch_first=True)
    state = {k: v.contiguous() for k, v in layer.state_dict().items()}
    path = str(tmp_path / "enc.safetensors")
    ref_torch_save_file(state, path, metadata={"format": "pt"})
    got, meta = qkv.load_safetensors(path, with_metadata=True)
    assert meta == {"format": "pt"}
    assert set(got) == set(state)
    for k, v in state.items():
        assert_same_float32(got[k], v.float().numpy(), k)


def test_misaligned_f32_and_zero_size_between_tensors(tmp_path):
    """The reference writer never produces a misaligned F32 tensor, but it accepts one; so must qkv."""
    header = {"u": entry("U8", [1], 0, 1), "z": entry("F32", [0], 1, 1), "m": entry("F32", [2], 1, 9)}
    data = b"\x05" + struct.pack("<2f", 1.5, -2.0)
    path = write(tmp_path, "mis.safetensors", raw_file(header, data))
    ref = safetensors.deserialize(read_bytes(path))
    assert {name for name, _ in ref} == {"u", "z", "m"}
    got = qkv.load_safetensors(path)
    assert_same(got["m"], np.float32([1.5, -2.0]))
    assert_same(got["u"], np.uint8([5]))
    assert_same(qkv.load_safetensors(path, mmap=True)["m"], np.float32([1.5, -2.0]))
    assert got["z"].shape == (0,)


def test_empty_tensor_with_the_largest_representable_dims(tmp_path):
    path = write(tmp_path, "e.safetensors", raw_file({"a": entry("F32", [0, 2**61 - 1], 0, 0)}))
    safetensors.deserialize(read_bytes(path))
    assert qkv.load_safetensors(path)["a"].shape == (0, 2**61 - 1)


# --- writing: byte-identical to the reference ------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_save_is_byte_identical_to_reference(tmp_path, seed):
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(int(rng.integers(0, 8))):
        shape = tuple(int(d) for d in rng.integers(0, 4, size=int(rng.integers(0, 4))))
        name = "".join(rng.choice(list("abc.é_0"), size=int(rng.integers(1, 9))))
        tensors[name] = random_array(rng, "float32", shape)
    metadata = {"format": "pt"} if seed % 2 else None  # one key: the reference's HashMap order is not fixed
    ours = str(tmp_path / "q.safetensors")
    qkv.save_safetensors(ours, tensors, metadata)
    assert read_bytes(ours) == ref_np_save(tensors, metadata=metadata)
    back = ref_np_load_file(ours)
    for k, v in tensors.items():
        assert_same_float32(back[k], v, k)


def test_save_keeps_bool_int64_float64_float16_bfloat16_as_they_are(tmp_path):
    a = np.arange(12, dtype=np.float64).reshape(3, 4).T * 1e300  # non-contiguous float64, beyond float32
    tensors = {"a": a, "i": np.int64([2**40 + 1, -(2**62) - 3]), "b": np.array([[True, False], [False, True]]),
               "h": np.float16([1.0, 65504.0, 6e-8]), "i32": np.int32([1, -2]), "u8": np.uint8([0, 255]),
               "be": np.array([1.5, -2.25], dtype=">f8"), "bf": np.array([1.0, -3.5, np.inf], ml_dtypes.bfloat16)}
    path = str(tmp_path / "c.safetensors")
    qkv.save_safetensors(path, tensors)
    hdr = header_of(path)
    assert {k: hdr[k]["dtype"] for k in tensors} == {"a": "F64", "i": "I64", "b": "BOOL", "h": "F16", "i32": "I32",
                                                    "u8": "U8", "be": "F64", "bf": "BF16"}
    want = ref_np_load_file(path)  # the reference reads the same values back (it has no bfloat16 in numpy)
    for k in ("a", "i", "b", "h", "i32", "u8"):
        assert_same(want[k], np.ascontiguousarray(tensors[k]), k)
    np.testing.assert_array_equal(want["be"], [1.5, -2.25])
    got = qkv.load_safetensors(path)
    for k, v in tensors.items():
        assert_same(got[k], np.ascontiguousarray(v, dtype=v.dtype.newbyteorder("<")), k)
    assert got["i"][0] == 2**40 + 1 and got["a"][1, 0] == 1e300


def test_save_converts_dtypes_without_a_safetensors_dtype_to_f32(tmp_path):
    path = str(tmp_path / "ld.safetensors")
    qkv.save_safetensors(path, {"l": np.arange(3, dtype=np.longdouble)})
    assert header_of(path)["l"]["dtype"] == "F32"
    assert_same(qkv.load_safetensors(path)["l"], np.float32([0, 1, 2]))


def test_load_copies_so_truncating_or_rewriting_the_file_changes_nothing(tmp_path):
    path = str(tmp_path / "t.safetensors")
    big = np.arange(1 << 16, dtype=np.float32)
    qkv.save_safetensors(path, {"x": big, "y": np.ones(4, np.float32)})
    x = qkv.load_safetensors(path)["x"]
    with open(path, "r+b") as f:  # rewrite in place, then truncate
        f.write(b"\x7f" * 4096)
        f.truncate(16)
    assert_same(x, big)  # neither SIGBUS nor changed values
    os.remove(path)
    assert float(x.sum()) == float(big.sum())


def test_mmap_true_maps_and_truncation_then_kills_the_process(tmp_path):
    """Documented: mmap=True arrays depend on the file. In a child, truncating the file then reading the array
    dies with SIGBUS; the default (copy) mode survives the same sequence."""
    path = str(tmp_path / "m.safetensors")
    qkv.save_safetensors(path, {"x": np.arange(1 << 18, dtype=np.float32)})
    code = (
        "import os, sys, qkv\n"
        "x = qkv.load_safetensors(sys.argv[1], mmap=sys.argv[2] == '1')['x']\n"
        "os.truncate(sys.argv[1], 8)\n"
        "print(float(x[-1]))\n")
    import subprocess
    import sys
    env = dict(os.environ)
    mapped = subprocess.run([sys.executable, "-c", code, path, "1"], capture_output=True, text=True, env=env)
    assert mapped.returncode == -7, (mapped.returncode, mapped.stderr)  # SIGBUS
    qkv.save_safetensors(path, {"x": np.arange(1 << 18, dtype=np.float32)})
    copied = subprocess.run([sys.executable, "-c", code, path, "0"], capture_output=True, text=True, env=env)
    assert copied.returncode == 0 and float(copied.stdout) == float((1 << 18) - 1), copied.stderr


def test_save_overwrites_atomically_and_leaves_no_temporary_files(tmp_path):
    path = str(tmp_path / "w.safetensors")
    qkv.save_safetensors(path, {"x": np.ones(3, np.float32)})
    qkv.save_safetensors(path, {"y": np.zeros(2, np.float32)})
    assert os.listdir(tmp_path) == ["w.safetensors"]
    assert set(ref_np_load_file(path)) == {"y"}


def test_loaded_arrays_are_private_and_outlive_the_file(tmp_path):
    path = str(tmp_path / "p.safetensors")
    qkv.save_safetensors(path, {"x": np.arange(4, dtype=np.float32)})
    before = read_bytes(path)
    x = qkv.load_safetensors(path)["x"]
    m = qkv.load_safetensors(path, mmap=True)["x"]
    x[0] = 42.0
    m[1] = 43.0
    assert read_bytes(path) == before  # a copy, and a copy-on-write mapping
    os.remove(path)
    np.testing.assert_array_equal(x, [42, 1, 2, 3])
    np.testing.assert_array_equal(m, [0, 43, 2, 3])


# --- argument and I/O errors --------------------------------------------------------------------------------------

def test_missing_file_and_directory_raise_oserror(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"\[safetensors\] cannot open"):
        qkv.load_safetensors(str(tmp_path / "missing.safetensors"))
    with pytest.raises(IsADirectoryError):
        qkv.load_safetensors(tmp_path)
    with pytest.raises(FileNotFoundError):
        qkv.save_safetensors(str(tmp_path / "no" / "dir.safetensors"), {})


def test_save_rejects_bad_arguments(tmp_path):
    path = str(tmp_path / "a.safetensors")
    with pytest.raises(TypeError, match="tensor names must be str"):
        qkv.save_safetensors(path, {1: np.ones(1, np.float32)})
    with pytest.raises(TypeError, match="could not be read as an array"):
        qkv.save_safetensors(path, {"x": [[1.0], [1.0, 2.0]]})
    with pytest.raises(TypeError, match="dtype"):
        qkv.save_safetensors(path, {"x": np.array(["a"])})
    with pytest.raises(TypeError, match="metadata must map str -> str"):
        qkv.save_safetensors(path, {}, {"k": 1})
    with pytest.raises(TypeError, match="tensors must be a dict"):
        qkv.save_safetensors(path, [np.ones(1)])
    with pytest.raises(ValueError, match=r"\[safetensors\] the tensor name \"__metadata__\" is reserved"):
        qkv.save_safetensors(path, {"__metadata__": np.ones(1, np.float32)})
    with pytest.raises(ValueError, match=r"\[safetensors\] tensor name .* is not valid UTF-8"):
        qkv.save_safetensors(path, {"\udcff": np.ones(1, np.float32)})
    with pytest.raises(ValueError, match=r"\[safetensors\] metadata value .* is not valid UTF-8"):
        qkv.save_safetensors(path, {}, {"k": "\ud800"})
    assert not os.listdir(tmp_path)


def test_valid_but_unconvertible_dtypes(tmp_path):
    """The packed F4/F6 formats are valid (the reference loads them) but have no value in qkv; C64 loads as
    complex64."""
    for name, data in [("f4", raw_file({"c": entry("F4", [4], 0, 2)}, b"\x12\x34")),
                       ("f6", raw_file({"c": entry("F6_E2M3", [4], 0, 3)}, b"\0\0\0"))]:
        safetensors.deserialize(data)
        with pytest.raises(RuntimeError, match=r"\[safetensors\] tensor \"c\" has dtype .* no float32 conversion"):
            qkv.load_safetensors(write(tmp_path, name + ".safetensors", data))
    c = np.complex64([1 + 2j, 3])
    assert_same(qkv.load_safetensors(write(tmp_path, "c64.safetensors", ref_np_save({"c": c})))["c"], c)


# --- broken files: both reject, or the reference is lax and the case says so --------------------------------------

F32_1 = entry("F32", [1], 0, 4)
FOUR = b"\0" * 4

# (id, file bytes, qkv's reason, does the reference reject it too?)
BROKEN = [
    ("short_file", b"\x08\0\0", "shorter than the 8-byte header size field", True),
    ("empty_file", b"", "0 bytes, shorter than", True),
    ("header_too_large", struct.pack("<Q", 100_000_001) + b"{}", "exceeds the limit of 100000000 bytes", True),
    ("header_u64_max", struct.pack("<Q", 2**64 - 1) + b"{}", "exceeds the limit", True),
    ("header_past_eof", struct.pack("<Q", 64) + b"{}", "runs past the end of the file", True),
    ("not_utf8", raw_file(b'{"\xff":1}'), "not valid UTF-8", True),
    ("utf8_overlong", raw_file(b'{"\xc0\xaf":1}'), "not valid UTF-8", True),
    ("utf8_surrogate", raw_file(b'{"\xed\xa0\x80":1}'), "not valid UTF-8", True),
    ("not_json", raw_file(b'{"a":{"dtype":"F32",'), "invalid JSON", True),
    ("not_json_garbage", raw_file(b"hello"), "header is not JSON", True),
    ("trailing_comma", raw_file(b'{"a":{"dtype":"F32","shape":[1,],"data_offsets":[0,4]}}', FOUR), "trailing comma", True),
    ("leading_zero", raw_file(b'{"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}}', FOUR), "leading zero", True),
    ("control_char", raw_file(b'{"a\x01":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', FOUR), "control character", True),
    ("lone_surrogate", raw_file(b'{"\\ud800":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', FOUR), "lone high surrogate", True),
    ("header_array", raw_file(b"[]"), "not a JSON object", True),
    ("header_empty", raw_file(b""), "header is empty", True),
    ("nul_padding", raw_file(b"{}\0\0"), "unexpected byte 0x00 after the JSON object", True),
    ("unknown_dtype", raw_file({"a": entry("F128", [1], 0, 16)}, b"\0" * 16), "unknown dtype \"F128\"", True),
    ("lowercase_dtype", raw_file({"a": entry("f32", [1], 0, 4)}, FOUR), "unknown dtype \"f32\"", True),
    ("metadata_int", raw_file({"__metadata__": {"k": 1}}), "must be a string, got a number", True),
    ("metadata_array", raw_file({"__metadata__": []}), "__metadata__ must be an object", True),
    ("duplicate_field", raw_file(b'{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}', FOUR),
     "duplicate field \"dtype\"", True),
    ("duplicate_metadata_section", raw_file(b'{"__metadata__":{},"__metadata__":{}}'), "duplicate __metadata__ section", True),
    ("missing_shape", raw_file({"a": {"dtype": "F32", "data_offsets": [0, 4]}}, FOUR), "has no shape", True),
    ("offsets_triple", raw_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 4]}}, FOUR), "got more than 2 values", True),
    ("offsets_single", raw_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4]}}, FOUR), "got 1 value", True),
    ("offsets_reversed", raw_file({"a": entry("F32", [0], 4, 0)}, FOUR), "begin must not exceed end", True),
    ("offsets_float", raw_file({"a": entry("F32", [1], 0, 4.0)}, FOUR), "must be an integer, got 4.0", True),
    ("offsets_negative", raw_file({"a": entry("F32", [1], -4, 0)}, FOUR), "must be non-negative, got -4", True),
    ("offsets_minus_zero", raw_file(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[-0,4]}}', FOUR), "got -0", True),
    ("offsets_above_u64", raw_file({"a": entry("F32", [1], 0, 2**64 + 4)}, FOUR), "does not fit in 64 bits", True),
    ("offsets_near_u64", raw_file({"a": entry("F32", [1], 2**64 - 5, 2**64 - 1)}, FOUR), "hole at the start", True),
    ("dim_negative", raw_file({"a": entry("F32", [-1], 0, 4)}, FOUR), "must be non-negative, got -1", True),
    ("overlap", raw_file({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, b"\0" * 12), "overlap", True),
    ("same_range", raw_file({"a": F32_1, "b": F32_1}, FOUR), "overlap", True),
    ("hole_at_start", raw_file({"a": entry("F32", [1], 4, 8)}, b"\0" * 8), "hole at the start", True),
    ("hole_between", raw_file({"a": F32_1, "b": entry("F32", [1], 8, 12)}, b"\0" * 12), "hole in the data buffer", True),
    ("product_wraps_to_zero", raw_file({"a": entry("F32", [2**32, 2**32], 0, 0)}), "overflows 64 bits", True),
    ("bytes_wrap_to_zero", raw_file({"a": entry("F64", [2**59], 0, 0)}), "byte size of F64 tensor", True),
    ("size_mismatch", raw_file({"a": entry("F32", [2, 3], 0, 20)}, b"\0" * 20), "needs 24 bytes", True),
    ("f4_not_byte_aligned", raw_file({"a": entry("F4", [3], 0, 2)}, b"\0\0"), "do not end on a byte boundary", True),
    ("trailing_bytes", raw_file({"a": F32_1}, b"\0" * 5), "1 trailing bytes", True),
    ("trailing_bytes_no_tensors", raw_file(b"{}", b"\0"), "1 trailing bytes", True),
    ("truncated_data", raw_file({"a": entry("F32", [2], 0, 8)}, FOUR), "past its end", True),
    ("tensor_not_object", raw_file({"a": 1}), "must be an object", True),
    ("duplicate_tensor_name_other_offsets", raw_file(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                                     b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8),
     "duplicate tensor name \"a\"", True),
    # --- the reference accepts these; qkv rejects them on purpose ---
    # duplicate tensor names: the reference silently keeps the last entry (here both are identical, so it loads;
    # with different offsets it rejects the file only because the dropped entry leaves a hole).
    ("duplicate_tensor_name", raw_file(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                       b'"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', FOUR),
     "duplicate tensor name \"a\"", False),
    # duplicate metadata keys: the reference keeps the last value.
    ("duplicate_metadata_key", raw_file(b'{"__metadata__":{"k":"1","k":"2"}}'), "duplicate __metadata__ key", False),
    # leading whitespace: the format says the header MUST begin with '{'.
    ("leading_whitespace", raw_file(b"  {}"), "header must start with '{'", False),
    # padding: the format allows trailing spaces (0x20) only; the reference takes any JSON whitespace.
    ("newline_padding", raw_file(b"{}\n"), "padding after the JSON object must be spaces", False),
    ("tab_padding", raw_file(b"{}\t"), "must be spaces (0x20), found byte 0x09", False),
    # null __metadata__: the reference reads it as "no metadata"; it is not a str -> str object.
    ("metadata_null", raw_file({"__metadata__": None}), "got null", False),
    # unknown fields in a tensor entry: the reference ignores them (a typo such as "data_offset" with the real
    # field present would pass silently).
    ("unknown_field", raw_file({"a": {**F32_1, "x": {"y": [1]}}}, FOUR), "unknown field \"x\"", False),
    # dims above int64 in an empty tensor: valid for the reference (usize), not representable in qkv.
    ("dim_above_int64", raw_file({"a": entry("F32", [0, 2**63], 0, 0)}), "exceeds int64", False),
    ("nonzero_dims_past_int64", raw_file({"a": entry("F32", [0, 2**40, 2**40], 0, 0)}), "times 4 bytes pass int64", False),
    ("float32_strides_past_int64", raw_file({"a": entry("U8", [0, 2**61], 0, 0)}), "times 4 bytes pass int64", False),
    # BOOL bytes other than 0/1: the reference never looks at tensor data.
    ("bool_byte_2", raw_file({"b": entry("BOOL", [2], 0, 2)}, b"\x01\x02"), "only 0 and 1 are valid", False),
]


@pytest.mark.parametrize("case_id,data,reason,reference_rejects", BROKEN, ids=[c[0] for c in BROKEN])
def test_broken_file(tmp_path, case_id, data, reason, reference_rejects):
    path = write(tmp_path, case_id + ".safetensors", data)
    with pytest.raises(ValueError) as err:
        qkv.load_safetensors(path)
    assert str(err.value).startswith("[safetensors] ")
    assert reason in str(err.value)
    if reference_rejects:
        with pytest.raises(safetensors.SafetensorError):
            safetensors.deserialize(data)
        with pytest.raises(safetensors.SafetensorError):
            safetensors.safe_open(path, framework="np")
    else:
        safetensors.deserialize(data)  # documented: the reference accepts it
