"""Turn a GGUF file into a checkpoint folder (config.json, safetensors, tokenizer) that vLLM loads.

vLLM 0.32 has no GGUF loader. transformers reads GGUF (dequantizing to float32), so this script,
run with the python of the vLLM install (it has torch, transformers, gguf and accelerate), writes a
folder that `--model` can point at, fully offline:

    PYTHON-WITH-VLLM llmdeploy/render/gguf_to_hf.py MODEL.gguf OUT_DIR

It is a plain script (no llmdeploy imports) because vLLM's environment usually has no llmdeploy.
"""

from __future__ import annotations

import importlib
import os
import sys


def convert(gguf_path: str, out_dir: str) -> None:
    transformers = importlib.import_module("transformers")
    folder, name = os.path.split(os.path.abspath(gguf_path))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    # The dequantized weights are plain tensors; drop the GGUF marker so save_pretrained accepts them.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    partial = out_dir.rstrip("/") + ".partial"
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    os.replace(partial, out_dir)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: gguf_to_hf.py MODEL.gguf OUT_DIR", file=sys.stderr)
        return 2
    if os.path.isfile(os.path.join(argv[1], "config.json")):
        return 0
    convert(argv[0], argv[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
