"""Exactness: every greedy decoder reproduces autoregressive output token for token (fp32).

The reference is computed independently of our generate loop: the full sequence is re-run through
transformers' own model without any cache and the argmax taken, token by token.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoders import build_decoder
from decoders.base import StepOutput
from decoders.lookahead import LOOKUP_NGRAM
from decoders.pool import lookup_match
from decoders.tree import Verdict
from harness.runtime.kernels import available_variants
from tiny import TINY_EOS, TINY_VOCAB, tiny_backend

VARIANTS = available_variants()  # every kernel variant this CPU runs (baseline everywhere)


@pytest.fixture(scope="module", params=VARIANTS)
def tiny_each(request, device, tiny):
    """The tiny model on each kernel variant this CPU runs, the default one first (the session's `tiny`): a
    decoder equals `ar` only if the variant's matmuls, norms and attention give a row the same result at
    every step size, so every variant (AVX2 forced on an AVX-512 machine, the baseline build) is checked at
    the decoder level too. On a GPU, only the device's own path (the variants are CPU builds)."""
    if request.param == VARIANTS[0]:
        return tiny
    if device != "cpu":
        pytest.skip("kernel variants are CPU builds")
    return tiny_backend(0, matmul=request.param)


def reference_greedy(model, prompt: list[int], max_new: int, eos: int) -> list[int]:
    seq = list(prompt)
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(max_new):
            nxt = int(model(torch.tensor([seq], device=model.device)).logits[0, -1].argmax())
            out.append(nxt)
            seq.append(nxt)
            if nxt == eos:
                break
    return out


tokens = st.integers(min_value=4, max_value=TINY_VOCAB - 1)  # avoid EOS inside prompts
plain_prompts = st.lists(tokens, min_size=1, max_size=24)
repeating_prompts = st.builds(
    lambda unit, reps, tail: (unit * reps + tail)[:40],
    st.lists(tokens, min_size=2, max_size=6),
    st.integers(2, 6),
    st.lists(tokens, max_size=4),
)
prompts = st.one_of(plain_prompts, repeating_prompts)

decoder_specs = st.one_of(
    st.builds(lambda w: ("jacobi", {"window": w}), st.integers(1, 8)),
    st.builds(lambda m, n, r: ("pld", {"max_ngram": m, "num_pred": n, "recent": r}),
              st.integers(1, 4), st.integers(1, 8), st.booleans()),
    st.builds(
        lambda W, N, G, p, o, c, t, extra, pl, solo: (
            "lookahead",
            {"W": W, "N": N, "G": G, "pool_from_prompt": p, "pool_from_output": o, "pool_context": c,
             "text_ngram": t, "step_tokens": None if extra is None else 2 + W * (N - 1) + extra,
             "prompt_lookup": pl, "solo_root": solo},
        ),
        st.integers(1, 8),
        st.integers(2, 6),
        st.integers(0, 8),
        st.booleans(),
        st.booleans(),
        st.booleans(),
        st.one_of(st.none(), st.integers(2, 10)),  # prompt/output n-gram length apart from N
        st.one_of(st.none(), st.integers(0, 8)),  # tokens per step cap, above its minimum
        st.one_of(st.none(), st.integers(1, 10)),  # prompt lookup's chain, first in the tree
        st.booleans(),  # solo_root: a step with nothing to verify feeds the root alone
    ),
)


def _check_result(res, max_new: int, eos_ids) -> None:
    assert sum(res.accepted) == len(res.tokens)
    assert len(res.accepted) == res.steps == len(res.input_tokens) == len(res.flops)
    assert all(a >= 1 for a in res.accepted)
    assert len(res.tokens) <= max_new
    assert not any(t in eos_ids for t in res.tokens[:-1])  # never past EOS
    assert res.stop_reason == ("eos" if res.tokens and res.tokens[-1] in eos_ids else "max_new_tokens")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts, spec=decoder_specs, max_new=st.integers(1, 40))
def test_greedy_decoders_equal_ar(tiny_each, prompt, spec, max_new):
    name, params = spec
    ar = build_decoder("ar").generate(tiny_each, prompt, max_new)
    res = build_decoder(name, **params).generate(tiny_each, prompt, max_new)
    assert res.tokens == ar.tokens, (name, params, tiny_each.matmul_path)
    _check_result(res, max_new, tiny_each.eos_token_ids)
    _check_result(ar, max_new, tiny_each.eos_token_ids)
    assert ar.steps == len(ar.tokens)  # S = 1 exactly for autoregressive decoding


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts, others=st.lists(prompts, min_size=1, max_size=3), junk=st.lists(tokens, max_size=12),
       t=st.integers(2, 8), cap=st.one_of(st.none(), st.integers(0, 6)), pl=st.one_of(st.none(), st.integers(1, 6)),
       solo=st.booleans(), max_new=st.integers(1, 30))
def test_lookahead_with_a_corpus_equals_ar(tiny_each, prompt, others, junk, t, cap, pl, solo, max_new):
    """pool_from_corpus drafts from other prompts' answers (and from wrong text, as a stale corpus would be);
    the output stays ar's. An answer filed under this very prompt is never drafted from."""
    from decoders.base import token_hash

    ar = build_decoder("ar")
    dec = build_decoder("lookahead", W=1, N=2, G=1, text_ngram=t, step_tokens=None if cap is None else 3 + cap,
                        prompt_lookup=pl, pool_from_output=True, pool_context=True, pool_from_corpus=True,
                        solo_root=solo)
    dec.corpus = {token_hash(o): ar.generate(tiny_each, o, max_new).tokens for o in others}
    dec.corpus[token_hash([1, 2, 3])] = junk
    res = dec.generate(tiny_each, prompt, max_new)
    assert res.tokens == ar.generate(tiny_each, prompt, max_new).tokens
    _check_result(res, max_new, tiny_each.eos_token_ids)


def test_corpus_drafts_only_where_the_text_has_none_and_never_from_this_prompts_answer():
    from decoders.base import token_hash

    dec = build_decoder("lookahead", W=1, N=2, G=1, text_ngram=3, pool_from_corpus=True)
    prompt = [10, 11, 12]
    dec.corpus = {token_hash(prompt): [20, 21, 22, 23], token_hash([1]): [30, 31, 32, 33, 10, 50, 51]}
    state = dec.begin(prompt)
    assert state.corpus.get([20]) == [] and state.corpus.get([30]) == [31, 32]  # its own answer is left out
    assert dec.propose(state, [*prompt, 30]).tree.tokens == [31, 32]  # 30 is nowhere in the text: the corpus
    assert dec.propose(state, [*prompt, 10]).tree.tokens == [11, 12]  # the prompt's own n-gram, not the corpus's
    assert dec.propose(state, [*prompt, 40]).tree.tokens == []  # nothing anywhere


@pytest.mark.parametrize("seed", range(6))
def test_ar_equals_uncached_reference(seed, device):
    be = tiny_backend(seed, device=device)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(4, TINY_VOCAB, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g).tolist()
    ref = reference_greedy(be.model, prompt, 30, TINY_EOS)
    assert build_decoder("ar").generate(be, prompt, 30).tokens == ref


def test_ar_equals_transformers_generate(tiny):
    prompt = [5, 9, 17, 5, 9, 22, 30]
    ours = build_decoder("ar").generate(tiny, prompt, 25).tokens
    out = tiny.model.generate(
        torch.tensor([prompt], device=tiny.device), max_new_tokens=25, do_sample=False, eos_token_id=TINY_EOS, pad_token_id=0
    )
    assert ours == out[0, len(prompt) :].tolist()


def test_lookahead_compresses_repetitive_text(tiny):
    """On a prompt the model continues repetitively, lookahead takes fewer steps than tokens."""
    prompt = [7, 8, 9, 10, 11] * 6
    ar = build_decoder("ar").generate(tiny, prompt, 60)
    la = build_decoder("lookahead", W=5, N=4, G=5, pool_from_prompt=True).generate(tiny, prompt, 60)
    assert la.tokens == ar.tokens
    assert la.steps < ar.steps


def test_bonus_token_emitted_on_full_match(tiny):
    """When a whole draft verifies, the step emits it plus the bonus token (N tokens for lookahead,
    num_pred + 1 for PLD); the official lookahead implementation drops that bonus."""
    base = [7, 8, 9, 10, 11] * 4
    cont = build_decoder("ar").generate(tiny, base, 30).tokens
    assert cont[:20] == [11] * 20  # this model settles into repeating 11 here
    prompt = base + cont[:20]  # so the prompt already holds the n-grams the model will produce
    ref = build_decoder("ar").generate(tiny, prompt, 9)
    la = build_decoder("lookahead", W=1, N=4, G=1, pool_from_prompt=True).generate(tiny, prompt, 9)
    pld = build_decoder("pld", max_ngram=3, num_pred=3).generate(tiny, prompt, 9)
    assert la.tokens == ref.tokens and pld.tokens == ref.tokens
    assert la.accepted[0] == 4 and pld.accepted[0] == 4


def test_long_text_ngrams_and_step_cap(tiny):
    """Prompt n-grams longer than N are verified to their full length; a step cap cuts the draft
    short but never the window, and neither changes the output."""
    base = [7, 8, 9, 10, 11] * 4
    prompt = base + build_decoder("ar").generate(tiny, base, 20).tokens  # holds what comes next
    ref = build_decoder("ar").generate(tiny, prompt, 20)
    long = build_decoder("lookahead", W=1, N=3, G=1, text_ngram=7).generate(tiny, prompt, 20)
    assert long.tokens == ref.tokens and long.accepted[0] == 7  # 6 drafted + the bonus
    capped = build_decoder("lookahead", W=1, N=3, G=2, text_ngram=7, step_tokens=6)
    res = capped.generate(tiny, prompt, 20)
    # first step: root + 1 window token (the window is still filling) + 4 of the draft = 6
    assert res.tokens == ref.tokens and res.accepted[0] == 5
    assert max(res.input_tokens) == 6 == capped.max_step_tokens()


def test_prompt_lookup_chain_contains_recent_plds_draft(tiny):
    """With ``prompt_lookup``, every step's tree holds first the draft of ``pld(recent=True)`` at the same
    suffix length (``LOOKUP_NGRAM``), so a step accepts at least what that pld's step would from the same
    text; the output stays the greedy one."""
    base = [7, 8, 9, 10, 11] * 4
    prompt = base + build_decoder("ar").generate(tiny, base, 20).tokens  # holds what comes next
    ref = build_decoder("ar").generate(tiny, prompt, 20)
    pld = build_decoder("pld", max_ngram=LOOKUP_NGRAM, num_pred=6, recent=True).generate(tiny, prompt, 20)
    # no pool at all (G=0, no prompt pool): the window plus pld's chain
    la = build_decoder("lookahead", W=1, N=2, G=0, pool_from_prompt=False, prompt_lookup=6).generate(tiny, prompt, 20)
    assert la.tokens == pld.tokens == ref.tokens
    assert la.accepted[0] == pld.accepted[0] > 1
    assert la.steps <= pld.steps
    assert build_decoder("lookahead", W=1, N=2, G=0, prompt_lookup=6).max_step_tokens() == 1 + 1 + 6


def test_recency_rule_prefers_the_generated_texts_latest_occurrence():
    """A suffix that occurs in the generated text continues its latest occurrence there; one that occurs
    only in the prompt continues its first occurrence there, as plain pld's does everywhere."""
    prompt = [5, 1, 2, 9, 5, 1, 3]
    seq = prompt + [5, 1, 4, 6, 5, 1, 7, 8, 5, 1]  # "5 1" occurs twice in the prompt, twice in the output
    assert lookup_match(seq, LOOKUP_NGRAM, 3) == (2, [2, 9, 5])  # the first occurrence
    assert lookup_match(seq, LOOKUP_NGRAM, 3, prompt_len=len(prompt)) == (2, [7, 8, 5])  # the output's latest
    only_prompt = prompt + [6, 5, 1]
    assert lookup_match(only_prompt, LOOKUP_NGRAM, 3, prompt_len=len(prompt)) == (2, [2, 9, 5])
    # the longest match wins wherever it is: "9 5 1" occurs in the prompt, "5 1" also in the output
    longer = prompt + [5, 1, 8, 9, 5, 1]
    assert lookup_match(longer, LOOKUP_NGRAM, 3, prompt_len=len(prompt)) == (3, [3, 5, 1])
    dec = build_decoder("lookahead", W=1, N=2, G=0, pool_from_prompt=False, prompt_lookup=3)
    assert dec.propose(dec.begin(prompt), seq).tree.tokens == [7, 8, 5]
    pld = build_decoder("pld", max_ngram=3, num_pred=3)
    assert pld.propose(pld.begin(prompt), seq).tree.tokens == [2, 9, 5]
    recent = build_decoder("pld", max_ngram=3, num_pred=3, recent=True)
    assert recent.propose(recent.begin(prompt), seq).tree.tokens == [7, 8, 5]


def test_capped_prompt_lookup_chain_goes_before_the_window(tiny):
    """Under a cap of pld's own step size, a step with a prompt-lookup match feeds exactly pld's draft
    (the window sits out and its trajectory waits); a step without one feeds the window and the pool."""
    base = [7, 8, 9, 10, 11] * 4
    prompt = base + build_decoder("ar").generate(tiny, base, 20).tokens
    ref = build_decoder("ar").generate(tiny, prompt, 30)
    pld = build_decoder("pld", max_ngram=LOOKUP_NGRAM, num_pred=6).generate(tiny, prompt, 30)
    dec = build_decoder("lookahead", W=2, N=3, G=2, prompt_lookup=6, step_tokens=7)
    state = dec.begin(prompt)
    first = dec.propose(state, list(prompt))
    assert first.window is None and len(first.tree) == 6  # pld's whole draft
    la = dec.generate(tiny, prompt, 30)
    assert la.tokens == pld.tokens == ref.tokens
    assert la.input_tokens[0] == pld.input_tokens[0] == 7 and la.accepted[0] == pld.accepted[0]
    assert max(la.input_tokens) <= 7
    unmatched = dec.begin([3, 4, 5, 6])  # the last token never occurred before: no prompt-lookup draft
    step = dec.propose(unmatched, [3, 4, 5, 6])
    assert step.window is unmatched.window
    levels = [list(lv) for lv in state.window.levels]
    dec.update(state, list(prompt) + [1], StepOutput(Verdict([1], []), [1], []))  # a step without the window
    assert state.window.levels == levels


def test_weak_prompt_lookup_match_ranks_after_the_pool(tiny):
    """A draft matched on the last token alone ranks after the pool's chains and leaves the window in;
    one matched on two or more tokens goes first and, under the cap, feeds alone."""
    dec = build_decoder("lookahead", W=2, N=3, G=2, text_ngram=3, prompt_lookup=5, step_tokens=7)
    weak = [5, 1, 2, 8, 5, 3, 4, 9, 6, 5]  # (6, 5) never occurred: the match is 5 alone
    assert lookup_match(weak, LOOKUP_NGRAM, 5) == (1, [1, 2, 8, 5, 3])
    state = dec.begin(weak)
    step = dec.propose(state, weak)
    assert step.window is state.window and state.window.size == 2  # one level so far: room for 4 nodes
    # the pool's newest n-gram (5, 3, 4) first, then (5, 1, 2); the draft (1, 2, 8, ...) is cut
    assert step.tree.tokens == [3, 4, 1, 2]
    strong = [6, *weak]  # now (6, 5) occurred at the start
    assert lookup_match(strong, LOOKUP_NGRAM, 5) == (2, [1, 2, 8, 5, 3])
    state = dec.begin(strong)
    step = dec.propose(state, strong)  # 1 + 5 + 2 window tokens pass the cap: the window sits out
    assert step.window is None and step.tree.tokens == [1, 2, 8, 5, 3, 3]
    ref = build_decoder("ar").generate(tiny, weak, 24).tokens
    assert dec.generate(tiny, weak, 24).tokens == ref


def test_matched_prompt_lookup_draft_passes_a_smaller_cap(tiny):
    """With the chain, ``step_tokens`` caps the steps without a strong match: a matched draft is fed
    whole (pld's own step, 1 + prompt_lookup tokens) past a smaller cap, a weak one stays within it."""
    dec = build_decoder("lookahead", W=2, N=3, G=2, text_ngram=3, prompt_lookup=8, step_tokens=6)
    assert dec.max_step_tokens() == 9
    strong = [6, 5, 1, 2, 8, 5, 3, 4, 9, 6, 5]
    state = dec.begin(strong)
    step = dec.propose(state, strong)
    assert step.window is None and step.tree.tokens == [1, 2, 8, 5, 3, 4, 9, 6]  # 9 tokens with the root
    weak = strong[1:]  # (6, 5) unmatched: the cap holds, root + 2 window tokens + 3 nodes
    state = dec.begin(weak)
    step = dec.propose(state, weak)
    assert step.window is state.window and step.tree.tokens == [3, 4, 1]
    base = [7, 8, 9, 10, 11] * 4
    prompt = base + build_decoder("ar").generate(tiny, base, 20).tokens
    res = dec.generate(tiny, prompt, 30)
    assert res.tokens == build_decoder("ar").generate(tiny, prompt, 30).tokens
    assert max(res.input_tokens) == dec.max_step_tokens() and res.accepted[0] == 9  # pld's whole step


def test_solo_root_feeds_the_root_alone_where_nothing_is_drafted(tiny):
    """solo_root: a step with no draft feeds 1 token (the window waits), a step with one feeds the window too;
    without solo_root every step feeds the window."""
    prompt = [7, 8, 9, 10, 11] * 4 + [30, 31]
    ar = build_decoder("ar").generate(tiny, prompt, 24).tokens
    shape = dict(W=2, N=3, G=2, pool_from_output=True)
    plain = build_decoder("lookahead", **shape).generate(tiny, prompt, 24)
    solo = build_decoder("lookahead", **shape, solo_root=True).generate(tiny, prompt, 24)
    assert plain.tokens == solo.tokens == ar
    assert 1 not in plain.input_tokens  # the window in every step
    assert 1 in solo.input_tokens and max(solo.input_tokens) > 1 + 2 * (3 - 1)  # alone, and root + window + draft
    # nothing ever drafted (no text pools, and the window waits from the first step): ar's steps exactly
    bare = build_decoder("lookahead", **{**shape, "pool_from_output": False}, pool_from_prompt=False,
                         solo_root=True).generate(tiny, prompt, 24)
    assert bare.tokens == ar and set(bare.input_tokens) == {1} and bare.steps == len(ar)


def test_draft_tree_node_cap():
    from decoders.tree import DraftTree

    chains = [[5, 6, 7], [5, 9], [8]]
    assert DraftTree.from_chains(chains, max_nodes=4).tokens == [5, 6, 7, 9]  # shared 5 is free
    assert DraftTree.from_chains(chains, max_nodes=2).tokens == [5, 6]
    assert DraftTree.from_chains(chains, max_nodes=0).tokens == []


def test_verify_greedy_full_match_and_divergence():
    from decoders.tree import DraftTree, verify_greedy

    tree = DraftTree.from_chains([[5, 6, 7], [5, 9], [8]])
    assert tree.tokens == [5, 6, 7, 9, 8]  # shared prefix 5 merged
    # pred[0] at root, pred[i+1] at node i: root->5, node0(5)->6, node1(6)->7, node2(7)->bonus 30
    v = verify_greedy(tree, [5, 6, 7, 30, 0, 0])
    assert v.tokens == [5, 6, 7, 30] and v.nodes == [0, 1, 2]
    v = verify_greedy(tree, [5, 9, 0, 0, 0, 0])  # second chain via the shared first node
    assert v.tokens == [5, 9, 0] and v.nodes == [0, 3]
    v = verify_greedy(tree, [2, 6, 7, 30, 0, 0])  # nothing matches: the root's argmax alone
    assert v.tokens == [2] and v.nodes == []
