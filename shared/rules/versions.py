"""Dated reference data: the versions a batch is rated with, and which of them rates a row.

A :class:`Version` names a price book and a tax table (by content hash) in force from a UTC date on; a batch carries
its versions oldest first. A row is rated with the version in force on its UTC date, the one with the latest
``effective_from`` on or before it (:meth:`Rates.in_force`, the one place that choice is made); a row dated before
the first version has none. :class:`Rates` holds the versions loaded, their tables laid end to end so that a row's
product and region are one index into them whatever its version.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .reference import PriceBook, TaxTable, decimal_text

_EPOCH = date(1970, 1, 1)
#: The day number of a version in force on every date.
_ALWAYS = np.iinfo(np.int64).min


@dataclass(frozen=True)
class Version:
    """A price book and a tax table in force from ``effective_from`` (a UTC date) on; None: on every date."""

    effective_from: date | None
    pricebook_hash: str
    taxes_hash: str

    def to_json(self) -> dict[str, str | None]:
        """The version as messages and the registry keep it."""
        start = None if self.effective_from is None else self.effective_from.isoformat()
        return {"effective_from": start, "pricebook": self.pricebook_hash, "taxes": self.taxes_hash}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Version:
        """A version from :meth:`to_json`'s shape; ``KeyError``, ``TypeError`` or ``ValueError`` if it is not one."""
        start = data["effective_from"]
        return cls(
            None if start is None else date.fromisoformat(str(start)), str(data["pricebook"]), str(data["taxes"])
        )


def dated(versions: Sequence[Version]) -> tuple[Version, ...]:
    """``versions`` oldest first, one a date (a later one of a date replaces an earlier); ``ValueError`` if none."""
    by_date = {version.effective_from: version for version in versions}
    if not by_date:
        raise ValueError("no reference data versions")
    return tuple(sorted(by_date.values(), key=lambda v: v.effective_from or date.min))


@dataclass(frozen=True)
class Rates:
    """The versions of a batch loaded: ``starts[i]`` (days since 1970-01-01) is when ``books[i]`` and ``tables[i]``
    come into force; oldest first."""

    starts: tuple[int, ...]
    books: tuple[PriceBook, ...]
    tables: tuple[TaxTable, ...]
    #: Where each version's products and regions start in the tables laid end to end.
    product_offset: np.ndarray = field(init=False, repr=False, compare=False)
    region_offset: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, sizes in (
            ("product_offset", [len(b.products) for b in self.books]),
            ("region_offset", [len(t.regions) for t in self.tables]),
        ):
            object.__setattr__(self, name, np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64))

    @classmethod
    def single(cls, price_book: PriceBook, tax_table: TaxTable) -> Rates:
        """One price book and tax table, in force on every date."""
        return cls((int(_ALWAYS),), (price_book,), (tax_table,))

    @classmethod
    def of(cls, loaded: Sequence[tuple[date | None, PriceBook, TaxTable]]) -> Rates:
        """Versions loaded, oldest first: (effective from, price book, tax table)."""
        starts = tuple(int(_ALWAYS) if start is None else (start - _EPOCH).days for start, _, _ in loaded)
        if list(starts) != sorted(set(starts)):
            raise ValueError("versions must be given oldest first, one a date")
        return cls(starts, tuple(book for _, book, _ in loaded), tuple(table for _, _, table in loaded))

    def in_force(self, days: np.ndarray) -> np.ndarray:
        """The index of the version in force on each day (days since 1970-01-01); -1 before the first."""
        found: np.ndarray = np.searchsorted(np.array(self.starts, np.int64), days, side="right") - 1
        return found

    def products(self, values: pa.Array, version: np.ndarray) -> np.ndarray:
        """Each row's product as an index into the price books laid end to end (:attr:`product_array`), looked up in
        its version's book; -1 where that book does not list it or the row has no version."""
        return _positions(values, version, [b.product_array for b in self.books], self.product_offset)

    def regions(self, values: pa.Array, version: np.ndarray) -> np.ndarray:
        """Each row's region as an index into the tax tables laid end to end; -1 where its version's table does not
        list it or the row has no version."""
        return _positions(values, version, [t.region_array for t in self.tables], self.region_offset)

    @functools.cached_property
    def product_array(self) -> pa.Array:
        """Every version's products, end to end."""
        return pa.concat_arrays([b.product_array for b in self.books])

    @functools.cached_property
    def pricebook_array(self) -> pa.Array:
        """The content hash of the price book of each entry of :attr:`product_array`."""
        return pa.array([b.content_hash for b in self.books for _ in b.products], pa.string())

    @functools.cached_property
    def region_array(self) -> pa.Array:
        """Every version's regions, end to end."""
        return pa.concat_arrays([t.region_array for t in self.tables])

    @functools.cached_property
    def rate_text_array(self) -> pa.Array:
        """The tax rate of each entry of :attr:`region_array` as normalised decimal text (``0.2``, ``0``)."""
        return pa.array([decimal_text(rate) for t in self.tables for rate in t.rates], pa.string())

    def column(self, name: str) -> np.ndarray:
        """A price book column (``currency``, ``digits``, ``unit_micro``, ``offpeak_micro``, ``minimum_minor``) or
        the tax rate (``rate_micro``) of every version, end to end."""
        return self._columns[name]

    @functools.cached_property
    def _columns(self) -> dict[str, np.ndarray]:
        names = ("currency", "digits", "unit_micro", "offpeak_micro", "minimum_minor")
        columns = {name: np.concatenate([getattr(b, name) for b in self.books]) for name in names}
        return columns | {"rate_micro": np.concatenate([t.rate_micro for t in self.tables])}


def _positions(values: pa.Array, version: np.ndarray, known: list[pa.Array], offset: np.ndarray) -> np.ndarray:
    """The position of each value in its version's ``known`` values, plus that version's ``offset``; -1 where it is
    not there or the row has no version (-1)."""
    found = np.full(len(values), -1, np.int64)
    for v in np.unique(version[version >= 0]).tolist():
        rows = np.flatnonzero(version == v)
        taken = values if len(rows) == len(values) else values.take(pa.array(rows))
        local = pc.fill_null(pc.index_in(taken, value_set=known[v]), -1).to_numpy(zero_copy_only=False)
        found[rows] = np.where(local >= 0, local.astype(np.int64) + offset[v], -1)
    return found
