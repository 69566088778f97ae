"""The names ``harness.perf`` gives the methods it times, and the markers ``harness.analysis.perf_targets``
finds them by, in one place: the result files store these names, so a row renamed on one side only would
drop out of the target table silently. It lives with the analysis, which must not import the perf runner
(torch); the runner imports it. (`ar`'s row is named by ``harness.analysis.compare.REFERENCE``, which the
speedups pair with.)"""

from __future__ import annotations

GENERATE = "transformers greedy"  # transformers' own greedy `generate` on the same model
PLD = "pld("  # every pld row's name starts so
RECENT = "recent=True"  # in a pld row's name where it has the recency rule (`--pld M,N,recent`)
AUTO = "lookahead auto("  # the auto-tuned lookahead's rows; its shape label follows
CORPUS = "+corpus"  # ends the name of the auto-tuned row that also drafts from the held-out answers


def pld_name(max_ngram: int, num_pred: int, recent: bool) -> str:
    """``pld(max_ngram=6,num_pred=10)``, with ``,recent=True`` for the recency rule."""
    return f"{PLD}max_ngram={max_ngram},num_pred={num_pred}{',' + RECENT if recent else ''})"


def auto_name(shape_label: str, corpus: bool) -> str:
    """``lookahead auto(1,2,1,t7,cap6,pl5)+pools``, ``...+pools+corpus`` with the corpus.
    ``shape_label``: :func:`decoders.lookahead.shape_label`'s ``(...)``."""
    assert shape_label.startswith("("), shape_label
    return f"{AUTO}{shape_label[1:]}+pools{CORPUS if corpus else ''}"
