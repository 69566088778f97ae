"""The n-gram pool: per-key cap, newest first, refresh on re-insert, and context ranking; the corpus index."""

from __future__ import annotations

from decoders.pool import CorpusIndex, NgramPool


def test_cap_newest_first_and_refresh():
    pool = NgramPool(3, cap=2)
    pool.add_all([(1, 2, 3), (1, 4, 5), (1, 6, 7)])  # (2, 3) evicted: oldest of a full key
    assert pool.get(1) == [(6, 7), (4, 5)]
    pool.add((1, 4, 5))  # refreshed, becomes newest
    assert pool.get(1) == [(4, 5), (6, 7)]
    assert pool.get(9) == [] and len(pool) == 2


def test_add_from_start_adds_only_later_ngrams():
    pool = NgramPool(2, cap=4)
    pool.add_from([5, 6, 7, 8], start=2)  # n-grams starting at index >= 2: (7, 8)
    assert pool.get(5) == [] and pool.get(6) == [] and pool.get(7) == [(8,)]


def test_add_from_takes_longer_ngrams_than_the_pool_n():
    pool = NgramPool(2, cap=4)
    pool.add_from([5, 6, 7, 8, 9], n=4)  # 4-grams: (5 6 7 8), (6 7 8 9)
    pool.add((5, 1))  # the window's 2-grams share the keys
    assert pool.get(5) == [(1,), (6, 7, 8)] and pool.get(6) == [(7, 8, 9)] and pool.get(7) == []


def test_context_ranks_the_continuation_of_this_phrase_first():
    # "a x p", "b x q", "c x r": key x holds three continuations, newest (r) first without context
    text = [1, 9, 10, 2, 9, 11, 3, 9, 12]
    plain = NgramPool(2, cap=3)
    plain.add_from(text)
    assert plain.get(9, prev=2) == [(12,), (11,), (10,)]
    ranked = NgramPool(2, cap=3, context=True)
    ranked.add_from(text)
    assert ranked.get(9, prev=2) == [(11,), (12,), (10,)]  # what followed "2 9" first, then newest
    assert ranked.get(9, prev=7) == [(12,), (11,), (10,)]  # unseen context: plain order
    assert ranked.get(9) == [(12,), (11,), (10,)]
    ranked.add((9, 13))  # a window n-gram (no known context) only joins the plain index
    assert ranked.get(9, prev=2)[:2] == [(11,), (13,)]


def test_context_lookup_respects_cap():
    pool = NgramPool(2, cap=2, context=True)
    pool.add_from([1, 9, 10, 1, 9, 11, 1, 9, 12])  # context 1 -> 9 holds (11,), (12,) after eviction
    assert pool.get(9, prev=1) == [(12,), (11,)]


def test_corpus_index_takes_the_most_frequent_continuation_of_the_longest_context():
    # after 9: (1 2) twice and (3 4) once; after "5 9": (3 4) only
    texts = [[9, 1, 2, 0], [9, 3, 4, 0, 5, 9, 3, 4], [7, 9, 1, 2]]
    idx = CorpusIndex(texts, length=2)
    assert idx.get([8, 9]) == [1, 2]  # unseen two-token context: the one-token one, most frequent
    assert idx.get([5, 9]) == [3, 4]  # the two-token context wins over the more frequent one-token one
    assert idx.get([9]) == [1, 2]
    assert idx.get([6]) == [] and idx.get([2]) == []  # never seen; seen only without a whole continuation after
    tie = CorpusIndex([[9, 5, 6], [9, 7, 8]], length=2)
    assert tie.get([9]) == [5, 6]  # a tie goes to the first seen
    assert CorpusIndex([], length=3).get([1, 2]) == []
