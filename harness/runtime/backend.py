"""The one LLaMA backend shared by every decoder: KV cache, forward, attention.

The backend owns the model weights (a Hugging Face ``LlamaForCausalLM``), a static KV cache and the
per-forward counters. It knows no decoding algorithm: decoders call :meth:`Backend.forward` (the logits) or
:meth:`Backend.greedy_forward` (their argmax alone, which may read less: :mod:`harness.runtime.head_screen`)
with the new tokens, their explicit positions and a mask among the new tokens, then :meth:`Backend.commit` the
cache entries they keep.

Why our own forward loop instead of ``model(...)``: the Hugging Face layers (norms, projections, MLP,
rotary embedding) are reused as they are, but attention runs against a pre-allocated cache so that
"keep only these new entries" is one indexed copy and rollback is moving an integer, with no per-step
cache re-allocation and no Python-side mask preprocessing. This is the gpt-fast shape (explicit
positions in every forward). It also makes the custom mask independent of the transformers attention
back-end: the attention (ours, sdpa or eager) and its mask live in :mod:`harness.runtime.layer_ops`.
The matmul paths live in :mod:`harness.runtime.matmul`, the greedy LM head's screen in
:mod:`harness.runtime.head_screen`, the FLOPs formula in :mod:`harness.runtime.flops`, loading in
:mod:`harness.runtime.loading`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.runtime.arena import WeightArena
from harness.runtime.flops import forward_flops, model_shape
from harness.runtime.head_screen import HeadScreen
from harness.runtime.layer_ops import ATTN_CHOICES, glu_fits, layer_ops
from harness.runtime.matmul import Projection, can_pack, describe_path, layer_projections, select_kernel

SUPPORTED_MODEL_TYPES = ("llama", "mistral")


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


class Backend:
    """A causal LM with a static KV cache, explicit positions and custom masks among new tokens.

    Cache protocol: ``start(prompt, capacity)`` resets and prefills; each ``forward`` writes its ``k``
    new entries after the ``length`` committed ones; ``commit(keep)`` keeps the listed new entries (in
    order) and drops the rest; ``rollback(n)`` forgets committed entries past ``n``.
    """

    def __init__(
        self, model: torch.nn.Module, tokenizer, name: str, attn: str = "auto", matmul: str = "auto",
        bf16_weights: bool = False, kernel_sources: Path | None = None, screen_head: bool = True,
    ) -> None:
        """``matmul``: which matmul path (:data:`harness.runtime.matmul.MATMUL_CHOICES`); ``attn``: which
        attention (:data:`harness.runtime.layer_ops.ATTN_CHOICES`, resolved into :attr:`attention_path`); ``bf16_weights``:
        the model's linear weights hold bfloat16 values (``dtype=bf16w``), so our kernel stores them in
        bfloat16 and reads half the bytes, with the same results; ``kernel_sources``: our kernel built from an
        edited copy of its sources (an A/B of a kernel change: ``harness.runtime.kernels.bench_step``);
        ``screen_head``: greedy steps read the float32 LM head's bfloat16 rounding and recompute the few rows
        that can hold the argmax (:mod:`harness.runtime.head_screen`: same tokens, 10% fewer bytes a SmolLM2
        step), where our kernel runs the whole forward; False reads the whole head every step."""
        if attn not in ATTN_CHOICES:  # before the weights are packed
            raise ValueError(f"attn must be one of {', '.join(ATTN_CHOICES)}, got {attn!r}")
        model_type = getattr(model.config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelLoadError(
                f"model {name!r} has model_type {model_type!r}; this backend runs LLaMA-family models "
                f"({', '.join(SUPPORTED_MODEL_TYPES)}). Pass a LLaMA checkpoint or 'smollm2'."
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.shape = model_shape(model)
        param = next(model.parameters())
        self.dtype: torch.dtype = param.dtype
        self.device: torch.device = param.device
        # the forward's matmuls, prepacked on CPU (see harness.runtime.matmul); decided once, not per call
        pack = can_pack(model)
        kernel = select_kernel(matmul, model, kernel_sources)
        self._kernel = kernel  # also for argmax
        screening = screen_head and kernel is not None and not bf16_weights
        # 2 MB pages where offered, with room for the screen's bfloat16 head
        arena = WeightArena.for_model(model, (model.lm_head,) if screening else ()) if kernel is not None else None
        glu = glu_fits(model, kernel)  # SiLU * up inside the gate_up matmuls
        self._proj = [layer_projections(layer, pack, kernel, bf16_weights, arena, glu) for layer in model.model.layers]
        self._lm_head = Projection.of((model.lm_head,), pack, kernel, bf16_weights, arena)
        # the operations between the matmuls, fused where our kernel runs (see layer_ops)
        self._ops = layer_ops(model, kernel, self.shape.n_heads, self.shape.n_kv_heads, self.shape.head_dim, attn,
                              self._proj, self._lm_head)
        #: the greedy LM head's screen where greedy steps run through it (our whole forward), else None; built
        #: only there: its bounds and packed bfloat16 head cost start-up time and 57 MB for SmolLM2
        self.head_screen: HeadScreen | None = None
        if screening and self._ops.whole_forward:
            self.head_screen = HeadScreen.of(model.lm_head, kernel, arena)
            if self.head_screen is not None:
                self._ops.set_screen(self.head_screen)
        self.matmul_path: str = describe_path(kernel, pack, bf16_weights, self.dtype,
                                              0 if arena is None else arena.huge_bytes())
        if self.head_screen is not None:
            self.matmul_path += "; greedy LM head screened in bfloat16"
        #: the attention actually run: ``kernel`` (ours), ``sdpa`` or ``eager``
        self.attention_path: str = self._ops.attn
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
        # keys [n_layers, n_kv, capacity, head_dim], or in blocks where our attention reads them
        # (ops.key_cache_size, ops.key_block); values [n_layers, n_kv, capacity, head_dim]
        self._k_cache: torch.Tensor | None = None
        self._v_cache: torch.Tensor | None = None
        # cos, sin [capacity, head_dim] of every position the cache holds, where they depend on the
        # position alone (see reset); None: the rotary module is called per forward
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def gpu_name(self) -> str | None:
        """The CUDA device's name (manifests and benchmark headers say which GPU timed them); None on CPU."""
        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None

    def projections(self) -> list[Projection]:
        """Every matmul of a greedy step, in its order (each layer's four, then the LM head: its screen's
        bfloat16 one where :attr:`head_screen` runs)."""
        head = self._lm_head if self.head_screen is None else self.head_screen.projection
        return [p for lp in self._proj for p in lp.all()] + [head]

    def step_weight_bytes(self) -> int:
        """Bytes of matmul weights one greedy step reads: what a decoding step streams from memory."""
        return sum(p.weight_bytes for p in self.projections())

    def whole_head_bytes(self) -> int:
        """Bytes of the whole LM head, which a step returning logits reads (a sampling step)."""
        return self._lm_head.weight_bytes

    # ---- cache management -------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return 0 if self._v_cache is None else self._v_cache.shape[2]

    def reset(self, capacity: int) -> None:
        """Empty the cache, (re)allocating it when it is smaller than ``capacity``."""
        if capacity > self.capacity:
            s = self.shape
            size = (s.n_layers, s.n_kv_heads, capacity, s.head_dim)
            self._k_cache = torch.zeros(self._ops.key_cache_size(s.n_layers, capacity), dtype=self.dtype,
                                        device=self.device)
            self._v_cache = torch.zeros(size, dtype=self.dtype, device=self.device)
            self._rope = self._rope_table(capacity)
        self.length = 0
        self._pending = 0
        self.counters = Counters()

    def _rope_table(self, capacity: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rotary module's cos and sin for positions 0..capacity-1, [capacity, head_dim] each; None
        for the RoPE types whose frequencies follow the longest position seen (transformers' dynamic and
        longrope). The others compute them elementwise from the position, so a row of the table is bitwise
        what a per-forward call gives (tests compare). Why: that call cost 140-260 us of a 8-10 ms 1-token
        bf16w SmolLM2 step (Zen 5, round-robin A/B; results/perf/RUNS.md, eighth run), where indexing the
        table costs a few."""
        rotary = self.model.model.rotary_emb
        rope_type = getattr(rotary, "rope_type", "default")
        if not isinstance(rope_type, str) or "dynamic" in rope_type or rope_type == "longrope":
            return None
        dummy = torch.zeros(1, 1, 1, dtype=self.dtype, device=self.device)  # the module reads its dtype, device
        with torch.inference_mode():
            cos, sin = rotary(dummy, torch.arange(capacity, device=self.device)[None])  # [1, capacity, d] each
            return cos[0], sin[0]

    def commit(self, keep: list[int] | None = None) -> None:
        """Keep the new entries at relative indices ``keep`` (ascending; None = all) of the last forward."""
        if keep is None:
            n = self._pending
        else:
            n = len(keep)
            if keep != list(range(n)):  # a contiguous prefix is already in place
                src = torch.tensor(keep, device=self.device) + self.length
                self._ops.keep_keys(self._k_cache, src, self.length)
                self._v_cache[:, :, self.length : self.length + n] = self._v_cache[:, :, src]
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
        return self._run(input_ids, positions, tree_mask, logit_rows, prefill, greedy=False)

    def greedy_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        tree_mask: torch.Tensor | None = None,
        logit_rows: torch.Tensor | None = None,
    ) -> list[int]:
        """:meth:`argmax` of :meth:`forward`'s logits, [r] token ids: what a greedy step needs. In the whole
        forward's one call where it runs (through the LM head's screen where :attr:`head_screen` runs: the same
        ids, from the bfloat16 head and a few float32 rows), else exactly that."""
        if not self._ops.whole_forward or self._rope is None:
            return self.argmax(self.forward(input_ids, positions, tree_mask, logit_rows))
        return self._run(input_ids, positions, tree_mask, logit_rows, False, greedy=True)

    @torch.inference_mode()
    def _run(self, input_ids: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None,
             logit_rows: torch.Tensor | None, prefill: bool, greedy: bool) -> torch.Tensor | list[int]:
        """:meth:`forward`, or with ``greedy`` (only where the whole forward runs in one call) its argmax."""
        t0 = time.perf_counter()
        k = int(input_ids.shape[0])
        L = self.length
        if L + k > self.capacity:
            raise ValueError(f"KV cache overflow: {L} + {k} > capacity {self.capacity}; call reset() larger")
        s, ops = self.shape, self._ops
        mask = ops.step_mask(k, L, tree_mask, self.dtype, self.device)  # per ops: additive or bool, or None
        if greedy:  # the whole forward to each row's argmax in one call (layer.cpp; head_screen.cpp if screened)
            out = ops.greedy(input_ids, positions, self._rope, self._k_cache, self._v_cache, L, mask, logit_rows)
        elif ops.whole_forward and self._rope is not None:  # the same operations in one call (layer.cpp)
            out = ops.logits(input_ids, positions, self._rope, self._k_cache, self._v_cache, L, mask, logit_rows)
        else:
            model = self.model.model
            x = model.embed_tokens(input_ids)  # [k, hidden]
            if self._rope is None:
                cos, sin = (t[0] for t in model.rotary_emb(x[None], positions[None]))  # [k, head_dim] each
            else:
                cos, sin = (t.index_select(0, positions) for t in self._rope)  # [k, head_dim] each
            # x: the residual stream, add: what the last layer adds to it, [k, hidden] each
            x, add = ops.run_layers(x, cos, sin, self._k_cache, self._v_cache, L, mask)
            if logit_rows is not None:  # the final norm only for the rows whose logits are wanted
                x, add = x[logit_rows], None if add is None else add[logit_rows]  # [r, hidden]
            _, h = ops.add_norm(x, add, model.norm)  # [r, hidden]
            out = self._lm_head(h).float()  # [r, vocab]
        self._pending = k
        r = k if logit_rows is None else int(logit_rows.shape[0])
        self.counters.input_tokens.append(k)
        self.counters.flops.append(forward_flops(s, k, L, r))
        self.counters.is_prefill.append(prefill)
        if self.device.type == "cuda":
            self.sync()
        self.counters.forward_s.append(time.perf_counter() - t0)
        return out

    @property
    def op_clocks(self) -> bool:
        """Whether :meth:`clock_ops` can split a step by operation: our whole forward runs it in one call."""
        return self._ops.whole_forward

    def clock_ops(self, on: bool) -> None:
        """Clocks around each operation inside our whole forward on (zeroed) or off: where a step's time goes
        (``layer.cpp``'s Clocks; read by :meth:`op_seconds`). Only where :attr:`op_clocks`."""
        if not self.op_clocks:
            raise ValueError(f"per-operation clocks need our whole-forward kernel (float32 or bf16w on CPU, "
                             f"attn=kernel); this backend runs {self.matmul_path}, attention {self.attention_path}")
        self._ops.clock_ops(on)

    def op_seconds(self) -> dict[str, float]:
        """Seconds summed per operation since :meth:`clock_ops` turned the clocks on, and ``steps``: how many
        forwards they cover."""
        return self._ops.op_seconds()

    # ---- helpers used by every decoder -------------------------------------------------------------
    def argmax(self, logits: torch.Tensor) -> list[int]:
        """Each row's argmax of logits [r, vocab], as ``logits.argmax(-1).tolist()`` gives it (the first
        maximum; NaN counts as the maximum), through our kernel's vectorised loop where it runs: torch's
        took 59 us for one SmolLM2 row with warm caches and 125 after a forward (Zen 5), per greedy step."""
        if (self._kernel is not None and logits.device.type == "cpu" and logits.dtype == torch.float32
                and logits.shape[-1] < 1 << 24):  # the kernel holds indices as floats
            return self._kernel.argmax_rows(logits.contiguous())
        return logits.argmax(-1).tolist()

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
