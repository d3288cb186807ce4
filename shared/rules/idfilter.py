"""The ledger's id filter: a Bloom filter over the 64-bit hashes of transaction ids billed (or being billed) in
earlier batches, so that only the rows of a batch whose id may repeat one of theirs are held for the exact check
in SQL (``docs/architecture.md``, "Transaction ids across batches").

An id is a candidate when every one of its :data:`HASHES` bits is set. The bits are taken from the id's 64-bit
hash (:meth:`~shared.rules.duplicates.FirstOccurrences.hashes`, the first part) by double hashing, its two
32-bit halves. With ``bits`` = 9.6 bits an id, about 1 % of ids never seen are candidates; a false candidate
costs only its exact check. The filter never forgets an id (a voided batch's ids stay candidates), so it
never misses one.
"""

from __future__ import annotations

import numpy as np

#: Bits set per id: the best number for 1 % false candidates.
HASHES = 7
_LOW = np.uint64(0xFFFFFFFF)


class IdFilter:
    """A Bloom filter of ``bits`` bits (a power of two, at least 64)."""

    def __init__(self, bits: int, data: bytes | None = None) -> None:
        if bits < 64 or bits & (bits - 1):
            raise ValueError(f"an id filter's size is a power of two of at least 64 bits, not {bits}")
        self.bits = bits
        self._bytes = np.zeros(bits // 8, np.uint8) if data is None else np.frombuffer(data, np.uint8).copy()
        if len(self._bytes) * 8 != bits:
            raise ValueError(f"an id filter of {bits} bits holds {bits // 8} bytes, not {len(self._bytes)}")

    def to_bytes(self) -> bytes:
        """The filter's bits, as :class:`IdFilter` reads them back."""
        return self._bytes.tobytes()

    def add(self, hashes: np.ndarray) -> None:
        """Remember the ids of these hashes (uint64)."""
        byte, bit = self._positions(hashes)
        for value in range(8):  # one bit value a pass: repeated bytes then all write the same value
            at = byte[bit == value]
            self._bytes[at] |= np.uint8(1 << value)

    def might_contain(self, hashes: np.ndarray) -> np.ndarray:
        """Whether each id may have been added (False: certainly not)."""
        byte, bit = self._positions(hashes)
        found = (self._bytes[byte] >> bit) & 1
        return np.asarray(found.reshape(HASHES, len(hashes)).all(axis=0), dtype=bool)

    def merge(self, other: IdFilter) -> None:
        """Add every id of ``other`` (a filter of the same size)."""
        if other.bits != self.bits:
            raise ValueError("only filters of one size can be merged")
        self._bytes |= other._bytes

    def _positions(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each hash's :data:`HASHES` bits, one row of the result per hash function: their bytes and bits."""
        hashes = np.asarray(hashes, np.uint64)
        low, high = hashes & _LOW, (hashes >> np.uint64(32)) | np.uint64(1)
        steps = np.arange(HASHES, dtype=np.uint64)[:, None]
        slots = ((low[None, :] + steps * high[None, :]) & np.uint64(self.bits - 1)).ravel()
        return (slots >> np.uint64(3)).astype(np.intp), (slots & np.uint64(7)).astype(np.uint8)
