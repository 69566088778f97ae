"""The regression suite: the pinned prompts and decoder configurations, and running them on a backend."""

from __future__ import annotations

import hashlib
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.jobs import measure
from harness.records import compression
from harness.runtime.kernels import cpu_identity, cpu_line

if TYPE_CHECKING:
    from decoders.base import Decoder
    from harness.runtime.backend import Backend

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BASELINE = REPO_ROOT / "results" / "regression" / "baseline.json"
MODEL = "smollm2"
DTYPE = "float32"
MAX_NEW_TOKENS = 48
# (task, example id): two records per task, turn 1 only; ids are stable across dataset row order
PINNED_PROMPTS: tuple[tuple[str, str], ...] = (
    ("humaneval", "HumanEval/0"),
    ("humaneval", "HumanEval/2"),
    ("gsm8k", "0"),
    ("gsm8k", "1"),
    ("mt_bench", "81"),
    ("mt_bench", "82"),
)


@dataclass(frozen=True)
class SuiteConfig:
    """One decoder configuration of the suite; ``label`` is its key in the baseline."""

    label: str
    decoder: str
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, label: str, decoder: str, **params: Any) -> SuiteConfig:
        return cls(label, decoder, tuple(sorted(params.items())))

    def build(self) -> Decoder:
        from decoders import build_decoder

        return build_decoder(self.decoder, **dict(self.params))


@dataclass(frozen=True)
class SuitePrompt:
    """A pre-encoded prompt: tests pass synthetic token lists, the CLI encodes the pinned records."""

    task: str
    id: str
    token_ids: tuple[int, ...]

    @property
    def token_hash(self) -> str:
        """Detects a changed prompt (tokenizer, chat template or dataset edit) under the same id."""
        return hashlib.sha1(",".join(map(str, self.token_ids)).encode()).hexdigest()[:16]


def suite_configs() -> list[SuiteConfig]:
    """The guarded configurations; lookahead labels use the paper's (N, W, G) order."""
    return [
        SuiteConfig.of("ar", "ar"),
        SuiteConfig.of("jacobi(window=5)", "jacobi", window=5),
        SuiteConfig.of("pld(defaults)", "pld"),
        SuiteConfig.of("pld(recent=True)", "pld", recent=True),  # the recency rule lookahead's chain uses
        SuiteConfig.of("lookahead(N=5,W=7,G=7)", "lookahead", N=5, W=7, G=7, pool_from_prompt=False),
        SuiteConfig.of("lookahead(N=5,W=15,G=15)+prompt", "lookahead", N=5, W=15, G=15, pool_from_prompt=True),
        SuiteConfig.of("lookahead(N=5,W=1,G=1)+prompt+output+context", "lookahead", N=5, W=1, G=1,
                       pool_from_prompt=True, pool_from_output=True, pool_context=True),
        SuiteConfig.of("lookahead(N=3,W=1,G=3,text_ngram=7,step_tokens=8)+prompt+output+context", "lookahead",
                       N=3, W=1, G=3, pool_from_prompt=True, pool_from_output=True, pool_context=True,
                       text_ngram=7, step_tokens=8),
        # the tuner's shape for code on a CPU: prompt lookup's chain first on a match, the window otherwise
        SuiteConfig.of("lookahead(N=2,W=1,G=1,text_ngram=7,step_tokens=11,prompt_lookup=10)+prompt+output+context",
                       "lookahead", N=2, W=1, G=1, pool_from_prompt=True, pool_from_output=True, pool_context=True,
                       text_ngram=7, step_tokens=11, prompt_lookup=10),
        # the same, also drafting from the greedy answers to the suite's other prompts (see corpus_answers)
        SuiteConfig.of("lookahead(N=2,W=1,G=1,text_ngram=7,step_tokens=11,prompt_lookup=10)+prompt+output+context"
                       "+corpus", "lookahead", N=2, W=1, G=1, pool_from_prompt=True, pool_from_output=True,
                       pool_context=True, text_ngram=7, step_tokens=11, prompt_lookup=10, pool_from_corpus=True),
    ]


def load_prompts(
    tokenizer: Any, data_dir: Path, pinned: Sequence[tuple[str, str]] = PINNED_PROMPTS
) -> list[SuitePrompt]:
    """Encode the pinned records' first-turn prompts, in ``pinned`` order; an unknown id raises."""
    from tasks import build_task, encode_prompt

    by_task: dict[str, dict[str, Any]] = {}
    prompts = []
    for task_name, ex_id in pinned:
        if task_name not in by_task:
            task = build_task(task_name, data_dir=str(data_dir))
            by_task[task_name] = {"task": task, "examples": {ex.id: ex for ex in task.examples()}}
        entry = by_task[task_name]
        ex = entry["examples"].get(ex_id)
        if ex is None:
            raise ValueError(f"pinned prompt {task_name}:{ex_id} not found in {data_dir}")
        ids = encode_prompt(entry["task"].prompt(ex, 0, []), tokenizer)
        prompts.append(SuitePrompt(task_name, ex_id, tuple(ids)))
    return prompts


def corpus_answers(backend: Backend, prompts: Sequence[SuitePrompt], max_new_tokens: int) -> dict[str, list[int]]:
    """``ar``'s answers to every prompt of the suite, keyed as ``LookaheadDecoder.corpus`` expects. A
    ``pool_from_corpus`` config drafts from them; the decoder never uses a prompt's own answer, so each
    prompt drafts from the other prompts' answers, as a tuned decoder drafts from its held-out prompts'."""
    from decoders import build_decoder
    from decoders.base import token_hash

    ar = build_decoder("ar")
    return {token_hash(list(p.token_ids)): ar.generate(backend, list(p.token_ids), max_new_tokens).tokens
            for p in prompts}


def run_suite(
    backend: Backend,
    prompts: Sequence[SuitePrompt],
    configs: Sequence[SuiteConfig],
    max_new_tokens: int,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Decode every prompt with every config; results in the baseline's layout (no environment meta).

    Layout: ``{"max_new_tokens", "prompts": [{task, id, prompt_tokens, prompt_hash}], "configs":
    {label: {decoder, params, tasks: {task: {tokens, steps, S, prompts: {id: {tokens, steps, S,
    output_hash}}}}}}}``; ``params`` are the decoder's resolved parameters, defaults included.
    """
    out: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "prompts": [
            {"task": p.task, "id": p.id, "prompt_tokens": len(p.token_ids), "prompt_hash": p.token_hash}
            for p in prompts
        ],
        "configs": {},
    }
    from decoders.base import token_hash

    corpus = None  # ar's answers: from the ar config where it ran first, else decoded for the corpus config
    for cfg in configs:
        dec = cfg.build()
        if dict(cfg.params).get("pool_from_corpus"):
            corpus = corpus if corpus is not None else corpus_answers(backend, prompts, max_new_tokens)
            dec.corpus = corpus
        answers: dict[str, list[int]] = {}
        t0 = time.perf_counter()
        tasks: dict[str, Any] = {}
        for p in prompts:
            res, m = measure(dec, backend, list(p.token_ids), max_new_tokens)
            answers[token_hash(list(p.token_ids))] = res.tokens
            agg = tasks.setdefault(p.task, {"tokens": 0, "steps": 0, "S": 0.0, "prompts": {}})
            agg["prompts"][p.id] = {
                "tokens": m["new_tokens"], "steps": m["steps"], "S": round(res.compression, 6),
                "output_hash": m["output_hash"],
            }
            agg["tokens"] += m["new_tokens"]
            agg["steps"] += m["steps"]
        for agg in tasks.values():
            agg["S"] = round(compression(agg["tokens"], agg["steps"]), 6)
        out["configs"][cfg.label] = {"decoder": cfg.decoder, "params": dict(dec.params), "tasks": tasks}
        if cfg.decoder == "ar" and corpus is None:
            corpus = answers
        if log is not None:
            log(f"  {cfg.label:<48} {len(prompts)} prompts in {time.perf_counter() - t0:6.1f}s")
    return out


def environment(backend: Backend, model: str, dtype: str) -> dict[str, Any]:
    """What the baseline's numbers depend on besides the code: model, dtype, numeric stack."""
    import torch
    import transformers

    return {
        "model": model,
        "dtype": dtype,
        "device": str(backend.device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": cpu_line(cpu_identity()),
        "matmul_path": backend.matmul_path,
        "attention_path": backend.attention_path,
    }
