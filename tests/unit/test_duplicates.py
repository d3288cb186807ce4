"""Duplicate transaction ids split in two: the initiator's pass that marks repeats (``FirstOccurrences``)
and the controller's decision on the held repeats (``keep_first``). The whole rule, with validation in
between, is checked against the reference model in ``test_validation``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from shared.errors import FileRefused
from shared.rules.duplicates import MAX_ROWS, FirstOccurrences, keep_first


def repeats(first: FirstOccurrences, ids: list[str | None], start: int) -> list[int]:
    rows = np.arange(start, start + len(ids), dtype=np.int64)
    return first.repeat_of(pa.array(ids, pa.string()), rows).tolist()


@pytest.mark.parametrize("run_ids", [1 << 20, 150], ids=["merged-runs", "capped-runs"])
def test_each_repeat_names_the_first_occurrence_across_chunks(run_ids: int) -> None:
    first = FirstOccurrences(run_ids=run_ids)
    ids = [f"id-{i}" for i in range(1000)]
    for start in range(0, 1000, 100):  # chunks in file order
        assert repeats(first, ids[start : start + 100], start + 1) == [0] * 100
    assert len(first) == 1000
    sizes = [len(h1) for h1, _, _ in first._runs]
    assert all(len(h1) == len(set(h1.tolist())) and (h1[1:] > h1[:-1]).all() for h1, _, _ in first._runs)
    assert sizes == sorted(sizes, reverse=True) and len(sizes) <= (10 if run_ids > 1000 else 20), sizes
    assert repeats(first, ids[::-1], 1001) == list(range(1000, 0, -1)), "each names its first row, not a later one"
    assert len(first) == 1000, "repeats are not remembered again"
    assert repeats(first, ["id-1000", "ID-1", "id-1 "], 3001) == [0, 0, 0], "exact, case-sensitive text"


def test_repeats_within_a_chunk_and_empty_ids() -> None:
    first = FirstOccurrences()
    assert repeats(first, ["a", "b", "a", None, "", "a", "b"], 1) == [0, 0, 1, 0, 0, 1, 2]
    assert repeats(first, ["b", "", None, "c", "c"], 8) == [2, 0, 0, 0, 11]
    assert len(first) == 3, "empty and absent ids are not ids"


def test_each_ids_hash_is_given_as_it_is_looked_up() -> None:
    """The initiator takes the ledger's hashes from here instead of hashing its first occurrences again."""
    first = FirstOccurrences()
    ids = ["a", "", "b", None, "a"]
    hashes = np.full(len(ids), 7, np.uint64)
    first.repeat_of(pa.array(ids, pa.string()), np.arange(1, 6, dtype=np.int64), hashes=hashes)
    expected, _ = FirstOccurrences.hashes(np.array(["a", "b"], dtype=object))
    assert hashes[[0, 2, 4]].tolist() == [expected[0], expected[1], expected[0]]
    assert hashes[[1, 3]].tolist() == [7, 7], "an empty or absent id has no hash"


def test_hash_parts_must_both_match() -> None:
    first = FirstOccurrences()
    ids = np.array(["x", "y"], dtype=object)
    h1, h2 = FirstOccurrences.hashes(ids)
    assert h1.dtype == np.uint64 and h2.dtype == np.uint32, "12 bytes of hash per id"
    assert h1[0] != h1[1] and h2[0] != h2[1]
    repeats(first, ["x"], 1)
    assert first._first_rows(h1[:1], h2[:1]).tolist() == [1]
    assert first._first_rows(h1[:1], h2[:1] ^ np.uint32(1)).tolist() == [0]


def test_a_file_of_more_rows_than_remembered_is_refused() -> None:
    with pytest.raises(FileRefused, match="more than"):
        FirstOccurrences().repeat_of(pa.array(["a"]), np.array([MAX_ROWS + 1], np.int64))


def test_keep_first_keeps_the_earliest_held_repeat_of_a_rejected_first_occurrence() -> None:
    # id A: row 1 rejected, held 5, 3, 9 -> 3 kept; id B: row 2 accepted, held 4 -> duplicate;
    # id C: row 6 rejected, held 8 -> kept.
    rows = np.array([5, 4, 3, 9, 8])
    repeat_of = np.array([1, 2, 1, 1, 6])
    kept = keep_first(rows, repeat_of, rejected=np.array([1, 6, 7]))
    assert kept.tolist() == [False, False, True, False, True]
    assert keep_first(np.array([], np.int64), np.array([], np.int64), np.array([1])).tolist() == []


def test_keep_first_keeps_a_first_occurrence_held_for_the_ledger_unless_an_earlier_batch_took_its_id() -> None:
    rows, repeat_of = np.array([3, 5, 8, 9]), np.array([3, 3, 8, 8])  # 3 and 8 held as candidates, 5 and 9 repeats
    taken = np.array([False, False, True, True])  # 8's id was counted by an earlier batch
    assert keep_first(rows, repeat_of, np.array([], np.int64), taken).tolist() == [True, False, False, False]
    assert keep_first(rows, repeat_of, np.array([], np.int64)).tolist() == [True, False, True, False]
