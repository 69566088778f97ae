"""Sampling mode: every decoder samples exactly the autoregressive distribution.

The proof is statistical and deterministic (fixed seeds, so it never flakes):

- the joint distribution of the first two generated tokens of every decoder (jacobi, pld, lookahead in
  three configurations) is compared by a chi-square goodness-of-fit test with the EXACT model
  distribution, enumerated with transformers' own uncached forward and ``target_probs``; a small-vocab
  tiny model keeps the joint table small, and the prompt is chosen so that drafts are proposed, accepted
  and rejected often (asserted, otherwise the test would prove nothing);
- the same test run on decoders whose verifier is deliberately biased must fail (power);
- ``verify_sampling`` is tested alone on hand-made trees with known probabilities, with its own power check;
- reproducibility, the greedy limits (temperature -> 0, top_k = 1, top_p -> 0) and the ``target_probs``
  warp are tested directly.

Thresholds: p > 1e-3 for "same distribution", p < 1e-6 for "bias detected".
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from decoders import DECODERS, build_decoder
from decoders.base import Decoder
from decoders.sampling import SamplingParams, target_probs
from decoders.tree import DraftTree, Verdict, verify_sampling
from harness.runtime.backend import Backend
from tiny import tiny_model

SAME = 1e-3  # p-value above which a distribution counts as matching
DETECTED = 1e-6  # p-value below which a bias counts as detected

# ---- the small model and prompt of the statistical tests --------------------------------------------------
V = 8  # vocabulary: 8 x 8 joint table for two tokens (EOS = 3 is in it)
MODEL_SEED = 2
HEAD_SCALE = 0.67  # lower output scale: at temperature 1 the joint distribution is spread out
# Chosen (from a search over random prompts) so that the model puts ~0.6 on the drafted token 6:
# jacobi guesses the last token (6 6 6), PLD matches "6 6" to the same draft 6 6 6, and the prompt's
# trigram pool gives lookahead two root candidates, 7 (tried first, p ~ 0.02) and 6, with 6 -> {7, 6}.
PROMPT = [7, 7, 6, 6, 6, 6, 6, 6, 7, 5, 6, 6]
N_SAMPLES = 600  # generations per (decoder, setting); each is ~2-4 ms

SETTINGS = {
    "t1": {"temperature": 1.0},
    "t1-topk-topp": {"temperature": 1.0, "top_k": 5, "top_p": 0.9},
}
SPECULATIVE = {
    "jacobi": ("jacobi", {"window": 3}),
    "pld": ("pld", {"max_ngram": 2, "num_pred": 3}),
    "la-3-3-3-prompt": ("lookahead", {"W": 3, "N": 3, "G": 3, "pool_from_prompt": True}),
    "la-2-4-2-prompt": ("lookahead", {"W": 2, "N": 4, "G": 2, "pool_from_prompt": True}),
    # no prompt pool: step 1 has no draft, step 2 verifies the window's harvested bigrams
    "la-4-2-4-window": ("lookahead", {"W": 4, "N": 2, "G": 4, "pool_from_prompt": False}),
    # prompt lookup's chain ranked before the pool's
    "la-1-3-2-lookup": ("lookahead", {"W": 1, "N": 3, "G": 2, "pool_from_prompt": True, "prompt_lookup": 3}),
    # capped at 4 tokens: a 3-token chain beside the window would be 5 or 6, so the window sits out
    "la-1-3-2-lookup-cap": ("lookahead", {"W": 1, "N": 3, "G": 2, "pool_from_prompt": True, "prompt_lookup": 3,
                                          "step_tokens": 4}),
    # a 4-token chain passes that cap (5 tokens, pld's step); steps without a strong match stay within it
    "la-1-3-2-lookup-past-cap": ("lookahead", {"W": 1, "N": 3, "G": 2, "pool_from_prompt": True,
                                               "prompt_lookup": 4, "step_tokens": 4}),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One intra-op thread: the tiny forwards are dispatch-bound, and on a busy machine OpenMP threads
    make each generation ~50x slower (3 ms -> 200 ms measured on 2 shared cores)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def small(device: str) -> Backend:
    model = tiny_model(MODEL_SEED, vocab=V)
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    return Backend(model.to(device), tokenizer=None, name=f"tiny-v{V}", attn="sdpa")


def exact_first_two(backend: Backend, prompt: list[int], params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(first two generated tokens) by enumeration with transformers' uncached forward (EOS ends early)."""
    model = backend.model
    with torch.inference_mode():
        p1 = target_probs(model(torch.tensor([prompt], device=model.device)).logits[0, -1], params).cpu()  # [V]
        p2 = target_probs(model(torch.tensor([prompt + [a] for a in range(V)], device=model.device)).logits[:, -1],
                          params).cpu()  # [V, V]
    out: dict[tuple[int, ...], float] = {}
    for a in range(V):
        if a in backend.eos_token_ids:
            out[(a,)] = float(p1[a])
        else:
            for b in range(V):
                out[(a, b)] = float(p1[a] * p2[a, b])
    assert abs(sum(out.values()) - 1.0) < 1e-9
    return out


def gof_pvalue(counts: Counter, exact: dict) -> float:
    """Chi-square goodness of fit of ``counts`` to the probabilities ``exact``.

    An outcome of probability 0 that was observed gives p = 0. Cells expecting fewer than 5 are pooled
    (the pool joins the smallest regular cell when it expects fewer than 5 itself).
    """
    n = sum(counts.values())
    if any(exact.get(k, 0.0) <= 0.0 for k in counts):
        return 0.0
    cells = sorted((k for k in exact if exact[k] > 0.0), key=exact.get, reverse=True)
    obs: list[float] = []
    exp: list[float] = []
    rest_obs = rest_exp = 0.0
    for k in cells:
        e = exact[k] * n
        if e >= 5.0:
            obs.append(counts.get(k, 0))
            exp.append(e)
        else:
            rest_obs += counts.get(k, 0)
            rest_exp += e
    if rest_exp >= 5.0 or not obs:
        obs.append(rest_obs)
        exp.append(rest_exp)
    elif rest_exp > 0.0:
        obs[-1] += rest_obs
        exp[-1] += rest_exp
    if len(obs) < 2:
        return 1.0
    total = sum(exp)
    exp = [e * n / total for e in exp]
    return float(chisquare(obs, exp).pvalue)


# ---- test-local decoders: step recording and a substituted verifier (Decoder.verify) ---------------------------------------
def make_decoder(name: str, params: dict, verifier=None) -> Decoder:
    """A decoder that logs, per generation, [draft nodes, accepted nodes] for each step.

    Accepted nodes are read from the untruncated verdict (``update``), so a draft accepted in the last
    step counts even though max_new_tokens cut it off; None means the step ended on EOS.
    """
    base = DECODERS[name]

    class Recording(base):  # type: ignore[misc, valid-type]
        def begin(self, prompt_ids):
            self.log.append([])
            return super().begin(prompt_ids)

        def propose(self, state, seq):
            prop = super().propose(state, seq)
            self.log[-1].append([len(prop.tree), None])
            return prop

        def update(self, state, seq, out):
            self.log[-1][-1][1] = len(out.verdict.nodes)
            super().update(state, seq, out)

    if verifier is not None:

        def verify(self, tree, logits, pred, sampling, gen):
            return verifier(tree, logits, sampling, gen)

        Recording.verify = verify
    dec = Recording(**params)
    dec.log = []
    return dec


def sample_first_two(dec: Decoder, backend: Backend, setting: dict, seed0: int = 0, n: int = N_SAMPLES) -> Counter:
    """Counts of the first two generated tokens over seeds seed0 .. seed0 + n - 1."""
    seeds = range(seed0, seed0 + n)
    return Counter(tuple(dec.generate(backend, PROMPT, 2, seed=s, **setting).tokens) for s in seeds)


def draft_usage(log: list) -> tuple[float, float]:
    """(fraction of generations that accepted a draft, fraction that rejected every draft of some step)."""
    acc = sum(any(a is not None and a > 0 for _, a in run) for run in log)
    rej = sum(any(d > 0 and a == 0 for d, a in run) for run in log)
    return acc / len(log), rej / len(log)


# ---- biased verifiers (what a wrong implementation would do) --------------------------------------------
def _bonus(p: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(p.float(), 1, generator=gen))


def verify_accept_all(tree, logits, params, gen):
    """Takes the first child at every node on faith, then samples the bonus."""
    nodes, tokens, at = [], [], -1
    while tree.children[at + 1]:
        tok, child = next(iter(tree.children[at + 1].items()))
        tokens.append(tok)
        nodes.append(child)
        at = child
    tokens.append(_bonus(target_probs(logits[at + 1], params), gen))
    return Verdict(tokens, nodes)


def verify_residual_not_zeroed(tree, logits, params, gen):
    """Accepts child x with probability p(x) but, all rejected, samples the bonus from p itself."""
    nodes, tokens, at = [], [], -1
    while True:
        p = target_probs(logits[at + 1], params)
        for tok, child in tree.children[at + 1].items():
            if torch.rand((), generator=gen, dtype=torch.float64) < p[tok]:
                tokens.append(tok)
                nodes.append(child)
                at = child
                break
        else:
            tokens.append(_bonus(p, gen))
            return Verdict(tokens, nodes)


def verify_no_renormalise(tree, logits, params, gen):
    """Zeroes rejected children but tests later children against the un-renormalised p."""
    nodes, tokens, at = [], [], -1
    while True:
        p = target_probs(logits[at + 1], params)
        for tok, child in tree.children[at + 1].items():
            if torch.rand((), generator=gen, dtype=torch.float64) < p[tok]:
                tokens.append(tok)
                nodes.append(child)
                at = child
                break
            p[tok] = 0.0
        else:
            tokens.append(_bonus(p / p.sum(), gen))
            return Verdict(tokens, nodes)


def verify_stale_row(tree, logits, params, gen):
    """Correct accept/reject, but every draw uses the ROOT's row (an off-by-one in the logits rows)."""
    nodes, tokens, at = [], [], -1
    while True:
        p = target_probs(logits[0], params)
        for tok, child in tree.children[at + 1].items():
            if torch.rand((), generator=gen, dtype=torch.float64) < p[tok]:
                tokens.append(tok)
                nodes.append(child)
                at = child
                break
            p[tok] = 0.0
            p = p / p.sum()
        else:
            tokens.append(_bonus(p, gen))
            return Verdict(tokens, nodes)


# ---- 1. every decoder samples the exact model distribution ------------------------------------------------
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_ar_matches_exact_distribution(small, setting):
    """Sanity of the reference: plain autoregressive sampling fits the enumerated distribution."""
    params = SETTINGS[setting]
    exact = exact_first_two(small, PROMPT, SamplingParams(**params))
    counts = sample_first_two(build_decoder("ar"), small, params)
    assert gof_pvalue(counts, exact) > SAME


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("spec", list(SPECULATIVE))
def test_speculative_sampling_matches_exact_distribution(small, spec, setting):
    name, dparams = SPECULATIVE[spec]
    params = SETTINGS[setting]
    exact = exact_first_two(small, PROMPT, SamplingParams(**params))
    dec = make_decoder(name, dparams)
    counts = sample_first_two(dec, small, params, seed0=1000 * (1 + list(SPECULATIVE).index(spec)))
    p = gof_pvalue(counts, exact)
    accepted, rejected = draft_usage(dec.log)
    # the verification path must really have been exercised, both ways
    assert accepted >= 0.15, f"{spec}: drafts accepted in only {accepted:.0%} of generations"
    assert rejected >= 0.05, f"{spec}: drafts fully rejected in only {rejected:.0%} of generations"
    assert p > SAME, (spec, setting, p, counts.most_common(8))


def test_lookahead_tries_several_candidates(small):
    """The lookahead configurations really verify a multi-candidate tree (renormalisation path)."""
    dec = make_decoder("lookahead", {"W": 3, "N": 3, "G": 3, "pool_from_prompt": True})
    prop = dec.propose(dec.begin(PROMPT), PROMPT)
    assert list(prop.tree.children[0]) == [7, 6]  # 7 is tried (and mostly rejected) before 6
    assert len(prop.tree.children[prop.tree.children[0][6] + 1]) == 2


# ---- 2. power: a biased verifier is detected by the same test ---------------------------------------------
@pytest.mark.parametrize(
    "verifier", [verify_accept_all, verify_residual_not_zeroed, verify_stale_row], ids=lambda f: f.__name__
)
def test_biased_verifier_is_detected(small, verifier):
    params = SETTINGS["t1"]
    exact = exact_first_two(small, PROMPT, SamplingParams(**params))
    dec = make_decoder("lookahead", SPECULATIVE["la-3-3-3-prompt"][1], verifier=verifier)
    p = gof_pvalue(sample_first_two(dec, small, params), exact)
    assert p < DETECTED, (verifier.__name__, p)


def test_injection_seam_is_the_production_step(small):
    """Positive control: injecting the real verify_sampling changes nothing, token for token."""
    name, dparams = SPECULATIVE["la-3-3-3-prompt"]
    plain = build_decoder(name, **dparams)
    injected = make_decoder(name, dparams, verifier=verify_sampling)
    for seed in range(20):
        a = plain.generate(small, PROMPT, 8, temperature=1.0, seed=seed)
        b = injected.generate(small, PROMPT, 8, temperature=1.0, seed=seed)
        assert a.tokens == b.tokens and a.accepted == b.accepted


# ---- 3. reproducibility -----------------------------------------------------------------------------------
ALL_DECODERS = {"ar": ("ar", {}), **SPECULATIVE}


@pytest.mark.parametrize("spec", list(ALL_DECODERS))
def test_same_seed_same_output(small, spec):
    name, dparams = ALL_DECODERS[spec]
    dec = build_decoder(name, **dparams)
    kw = {"temperature": 1.0, "top_k": 6, "top_p": 0.95}
    runs = [dec.generate(small, PROMPT, 12, seed=s, **kw) for s in (11, 12, 11, 12)]
    assert runs[0].tokens == runs[2].tokens and runs[0].accepted == runs[2].accepted
    assert runs[1].tokens == runs[3].tokens and runs[1].accepted == runs[3].accepted
    again = build_decoder(name, **dparams).generate(small, PROMPT, 12, seed=11, **kw)  # a fresh instance
    assert again.tokens == runs[0].tokens
    distinct = {tuple(dec.generate(small, PROMPT, 12, seed=s, **kw).tokens) for s in range(8)}
    assert len(distinct) >= 4, f"{spec}: 8 seeds gave only {len(distinct)} distinct outputs"


@pytest.mark.parametrize("spec", list(ALL_DECODERS))
def test_greedy_ignores_seed(small, spec):
    name, dparams = ALL_DECODERS[spec]
    ref = build_decoder("ar").generate(small, PROMPT, 12).tokens
    for seed in (None, 0, 7):
        assert build_decoder(name, **dparams).generate(small, PROMPT, 12, seed=seed, top_k=3).tokens == ref


# ---- 4. greedy limits, on the 48-token tiny model (well-separated logits) -------------------------------
GREEDY_LIMITS = {
    "tiny-temperature": {"temperature": 1e-4},
    "top_k-1": {"temperature": 1.0, "top_k": 1},
    "top_p-1e-6": {"temperature": 1.0, "top_p": 1e-6},
    "top_k-1-hot": {"temperature": 5.0, "top_k": 1, "top_p": 0.5},
}
EDGE_DECODERS = {
    "ar": ("ar", {}),
    "jacobi": ("jacobi", {"window": 4}),
    "pld": ("pld", {"max_ngram": 3, "num_pred": 5}),
    "lookahead": ("lookahead", {"W": 4, "N": 4, "G": 4, "pool_from_prompt": True}),
    "lookahead-nopool": ("lookahead", {"W": 3, "N": 3, "G": 2, "pool_from_prompt": False}),
}
EDGE_PROMPTS = ([7, 8, 9, 10, 11] * 6, [5, 9, 17, 5, 9, 22, 30])


@pytest.mark.parametrize("limit", list(GREEDY_LIMITS))
@pytest.mark.parametrize("spec", list(EDGE_DECODERS))
def test_greedy_limits(tiny, spec, limit):
    name, dparams = EDGE_DECODERS[spec]
    dec = build_decoder(name, **dparams)
    for prompt in EDGE_PROMPTS:
        ref = build_decoder("ar").generate(tiny, prompt, 16)
        for seed in (0, 1):
            res = dec.generate(tiny, prompt, 16, seed=seed, **GREEDY_LIMITS[limit])
            assert res.tokens == ref.tokens, (spec, limit, prompt, seed)


def test_greedy_limits_exercise_drafts(tiny):
    """On the repetitive prompt the speculative decoders accept drafts in the greedy limit (steps < tokens)."""
    for spec in ("jacobi", "pld", "lookahead"):
        name, dparams = EDGE_DECODERS[spec]
        res = build_decoder(name, **dparams).generate(tiny, EDGE_PROMPTS[0], 16, temperature=1e-4, seed=0)
        assert res.steps < len(res.tokens), spec


# ---- 5. verify_sampling alone, on hand-made trees with known probabilities --------------------------------
def _row(probs: list[float]) -> torch.Tensor:
    t = torch.tensor(probs, dtype=torch.float64)
    return torch.where(t > 0, t.log(), torch.full_like(t, float("-inf"))).float()


ROOT = [0.05, 0.10, 0.50, 0.20, 0.15, 0.0]
ROWS = {  # next-token distribution after each draft token (used for the node rows)
    0: [0.3, 0.3, 0.1, 0.1, 0.1, 0.1],
    1: [0.1, 0.2, 0.3, 0.4, 0.0, 0.0],
    2: [0.6, 0.1, 0.1, 0.1, 0.05, 0.05],
    3: [0.2, 0.2, 0.2, 0.2, 0.1, 0.1],
    4: [0.05, 0.45, 0.1, 0.1, 0.1, 0.2],
    5: [1 / 6] * 6,
}
TREES = {
    "high-p-child": [[2]],
    "low-p-child": [[1, 3]],
    "three-children-one-impossible": [[4, 1], [2, 0], [5]],
    "no-draft": [],
}
N_VERIFY = 4000


def _tree_logits(tree: DraftTree) -> torch.Tensor:
    return torch.stack([_row(ROOT)] + [_row(ROWS[tok]) for tok in tree.tokens])


def _run_verifier(verifier, chains, n=N_VERIFY):
    """Counts of the first emitted token, and of the second one per accepted first child."""
    tree = DraftTree.from_chains(chains)
    logits = _tree_logits(tree)
    params = SamplingParams(temperature=1.0)
    first: Counter = Counter()
    second: dict[int, Counter] = {}
    for seed in range(n):
        v = verifier(tree, logits, params, torch.Generator().manual_seed(seed))
        assert len(v.tokens) == len(v.nodes) + 1
        assert [tree.tokens[i] for i in v.nodes] == v.tokens[: len(v.nodes)]
        first[v.tokens[0]] += 1
        if v.nodes:
            second.setdefault(v.tokens[0], Counter())[v.tokens[1]] += 1
    return tree, first, second


def _dist(probs: list[float]) -> dict:
    return {i: p for i, p in enumerate(probs)}


@pytest.mark.parametrize("case", list(TREES))
def test_verify_sampling_emits_target_distribution(case):
    tree, first, second = _run_verifier(verify_sampling, TREES[case])
    assert gof_pvalue(first, _dist(ROOT)) > SAME
    assert first[5] == 0  # an impossible draft is never accepted
    kids = tree.children[0]
    assert set(second) == {t for t in kids if ROOT[t] > 0}  # a drafted first token is always the accepted child
    for tok, counts in second.items():
        assert gof_pvalue(counts, _dist(ROWS[tok])) > SAME, (case, tok)
    if case == "high-p-child":
        assert abs(first[2] / N_VERIFY - 0.5) < 0.03


@pytest.mark.parametrize(
    "verifier, case",
    [
        (verify_accept_all, "low-p-child"),
        (verify_residual_not_zeroed, "low-p-child"),
        (verify_no_renormalise, "three-children-one-impossible"),
        (verify_stale_row, "high-p-child"),
    ],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_verify_sampling_power(verifier, case):
    _, first, second = _run_verifier(verifier, TREES[case])
    pvals = [gof_pvalue(first, _dist(ROOT))]
    pvals += [gof_pvalue(c, _dist(ROWS[t])) for t, c in second.items()]
    assert min(pvals) < DETECTED, (verifier.__name__, pvals)


def test_verify_sampling_uses_cpu_draws_for_any_logits_device():
    """The draws come from the CPU generator whatever device the logits are on (CUDA when available)."""
    tree = DraftTree.from_chains(TREES["three-children-one-impossible"])
    logits = _tree_logits(tree)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for seed in range(50):
        outs = {
            dev: verify_sampling(tree, logits.to(dev), SamplingParams(1.0), torch.Generator().manual_seed(seed))
            for dev in devices
        }
        assert len({(tuple(v.tokens), tuple(v.nodes)) for v in outs.values()}) == 1


# ---- target_probs -------------------------------------------------------------------------------------------
def _support(p: torch.Tensor) -> set[int]:
    return set(torch.nonzero(p > 0).flatten().tolist())


def test_target_probs_temperature():
    logits = torch.randn(3, 17, generator=torch.Generator().manual_seed(0))
    for t in (0.3, 1.0, 2.5):
        p = target_probs(logits, SamplingParams(t))
        assert p.dtype == torch.float64
        torch.testing.assert_close(p, (logits.double() / t).softmax(-1))
        torch.testing.assert_close(p.sum(-1), torch.ones(3, dtype=torch.float64))


def test_target_probs_top_k_keeps_k():
    logits = torch.randperm(20, generator=torch.Generator().manual_seed(1)).float() / 3  # distinct
    full = target_probs(logits, SamplingParams(1.0))
    for k in range(1, 21):
        p = target_probs(logits, SamplingParams(1.0, top_k=k))
        keep = set(torch.topk(logits, k).indices.tolist())
        assert _support(p) == keep
        idx = sorted(keep)
        torch.testing.assert_close(p[idx], full[idx] / full[idx].sum())
    assert torch.equal(target_probs(logits, SamplingParams(1.0, top_k=50)), full)  # k >= vocab: off


def test_target_probs_top_p_by_hand():
    probs = [0.05, 0.30, 0.15, 0.50]  # sorted: 0.50 (3), 0.30 (1), 0.15 (2), 0.05 (0)
    logits = torch.tensor(probs, dtype=torch.float64).log().float()
    cases = [(1e-6, {3}), (0.45, {3}), (0.55, {3, 1}), (0.79, {3, 1}), (0.81, {3, 1, 2}), (0.96, {0, 1, 2, 3})]
    for top_p, keep in cases:
        assert _support(target_probs(logits, SamplingParams(1.0, top_p=top_p))) == keep, top_p


def test_target_probs_top_k_before_top_p():
    """Top-p is applied to the renormalised top-k distribution (transformers' warper order)."""
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64).log().float()
    # top-3 renormalised: 0.444, 0.333, 0.222 -> top_p 0.75 needs two (without top-k it would need three)
    assert _support(target_probs(logits, SamplingParams(1.0, top_k=3, top_p=0.75))) == {0, 1}
    assert _support(target_probs(logits, SamplingParams(1.0, top_p=0.75))) == {0, 1, 2}


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    ints=st.lists(st.integers(-60, 60), min_size=1, max_size=30, unique=True),
    top_p=st.floats(1e-6, 1.0),
    temperature=st.floats(0.2, 3.0),
)
def test_target_probs_top_p_smallest_set(ints, top_p, temperature):
    logits = torch.tensor(ints, dtype=torch.float32) / 10
    full = (logits.double() / temperature).softmax(-1)
    p = target_probs(logits, SamplingParams(temperature, top_p=top_p))
    keep = _support(p)
    order = torch.argsort(full, descending=True).tolist()
    assert keep == set(order[: len(keep)])  # the most likely tokens, the top one always
    mass = float(full[sorted(keep)].sum())
    smallest = float(full[order[len(keep) - 1]])
    assert mass >= top_p - 1e-9  # enough mass ...
    assert mass - smallest < top_p + 1e-9  # ... and no smaller set has it
    idx = sorted(keep)
    torch.testing.assert_close(p[idx], full[idx] / mass)


def test_target_probs_matches_transformers_warpers():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    gen = torch.Generator().manual_seed(3)
    for _ in range(40):
        logits = torch.randn(1, 32, generator=gen) * 3
        t = float(torch.empty(()).uniform_(0.3, 2.0, generator=gen))
        k = int(torch.randint(0, 33, (), generator=gen))
        top_p = float(torch.empty(()).uniform_(0.05, 1.0, generator=gen))
        scores = TemperatureLogitsWarper(t)(None, logits.clone())
        if k:
            scores = TopKLogitsWarper(k)(None, scores)
        scores = TopPLogitsWarper(top_p)(None, scores)
        ours = target_probs(logits[0], SamplingParams(t, top_k=k, top_p=top_p))
        torch.testing.assert_close(ours.float(), scores[0].softmax(-1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_sampling_params_validation(kw, word):
    with pytest.raises(ValueError, match=word):
        SamplingParams(**kw)
