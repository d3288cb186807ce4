"""The ledger's id filter: never misses an id it was given, rarely holds one it was not, the same bits after a
round trip through its bytes (as its blob stores them), and a size that is a power of two."""

from __future__ import annotations

import numpy as np
import pytest

from shared.rules.bloom import IdFilter


def _hashes(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**64, n, dtype=np.uint64)


def test_every_id_added_is_a_candidate_and_about_one_in_a_hundred_others() -> None:
    ids = IdFilter(1 << 20)
    added = _hashes(1, (1 << 20) // 12)  # 12 bits an id
    ids.add(added[: len(added) // 2])
    ids.add(added[len(added) // 2 :])
    assert ids.might_contain(added).all()
    false = ids.might_contain(_hashes(2, 200_000)).mean()
    assert 0.002 < false < 0.02


def test_the_bytes_read_back_hold_the_same_ids_and_filters_merge() -> None:
    first, second = IdFilter(1 << 12), IdFilter(1 << 12)
    first.add(_hashes(3, 50))
    second.add(_hashes(4, 50))
    copy = IdFilter(1 << 12, first.to_bytes())
    assert copy.to_bytes() == first.to_bytes() and copy.might_contain(_hashes(3, 50)).all()
    copy.merge(second)
    assert copy.might_contain(np.concatenate([_hashes(3, 50), _hashes(4, 50)])).all()
    assert not IdFilter(1 << 12).might_contain(_hashes(3, 50)).any()


@pytest.mark.parametrize("bits", [0, 32, 100, 3 << 10])
def test_a_size_that_is_not_a_power_of_two_of_at_least_64_bits_is_refused(bits: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        IdFilter(bits)


def test_bytes_of_another_size_are_refused() -> None:
    with pytest.raises(ValueError, match="holds"):
        IdFilter(1 << 12, bytes(8))


def test_many_ids_at_once_set_the_bits_they_set_one_piece_at_a_time() -> None:
    hashes = _hashes(5, 300_000)  # several of the filter's slices
    whole, pieces = IdFilter(1 << 22), IdFilter(1 << 22)
    whole.add(hashes)
    for start in range(0, len(hashes), 777):
        pieces.add(hashes[start : start + 777])
    assert whole.to_bytes() == pieces.to_bytes()
    probe = np.concatenate([hashes[:1000], _hashes(6, 299_000)])  # some added, most not
    one_by_one = np.concatenate([pieces.might_contain(probe[start : start + 777]) for start in range(0, 300_000, 777)])
    assert (whole.might_contain(probe) == one_by_one).all() and one_by_one.any() and not one_by_one.all()
