"""Writes the seed corpus of the safetensors fuzzer (fuzz/corpus): small valid files made by the reference
`safetensors` package and broken files, one per validation rule. Run: .venv/bin/python scripts/make_fuzz_corpus.py
"""
import json
import os
import struct
import sys

import numpy as np
import torch
from safetensors.numpy import save as np_save
from safetensors.torch import save as torch_save

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus")


def raw(header, data=b""):
    """8-byte little-endian size + header (bytes or a dict, dumped compactly) + data."""
    hb = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(hb)) + hb + data


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def valid():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    yield "valid_empty", np_save({})
    yield "valid_f32_metadata", np_save({"w": a, "b": np.float32([0.5, -1])}, metadata={"format": "pt"})
    yield "valid_numpy_dtypes", np_save({
        "f64": np.float64([1e-300, 2.5]), "f16": np.float16([1, -0.0, np.inf]), "i64": np.int64([-1, 2**62]),
        "u64": np.uint64([2**64 - 1]), "i32": np.int32([-7]), "u32": np.uint32([7]), "i16": np.int16([-3]),
        "u16": np.uint16([3]), "i8": np.int8([-128]), "u8": np.uint8([255]), "bool": np.array([True, False]),
    })
    yield "valid_scalar_and_empty", np_save({"s": np.array(3.0, dtype=np.float32), "z": np.zeros((0, 3), np.float32)})
    yield "valid_torch_bf16_f8", torch_save({
        "bf16": torch.tensor([1.0, -2.5], dtype=torch.bfloat16),
        "e4m3": torch.tensor([1.0, 448.0], dtype=torch.float8_e4m3fn),
        "e5m2": torch.tensor([1.0, float("inf")], dtype=torch.float8_e5m2),
        "e4m3fnuz": torch.tensor([1.0], dtype=torch.float8_e4m3fnuz),
        "e5m2fnuz": torch.tensor([1.0], dtype=torch.float8_e5m2fnuz),
        "e8m0": torch.tensor([2.0], dtype=torch.float8_e8m0fnu),
    })
    yield "valid_c64_unconvertible", np_save({"c": np.complex64([1 + 2j])})
    yield "valid_f4_unconvertible", raw({"f": t("F4", [4], 0, 2)}, b"\x12\x34")
    yield "valid_misaligned_f32", raw({"u": t("U8", [1], 0, 1), "m": t("F32", [1], 1, 5)}, b"\x01" + struct.pack("<f", 2))
    yield "valid_escapes", raw(b'{"__metadata__":{"k\\n":"\\ud83d\\ude00"},"a\\"b":'
                               b'{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}    ', b"\0\0\x80\x3f")


def broken():
    f = {"a": t("F32", [1], 0, 4)}
    four = b"\0" * 4
    yield "bad_short", b"\x08\0\0"
    yield "bad_header_too_large", struct.pack("<Q", 100_000_001) + b"{}"
    yield "bad_header_past_eof", struct.pack("<Q", 64) + b"{}"
    yield "bad_not_utf8", raw(b'{"\xff":1}')
    yield "bad_not_json", raw(b'{"a":{"dtype":"F32",')
    yield "bad_not_object", raw(b"[1,2]")
    yield "bad_leading_space", raw(b"  {}")
    yield "bad_newline_padding", raw(b"{}\n")
    yield "bad_unknown_dtype", raw({"a": t("F128", [1], 0, 16)}, b"\0" * 16)
    yield "bad_metadata_int", raw({"__metadata__": {"k": 1}})
    yield "bad_metadata_null", raw({"__metadata__": None})
    yield "bad_duplicate_name", raw(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                    b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8)
    yield "bad_duplicate_metadata_key", raw(b'{"__metadata__":{"k":"1","k":"2"}}')
    yield "bad_offsets_triple", raw({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 4]}}, four)
    yield "bad_offsets_reversed", raw({"a": t("F32", [0], 4, 0)}, four)
    yield "bad_offsets_negative", raw({"a": t("F32", [1], -4, 0)}, four)
    yield "bad_offsets_huge", raw({"a": t("F32", [1], 2**64 - 4, 2**64)}, four)
    yield "bad_overlap", raw({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)}, b"\0" * 12)
    yield "bad_hole", raw({"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)}, b"\0" * 12)
    yield "bad_wraps_to_zero", raw({"a": t("F32", [2**32, 2**32], 0, 0)})
    yield "bad_bytes_overflow", raw({"a": t("F64", [2**59], 0, 0)})
    yield "bad_size_mismatch", raw({"a": t("F32", [2, 3], 0, 20)}, b"\0" * 20)
    yield "bad_f4_odd", raw({"a": t("F4", [3], 0, 2)}, b"\0\0")
    yield "bad_trailing_bytes", raw(json.dumps(f).encode(), b"\0" * 5)
    yield "bad_truncated_data", raw({"a": t("F32", [2], 0, 8)}, four)
    yield "bad_unknown_field", raw({"a": {**t("F32", [1], 0, 4), "x": 1}}, four)
    yield "bad_bool_byte", raw({"b": t("BOOL", [2], 0, 2)}, b"\x01\x02")
    yield "bad_lone_surrogate", raw(b'{"\\ud800":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', four)


GGUF_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus_gguf")


def gguf_file(build):
    """The bytes gguf.GGUFWriter writes after build(writer)."""
    import tempfile

    import gguf

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "x.gguf")
        w = gguf.GGUFWriter(path, "llama")
        build(w, gguf)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(path, "rb") as fh:
            return fh.read()


def gguf_seeds():
    """Small GGUF files written by the gguf package (every value type, quantized tensors, custom alignment) and
    broken copies of them, one per rule of qkv/core/gguf.h."""
    rng = np.random.default_rng(0)

    def model(w, gguf):
        Q = gguf.GGMLQuantizationType
        w.add_uint32("llama.block_count", 2)
        w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        w.add_bool("tokenizer.ggml.add_bos_token", True)
        w.add_int64("i64", -5)
        w.add_float64("f64", 0.25)
        w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "\u2581b"])
        w.add_array("tokenizer.ggml.scores", [0.0, -1.5, -2.0])
        w.add_array("tokenizer.ggml.token_type", [3, 1, 1])
        w.add_tensor("f32", rng.standard_normal((2, 3)).astype(np.float32))
        q8 = gguf.quants.quantize(rng.standard_normal((2, 32)).astype(np.float32), Q.Q8_0)
        w.add_tensor("q8", q8, raw_dtype=Q.Q8_0)
        q4k = rng.integers(0, 256, (1, 144), dtype=np.uint8)
        q4k[:, :4] = np.frombuffer(np.float16([0.01, 0.002]).tobytes(), np.uint8)
        w.add_tensor("q4k", q4k, raw_dtype=Q.Q4_K)

    def aligned(w, gguf):
        w.add_custom_alignment(64)
        w.add_tensor("a", np.float16([1, 2, 3]))
        w.add_tensor("b", np.float32([4]))

    valid = gguf_file(model)
    yield "valid_model", valid
    yield "valid_v2", valid[:4] + struct.pack("<I", 2) + valid[8:]
    yield "valid_alignment_64", gguf_file(aligned)
    yield "valid_empty", b"GGUF" + struct.pack("<Iqq", 3, 0, 0)
    yield "bad_magic", b"GGUX" + valid[4:]
    yield "bad_version_1", valid[:4] + struct.pack("<I", 1) + valid[8:]
    yield "bad_big_endian", valid[:4] + struct.pack(">I", 3) + valid[8:]
    yield "bad_tensor_count", valid[:8] + struct.pack("<q", 1 << 40) + valid[16:]
    yield "bad_truncated", valid[: len(valid) // 2]
    key = b"llama.block_count"
    i = valid.index(key)
    yield "bad_duplicate_key", valid.replace(struct.pack("<Q", 3) + b"i64", struct.pack("<Q", 3) + b"f64", 1)
    yield "bad_value_type", valid[: i + len(key)] + struct.pack("<I", 13) + valid[i + len(key) + 4:]
    t = valid.index(b"q8", valid.index(b"f32"))
    # q8's info: name, n_dims, ne[0], ne[1], type, offset
    yield "bad_negative_dim", valid[: t + 6] + struct.pack("<q", -32) + valid[t + 14:]
    yield "bad_block_multiple", valid[: t + 6] + struct.pack("<q", 48) + valid[t + 14:]
    yield "bad_ggml_type", valid[: t + 22] + struct.pack("<I", 31) + valid[t + 26:]
    yield "bad_offset", valid[: t + 26] + struct.pack("<Q", 24) + valid[t + 34:]


def main():
    os.makedirs(GGUF_OUT, exist_ok=True)
    for old in os.listdir(GGUF_OUT):
        if old.endswith(".gguf"):
            os.remove(os.path.join(GGUF_OUT, old))
    for name, data in gguf_seeds():
        assert len(data) <= 4096, name
        with open(os.path.join(GGUF_OUT, name + ".gguf"), "wb") as fh:
            fh.write(data)
    os.makedirs(OUT, exist_ok=True)
    for old in os.listdir(OUT):
        if old.endswith(".safetensors"):
            os.remove(os.path.join(OUT, old))
    count = 0
    for name, data in list(valid()) + list(broken()):
        assert len(data) <= 4096, name  # fuzz/run.sh uses -max_len=4096
        with open(os.path.join(OUT, name + ".safetensors"), "wb") as fh:
            fh.write(data)
        count += 1
    sys.stdout.write(f"make_fuzz_corpus: wrote {count} files to {os.path.normpath(OUT)}\n")


if __name__ == "__main__":
    main()
