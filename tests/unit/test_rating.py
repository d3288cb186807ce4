"""Vectorised rating and aggregation against the exact row-by-row reference model."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.reference_model import Row, check_batch, rate_row, raw_chunk, read_prices, read_rates
from shared.errors import ReferenceDataError
from shared.rules.rating import aggregate, itemise
from shared.rules.reference import PriceBook, TaxTable, load_price_book, load_tax_table
from shared.rules.schemas import PARTIAL_SCHEMA
from shared.rules.validation import validate
from shared.rules.versions import Rates

PRICES = """product,currency,unit_price,offpeak_unit_price,minimum_charge
usd,USD,0.015,0.01,
tie,USD,0.005,0.015,0.005
eur_min,EUR,0.333333,,2.5
jpy,JPY,1.5,0.5,100
krw,KRW,999999.999999,0.000001,
bhd,BHD,0.0005,0.0015,0.0005
kwd,KWD,1000000,999999.999999,1000000
chf,CHF,0,0,0.01
gbp,GBP,123.456789,0.000001,
"""
RATES = "region,tax_rate\n*,0.2\nhalf,0.5\nnone,0\nall,1\nodd,0.123457\n"
BOOK, TAXES = load_price_book(PRICES.encode()), load_tax_table(RATES.encode())
MODEL_PRICES, MODEL_RATES = read_prices(PRICES), read_rates(RATES)
BOUNDARIES = [
    "2026-03-06T19:59:59.999999Z",
    "2026-03-06T20:00:00Z",
    "2026-03-06T19:59:59.9999999Z",
    "2026-03-06T07:59:59.999999Z",
    "2026-03-06T08:00:00Z",
    "2026-03-06T07:59:59.9999999Z",
    "2026-03-07T08:00:00+14:00",
    "2026-03-06T19:59:59-12:00",
    "2026-03-06T20:00:00-12:00",
    "2026-03-09T07:59:59+00:00",
    "2026-03-09T08:00:00+14:00",
    "2026-03-08T22:00:00-10:00",
    "2026-03-06T23:59:59.9999999Z",
    "2026-03-07T00:00:00Z",
    "2026-03-06T09:00:00.000000001+01:00",
    "2026-03-02T09:15:00+01:00",
]


def rate(accepted: pa.Table, price_book: PriceBook, tax_table: TaxTable) -> pd.DataFrame:
    """Each row's amounts as :func:`itemise` rates them (held repeats are rated so)."""
    itemised = itemise(accepted, Rates.single(price_book, tax_table))
    assert itemised.schema == PARTIAL_SCHEMA and itemised["transactions"].to_pylist() == [1] * accepted.num_rows
    return itemised.select(["net", "tax", "total", "currency", "billing_day"]).to_pandas()


def accepted_table(rows: list[dict[str, str | None]]) -> tuple[pa.Table, list[Row]]:
    good, bad = validate(raw_chunk(rows), Rates.single(BOOK, TAXES))
    assert bad.num_rows == 0, bad.to_pylist()[:3]
    model = check_batch(rows, MODEL_PRICES, MODEL_RATES)
    assert all(isinstance(r, Row) for r in model)
    return good, model  # type: ignore[return-value]


def generated_rows(count: int, seed: int) -> list[dict[str, str | None]]:
    rnd = random.Random(seed)
    start = datetime(2026, 2, 26, tzinfo=UTC)
    rows = []
    for i in range(count):
        if rnd.random() < 0.2:
            timestamp = rnd.choice(BOUNDARIES)
        else:
            offset = rnd.randrange(-12 * 60, 14 * 60 + 1, 15)
            local = start + timedelta(seconds=rnd.randrange(14 * 86_400), minutes=offset)
            sign = "-" if offset < 0 else "+"
            fraction = rnd.choice(["", f".{rnd.randrange(10**6):06d}", f".{rnd.randrange(10**9):09d}", ".5"])
            timestamp = (
                local.strftime("%Y-%m-%dT%H:%M:%S") + fraction + f"{sign}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"
            )
        kind = rnd.random()
        if kind < 0.1:
            quantity = rnd.choice(["0", "-0", "1000000000", "999999999.999999", "0.000001", "1", "0.5", "1.5", "2.5"])
        elif kind < 0.4:
            quantity = f"{rnd.randrange(10**9)}.{rnd.randrange(10**6):06d}"
        else:
            quantity = f"{rnd.randrange(1000)}.{rnd.randrange(10**6):0{rnd.randrange(1, 7)}d}"[:12].rstrip(".")
        rows.append(
            {
                "transaction_id": f"tx-{i}",
                "account_id": f"acct-{rnd.randrange(5)}",
                "timestamp": timestamp,
                "product": rnd.choice(BOOK.products),
                "quantity": quantity,
                "region": rnd.choice(["", "half", "none", "all", "odd", None]),
            }
        )
    return rows


def assert_rates_match(rows: list[dict[str, str | None]]) -> None:
    good, model = accepted_table(rows)
    got = rate(good, BOOK, TAXES)
    assert list(got.columns) == ["net", "tax", "total", "currency", "billing_day"]
    for i, row in enumerate(model):
        want = rate_row(row, MODEL_PRICES, MODEL_RATES)
        assert (got.net[i], got.tax[i], got.total[i], got.currency[i], got.billing_day[i]) == (
            want.net,
            want.tax,
            want.total,
            want.currency,
            want.billing_day,
        ), (rows[i], want)


def test_generated_rows_rate_exactly() -> None:
    assert_rates_match(generated_rows(5_000, seed=11))


@pytest.mark.parametrize(
    ("timestamp", "peak"),
    [(t, p) for t, p in zip(BOUNDARIES, [1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 1, 1], strict=True)],
)
def test_peak_boundaries(timestamp: str, peak: int) -> None:
    rows = [{"transaction_id": "t", "account_id": "a", "timestamp": timestamp, "product": "usd", "quantity": "100"}]
    good, _ = accepted_table(rows)
    assert rate(good, BOOK, TAXES).net[0] == (150 if peak else 100)
    assert_rates_match(rows)


def test_half_up_ties_and_minimum_charges() -> None:
    base = {"account_id": "a", "timestamp": "2026-03-02T09:00:00Z"}  # Monday, peak
    cases = [  # product, quantity, region, net, tax
        ("tie", "1", "half", 1, 1),  # 0.5 cent -> 1; minimum 0.005 -> 1; tax 0.5 -> 1
        ("tie", "0", "half", 0, 0),  # no minimum for a zero quantity
        ("tie", "3", "half", 2, 1),  # 1.5 -> 2; tax 1.0
        ("eur_min", "0.000001", "", 250, 50),  # minimum 2.50 EUR
        ("jpy", "1", "half", 100, 50),  # minimum 100 JPY
        ("jpy", "1000", "odd", 1500, 185),  # 185.1855 -> 185
        ("bhd", "1", "half", 1, 1),  # 0.5 fils -> 1
        ("chf", "5", "all", 1, 1),  # price 0, minimum 0.01 CHF
        ("kwd", "1000000000", "all", 10**18, 10**18),  # the largest possible row
    ]
    rows = [
        {**base, "transaction_id": f"t{i}", "product": p, "quantity": q, "region": r}
        for i, (p, q, r, _, _) in enumerate(cases)
    ]
    good, _ = accepted_table(rows)
    got = rate(good, BOOK, TAXES)
    assert list(zip(got.net, got.tax, strict=True)) == [(net, tax) for *_, net, tax in cases]
    assert got.total.tolist() == [net + tax for *_, net, tax in cases]
    assert_rates_match(rows)


def test_aggregates_sum_exactly_beyond_64_bits() -> None:
    rows = generated_rows(3_000, seed=5)
    rows += [
        {
            "transaction_id": f"big-{i}",
            "account_id": "whale",
            "timestamp": "2026-03-02T12:00:00Z",
            "product": "kwd",
            "quantity": "1000000000",
            "region": "all",
        }
        for i in range(20)
    ]
    good, model = accepted_table(rows)
    partials = aggregate(good, Rates.single(BOOK, TAXES))
    assert partials.schema == PARTIAL_SCHEMA
    want: dict[tuple[str, ...], list] = defaultdict(lambda: [0, Decimal(0), 0, 0, 0, "", BOOK.content_hash, ""])
    for row in model:
        rated = rate_row(row, MODEL_PRICES, MODEL_RATES)
        acc = want[row.account_id, row.product, rated.billing_day, row.region]
        acc[0] += 1
        acc[1] += row.quantity
        acc[2] += rated.net
        acc[3] += rated.tax
        acc[4] += rated.total
        acc[5] = rated.currency
        acc[7] = rated.tax_rate
    got = {
        (r["account_id"], r["product"], r["billing_day"], r["region"]): [
            r["transactions"],
            r["quantity"],
            int(r["net"]),
            int(r["tax"]),
            int(r["total"]),
            r["currency"],
            r["pricebook"],
            r["tax_rate"],
        ]
        for r in partials.to_pylist()
    }
    assert got == {k: v for k, v in want.items()}
    keys = [(r["account_id"], r["product"], r["billing_day"], r["region"]) for r in partials.to_pylist()]
    assert len(set(keys)) == len(keys)  # one row a key, the rows in account order
    assert [key[0] for key in keys] == sorted(key[0] for key in keys)
    assert got["whale", "kwd", "2026-03-02", "all"][4] == 20 * 2 * 10**18 > 2**63


def test_empty_and_unknown_reference() -> None:
    good, _ = accepted_table(
        [
            {
                "transaction_id": "t",
                "account_id": "a",
                "timestamp": "2026-03-02T09:00:00Z",
                "product": "usd",
                "quantity": "1",
            }
        ]
    )
    assert aggregate(good.slice(0, 0), Rates.single(BOOK, TAXES)).num_rows == 0
    assert rate(good.slice(0, 0), BOOK, TAXES).empty
    other = load_price_book(b"product,currency,unit_price,offpeak_unit_price,minimum_charge\nx,USD,1,,\n")
    with pytest.raises(ReferenceDataError, match="product usd is not in price book"):
        aggregate(good, Rates.single(other, TAXES))


CURRENCIES = {"USD": 2, "JPY": 0, "BHD": 3}
MICROS = st.integers(0, 10**12).map(lambda v: f"{v // 10**6}.{v % 10**6:06d}")


@settings(max_examples=150, deadline=None)
@given(
    currency=st.sampled_from(sorted(CURRENCIES)),
    unit=st.one_of(MICROS, st.sampled_from(["0.5", "0.005", "0.0005", "1000000", "0"])),
    offpeak=st.one_of(st.just(""), MICROS),
    minimum=st.one_of(st.just(""), MICROS),
    tax_rate=st.one_of(st.integers(0, 10**6).map(lambda v: f"{v / 10**6:.6f}"), st.sampled_from(["0.5", "0.05", "1"])),
    rows=st.lists(
        st.tuples(
            st.one_of(st.integers(0, 10**15), st.sampled_from([0, 1, 500_000, 10**15])),
            st.integers(-62_135_596_800 + 86_400, 253_402_300_799 - 86_400),  # UTC seconds, years 1..9999
            st.sampled_from(["", ".9999999", ".5", ".000000001", ".999999"]),
            st.integers(-23 * 60 - 59, 23 * 60 + 59),
        ),
        min_size=1,
        max_size=20,
    ),
)
def test_arithmetic_matches_the_model(
    currency: str, unit: str, offpeak: str, minimum: str, tax_rate: str, rows: list[tuple[int, int, str, int]]
) -> None:
    prices = f"product,currency,unit_price,offpeak_unit_price,minimum_charge\np,{currency},{unit},{offpeak},{minimum}\n"
    rates = f"region,tax_rate\n*,{tax_rate}\n"
    book, taxes = load_price_book(prices.encode()), load_tax_table(rates.encode())
    raw = []
    for i, (q, seconds, fraction, offset) in enumerate(rows):
        local = datetime(1970, 1, 1) + timedelta(seconds=seconds + offset * 60)
        zone = f"{'-' if offset < 0 else '+'}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"
        raw.append(
            {
                "transaction_id": f"t{i}",
                "account_id": "a",
                "timestamp": local.isoformat() + fraction + zone,
                "product": "p",
                "quantity": f"{q // 10**6}.{q % 10**6:06d}",
            }
        )
    good, bad = validate(raw_chunk(raw), Rates.single(book, taxes))
    assert bad.num_rows == 0
    got = rate(good, book, taxes)
    model_prices, model_rates = read_prices(prices), read_rates(rates)
    for i, row in enumerate(check_batch(raw, model_prices, model_rates)):
        assert isinstance(row, Row)
        want = rate_row(row, model_prices, model_rates)
        assert (got.net[i], got.tax[i], got.total[i], got.billing_day[i]) == (
            want.net,
            want.tax,
            want.total,
            want.billing_day,
        )
    partials = aggregate(good, Rates.single(book, taxes))
    assert sum(int(t) for t in partials.column("total").to_pylist()) == sum(int(t) for t in got.total)
