"""Dated reference data: which version rates a row, and a batch spanning versions rated exactly against the model."""

from __future__ import annotations

from collections import defaultdict
from datetime import date
from decimal import Decimal

import numpy as np
import pytest

from benchmarks.reference_model import Row, check_batch_dated, rate_dated, raw_chunk, read_version
from processor import jobs
from shared.messages import WorkHeader
from shared.rules.rating import aggregate, itemise
from shared.rules.reference import load_price_book, load_tax_table
from shared.rules.validation import validate
from shared.rules.versions import Rates, Version, dated

HEADER = "product,currency,unit_price,offpeak_unit_price,minimum_charge\n"
MARCH = (HEADER + "cpu,USD,0.416,,\ngpu,EUR,2,1,0.5\n", "region,tax_rate\n*,0.2\nDE,0.19\nUS,0\n")
APRIL = (HEADER + "cpu,USD,0.5,0.25,\n", "region,tax_rate\n*,0.21\nDE,0.19\n")
STARTS = (date(2026, 3, 1), date(2026, 4, 1))


def rates() -> Rates:
    loaded = [
        (start, load_price_book(book.encode()), load_tax_table(taxes.encode()))
        for start, (book, taxes) in zip(STARTS, (MARCH, APRIL), strict=True)
    ]
    return Rates.of(loaded)


def day(text: str) -> int:
    return (date.fromisoformat(text) - date(1970, 1, 1)).days


def test_the_version_in_force_is_the_latest_on_or_before_the_day() -> None:
    found = rates().in_force(np.array([day(d) for d in ("2026-02-28", "2026-03-01", "2026-03-31", "2026-04-01")]))
    assert found.tolist() == [-1, 0, 0, 1]
    always = Rates.single(*rates().books[:1], *rates().tables[:1])
    assert always.in_force(np.array([day("0001-01-01"), day("9999-12-31")])).tolist() == [0, 0]


def test_versions_are_kept_oldest_first_one_a_date() -> None:
    a, b, c = Version(date(2026, 4, 1), "p1", "t1"), Version(None, "p0", "t0"), Version(date(2026, 4, 1), "p2", "t2")
    assert dated([a, b, c]) == (b, c)
    assert Version.from_json(a.to_json()) == a and Version.from_json(b.to_json()) == b
    with pytest.raises(ValueError):
        dated([])
    book, table = rates().books[0], rates().tables[0]
    with pytest.raises(ValueError):
        Rates.of([(STARTS[1], book, table), (STARTS[0], book, table)])


def rows() -> list[dict[str, str | None]]:
    stamps = ["2026-02-28T23:59:59Z", "2026-03-01T00:30:00+01:00", "2026-03-31T22:00:00-03:00", "2026-03-31T12:00:00Z"]
    stamps += ["2026-04-01T00:00:00Z", "2026-04-02T09:00:00Z", "2026-04-04T09:00:00Z"]
    found: list[dict[str, str | None]] = []
    for i, stamp in enumerate(stamps):
        for product in ("cpu", "gpu"):
            for region in ("", "DE", "US"):
                found.append(
                    {
                        "transaction_id": f"t{len(found)}",
                        "account_id": f"acct-{i % 2}",
                        "timestamp": stamp,
                        "product": product,
                        "quantity": f"{i + 1}.{len(found):03d}",
                        "region": region,
                    }
                )
    return found


def test_a_batch_spanning_two_versions_is_rated_exactly_as_the_model_rates_it() -> None:
    model_versions = [read_version(start, *texts) for start, texts in zip(STARTS, (MARCH, APRIL), strict=True)]
    raw = rows()
    expected = check_batch_dated(raw, model_versions)
    good, bad = validate(raw_chunk(raw), rates())
    got_reasons = dict(zip(bad["row"].to_pylist(), bad["reason"].to_pylist(), strict=True))
    assert got_reasons == {n: r for n, r in enumerate(expected, start=1) if isinstance(r, str)}
    assert {"no_reference_data", "unknown_product", "unknown_region"} <= set(got_reasons.values())
    want: dict[tuple[str, ...], list[object]] = defaultdict(lambda: [0, Decimal(0), 0, 0, 0, "", ""])
    for row in expected:
        if isinstance(row, Row):
            r = rate_dated(row, model_versions)
            sums = want[row.account_id, row.product, r.billing_day, r.region, r.pricebook]
            sums[:7] = [
                int(sums[0]) + 1,  # type: ignore[call-overload]
                sums[1] + row.quantity,  # type: ignore[operator]
                int(sums[2]) + r.net,  # type: ignore[call-overload]
                int(sums[3]) + r.tax,  # type: ignore[call-overload]
                int(sums[4]) + r.total,  # type: ignore[call-overload]
                r.currency,
                r.tax_rate,
            ]
    partials = aggregate(good, rates())
    got = {
        tuple(p[k] for k in ("account_id", "product", "billing_day", "region", "pricebook")): [
            p["transactions"],
            p["quantity"],
            int(p["net"]),
            int(p["tax"]),
            int(p["total"]),
            p["currency"],
            p["tax_rate"],
        ]
        for p in partials.to_pylist()
    }
    assert got == dict(want)
    assert {p["pricebook"] for p in partials.to_pylist()} == {v.pricebook for v in model_versions}
    assert itemise(good, rates())["total"].to_pylist() == [
        Decimal(rate_dated(r, model_versions).total) for r in expected if isinstance(r, Row)
    ]


def test_a_processor_parses_a_version_once() -> None:
    references = {
        load(text.encode()).content_hash: text.encode()
        for book, taxes in (MARCH, APRIL)
        for load, text in ((load_price_book, book), (load_tax_table, taxes))
    }
    hashes = list(references)
    versions = (Version(STARTS[0], hashes[0], hashes[1]), Version(STARTS[1], hashes[2], hashes[3]))
    header = WorkHeader("w", "b", hashes[2], hashes[3], rows=0, versions=versions)
    first = jobs.rates_of(header.dated(), references)
    assert [book.content_hash for book in first.books] == [hashes[0], hashes[2]]
    assert jobs.rates_of(header.dated(), {}) is first, "loaded once: the reference bytes are not read again"
