"""Vectorised validation against the row-by-row reference model."""

from __future__ import annotations

import json
import random
from datetime import date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.reference_model import (
    Row,
    check_batch,
    check_batch_dated,
    raw_chunk,
    read_prices,
    read_rates,
    read_version,
)
from shared.rules.batchfile import read_chunks
from shared.rules.duplicates import FirstOccurrences, keep_first
from shared.rules.reference import load_price_book, load_tax_table
from shared.rules.schemas import REJECT_SCHEMA
from shared.rules.validation import ACCEPTED_SCHEMA, REASONS, validate
from shared.rules.versions import Rates
from support.batchfiles import with_raw

PRICES = "product,currency,unit_price,offpeak_unit_price,minimum_charge\ncpu,USD,0.5,,\nGPU,EUR,2,1,\n"
RATES = "region,tax_rate\n*,0.2\nDE,0.19\nfr,0.055\n"
BOOK, TAXES = load_price_book(PRICES.encode()), load_tax_table(RATES.encode())
MODEL_PRICES, MODEL_RATES = read_prices(PRICES), read_rates(RATES)
#: Two versions: the first from 2024-03-01 (a row dated before is ``no_reference_data``); the second, from
#: 2026-03-03, without GPU and region fr (known the day before, unknown from then on).
PRICES_LATER = "product,currency,unit_price,offpeak_unit_price,minimum_charge\ncpu,USD,0.75,,\n"
RATES_LATER = "region,tax_rate\n*,0.2\nDE,0.19\n"
DATED = Rates.of(
    [
        (date(2024, 3, 1), BOOK, TAXES),
        (date(2026, 3, 3), load_price_book(PRICES_LATER.encode()), load_tax_table(RATES_LATER.encode())),
    ]
)
MODEL_DATED = [
    read_version(date(2024, 3, 1), PRICES, RATES),
    read_version(date(2026, 3, 3), PRICES_LATER, RATES_LATER),
]

GOOD = {
    "transaction_id": "t",
    "account_id": "a",
    "timestamp": "2026-03-02T09:15:00+01:00",
    "product": "cpu",
    "quantity": "1",
}
WS = ["", " ", "\t", "\u00a0", "\u3000", "\u2028", "\n", "\u200a"]

IDS = ["t1", "T1", "a.b_c:d-e", "x" * 64, "x" * 65, "t 1", "tü", "t/1", "\u0661", "", None, "\u00a0", "\u200b"]
TIMESTAMPS = [
    "2026-03-06T19:59:59.999999Z",
    "2026-03-06T20:00:00Z",
    "2026-03-06T19:59:59.9999999Z",
    "2026-03-06T19:59:59.99999990Z",
    "2026-03-06T07:59:59.9999999Z",
    "2026-03-06T08:00:00Z",
    "2026-03-07T09:00:00+14:00",
    "2026-03-06T23:30:00-12:00",
    "2026-03-02T09:15:00+01:00",
    "2026-03-02T09:15:00-00:00",
    "2026-03-02T09:15:00.5+23:59",
    "2026-03-02T09:15:00+24:00",
    "2026-03-02T09:15:00+01:60",
    "2026-03-02T09:15:00",
    "2026-03-02T09:15:00.123",
    "2026-02-30T10:00:00",
    "2026-02-29T10:00:00Z",
    "2024-02-29T10:00:00Z",
    "1900-02-29T10:00:00Z",
    "2000-02-29T10:00:00Z",
    "2026-13-01T00:00:00Z",
    "2026-00-01T00:00:00Z",
    "2026-01-00T00:00:00Z",
    "2026-04-31T00:00:00Z",
    "2026-01-01T24:00:00Z",
    "2026-01-01T23:60:00Z",
    "2026-01-01T23:59:60Z",
    "0000-01-01T00:00:00Z",
    "0001-01-01T00:00:00Z",
    "0001-01-01T00:30:00+01:00",
    "9999-12-31T23:59:59.999999Z",
    "9999-12-31T23:30:00-01:00",
    "2026-03-02t09:15:00Z",
    "2026-03-02T09:15:00z",
    "2026-03-02 09:15:00Z",
    "2026-03-02T09:15Z",
    "2026-03-02T09:15:00.Z",
    "2026-03-02T09:15:00,5Z",
    "2026-03-02T09:15:00+0100",
    "2026-03-02T09:15:00+01",
    "26-03-02T09:15:00Z",
    "2026-3-2T09:15:00Z",
    "2026-03-02T09:15:00Z\n",
    "2026-03-02",
    "2026-03-02T09:15:00.000000001+05:30",
    "\u0662026-03-02T09:15:00Z",
    "20260302T091500Z",
    "",
    None,
]
QUANTITIES = [
    "0",
    "-0",
    "+0",
    "-0.000000",
    "+5",
    "1",
    "0.5",
    "1.5",
    "007",
    "1000000000",
    "1000000000.000000",
    "1000000000.000001",
    "1000000000.0000000",
    "1000000001",
    "10000000000",
    "1000000000000000000.5",
    "00001000000000",
    "99999999999999999999",
    "-1",
    "-0.0000001",
    "-2000000000",
    "-1.0000000",
    "1.0000000",
    "1.000000",
    "0.123456",
    "0.1234567",
    "1e3",
    "12.",
    ".5",
    "1,5",
    "1.2.3",
    "--1",
    "+-1",
    "\u0661\u0662",
    "١.5",
    "0x10",
    "inf",
    "NaN",
    " 1 2 ",
    "",
    None,
]
PRODUCTS = ["cpu", "GPU", "gpu", "CPU", "disk", "", None, "c p u"]
REGIONS = [None, "", "*", "DE", "de", "fr", "FR", "XX"]


def _pad(value: str | None, rnd: random.Random) -> str | None:
    if value is None or rnd.random() < 0.6:
        return value
    return rnd.choice(WS) + value + rnd.choice(WS)


def generated_rows(count: int, seed: int) -> list[dict[str, str | None]]:
    rnd = random.Random(seed)
    rows: list[dict[str, str | None]] = []
    for i in range(count):
        bad = rnd.random() < 0.5
        row = {
            "transaction_id": rnd.choice(IDS) if bad and rnd.random() < 0.2 else f"tx-{rnd.randrange(count)}",
            "account_id": rnd.choice(IDS) if bad and rnd.random() < 0.2 else f"acct-{i % 7}",
            "timestamp": rnd.choice(TIMESTAMPS) if bad and rnd.random() < 0.3 else "2026-03-02T09:15:00+01:00",
            "product": rnd.choice(PRODUCTS) if bad and rnd.random() < 0.3 else "cpu",
            "quantity": rnd.choice(QUANTITIES)
            if bad and rnd.random() < 0.3
            else f"{rnd.randrange(10**4)}.{rnd.randrange(100)}",
            "region": rnd.choice(REGIONS) if rnd.random() < 0.5 else None,
        }
        rows.append({k: _pad(v, rnd) for k, v in row.items()})
    return rows


def run(rows: list[dict[str, str | None]], chunk_size: int) -> tuple[pa.Table, pa.Table]:
    """(accepted, rejects) of ``rows`` as the pipeline splits the rules: repeated ids marked in file order
    (the initiator), each chunk validated alone (a processor, holding the otherwise valid repeats), the held
    rows decided once every row is validated (the controller)."""
    first = FirstOccurrences()
    goods, bads, helds = [], [], []
    for start in range(0, len(rows), chunk_size):
        chunk = raw_chunk(rows[start : start + chunk_size], start + 1)
        ids = pc.utf8_trim_whitespace(chunk.column("transaction_id").combine_chunks())
        chunk = chunk.append_column("repeat_of", pa.array(first.repeat_of(ids, chunk.column("row").to_numpy())))
        good, bad = validate(chunk, DATED)
        assert good.schema == ACCEPTED_SCHEMA and bad.schema == REJECT_SCHEMA
        repeats = chunk.filter(pc.greater(chunk.column("repeat_of"), 0))
        held = pc.is_in(good.column("row"), value_set=repeats.column("row"))
        goods.append(good.filter(pc.invert(held)))
        bads.append(bad)
        helds.append((good.filter(held), repeats.filter(pc.is_in(repeats.column("row"), value_set=good.column("row")))))
    rejected = pa.concat_tables(bads)
    held_rows = pa.concat_tables([rows for rows, _ in helds])
    held_chunks = pa.concat_tables([chunk for _, chunk in helds])
    assert held_rows.column("row") == held_chunks.column("row")
    kept = keep_first(
        held_chunks.column("row").to_numpy(),
        held_chunks.column("repeat_of").to_numpy(),
        rejected.column("row").to_numpy(),
    )
    duplicates = held_chunks.filter(pa.array(~kept))
    rejected = pa.concat_tables(
        [
            rejected,
            pa.table(
                [
                    duplicates.column("row"),
                    pa.repeat("duplicate_transaction_id", duplicates.num_rows),
                    duplicates.column("raw"),
                ],
                schema=REJECT_SCHEMA,
            ),
        ]
    ).sort_by("row")
    accepted = pa.concat_tables([*goods, held_rows.filter(pa.array(kept))]).sort_by("row")
    return accepted, rejected


def assert_matches_model(rows: list[dict[str, str | None]], chunk_size: int) -> list[Row | str]:
    expected = check_batch_dated(rows, MODEL_DATED)
    good, bad = run(rows, chunk_size)
    assert good.num_rows + bad.num_rows == len(rows)
    reasons = {
        r: reason for r, reason in zip(bad.column("row").to_pylist(), bad.column("reason").to_pylist(), strict=True)
    }
    accepted = {r["row"]: r for r in good.to_pylist()}
    for number, want in enumerate(expected, start=1):
        if isinstance(want, str):
            assert reasons.get(number) == want, (number, rows[number - 1])
        else:
            got = accepted[number]
            assert (got["transaction_id"], got["account_id"], got["product"], got["region"]) == (
                want.transaction_id,
                want.account_id,
                want.product,
                want.region,
            )
            assert got["quantity_micro"] == int(want.quantity * 10**6)
            assert got["timestamp_us"] == expected_timestamp_us(want)
    return expected


def expected_timestamp_us(row: Row) -> int:
    """The documented ``timestamp_us``: truncated to the microsecond, except (19:59:59.999999, 20:00) -> 20:00."""
    seconds = (row.instant.second - datetime(1970, 1, 1)) // timedelta(seconds=1)
    micro = row.instant.fraction * 10**6
    value = seconds * 10**6 + int(micro)
    if micro != int(micro) and value % 86_400_000_000 == 72_000_000_000 - 1:
        value += 1
    return value


def test_generated_rows_match_the_model_in_any_chunking() -> None:
    rows = generated_rows(6_000, seed=7)
    expected = assert_matches_model(rows, chunk_size=6_000)
    reasons = {r for r in expected if isinstance(r, str)}
    assert reasons == set(REASONS)  # every reject code is exercised
    assert_matches_model(rows, chunk_size=997)
    assert_matches_model(rows[:300], chunk_size=1)


@pytest.mark.parametrize("field", ["transaction_id", "account_id", "timestamp", "product", "quantity", "region"])
@pytest.mark.parametrize("value", IDS + TIMESTAMPS + QUANTITIES + PRODUCTS + REGIONS)
def test_every_value_in_every_field(field: str, value: str | None) -> None:
    rows = [{**GOOD, "transaction_id": "first", field: value}, {**GOOD, field: value}, {**GOOD, field: value}]
    assert_matches_model(rows, chunk_size=2)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({**GOOD, "transaction_id": "bad id", "account_id": None}, "missing_field"),
        ({**GOOD, "transaction_id": "bad id", "account_id": "bad id"}, "invalid_transaction_id"),
        ({**GOOD, "account_id": "bad id", "timestamp": "x"}, "invalid_account_id"),
        ({**GOOD, "timestamp": "2026-03-02T09:15:00", "product": "nope"}, "timestamp_without_timezone"),
        ({**GOOD, "timestamp": "2026-02-30T09:15:00", "product": "nope"}, "invalid_timestamp"),
        ({**GOOD, "product": "nope", "quantity": "x"}, "unknown_product"),
        ({**GOOD, "quantity": "1e3", "region": "XX"}, "invalid_quantity"),
        ({**GOOD, "quantity": "-2000000000.1234567"}, "negative_quantity"),
        ({**GOOD, "quantity": "2000000000.1234567"}, "quantity_out_of_range"),
        ({**GOOD, "quantity": "1000000000.0000001"}, "quantity_out_of_range"),
        ({**GOOD, "quantity": "1000000000.0000000"}, "too_many_decimals"),
        ({**GOOD, "quantity": "-0.0000000", "region": "XX"}, "too_many_decimals"),
        ({**GOOD, "region": "XX"}, "unknown_region"),
        ({**GOOD, "region": " \u3000"}, None),
        ({**GOOD, "quantity": "\u0661"}, "invalid_quantity"),
    ],
)
def test_precedence(row: dict[str, str | None], reason: str | None) -> None:
    _, bad = validate(raw_chunk([row]), Rates.single(BOOK, TAXES))
    assert bad.column("reason").to_pylist() == ([reason] if reason else [])
    assert check_batch([row], MODEL_PRICES, MODEL_RATES)[0] == reason or reason is None


def test_duplicates_keep_the_first_valid_occurrence_across_chunks() -> None:
    rows = [
        {**GOOD, "transaction_id": "a", "quantity": "-1"},  # invalid: does not claim "a"
        {**GOOD, "transaction_id": " a "},
        {**GOOD, "transaction_id": "a"},
        {**GOOD, "transaction_id": "A"},
        {**GOOD, "transaction_id": "a", "region": "XX"},  # otherwise invalid: its own reason
        {**GOOD, "transaction_id": "a"},
    ]
    good, bad = run(rows, chunk_size=2)
    assert good.column("row").to_pylist() == [2, 4]
    assert list(zip(bad.column("row").to_pylist(), bad.column("reason").to_pylist(), strict=True)) == [
        (1, "negative_quantity"),
        (3, "duplicate_transaction_id"),
        (5, "unknown_region"),
        (6, "duplicate_transaction_id"),
    ]
    assert bad.column("raw").to_pylist()[0].startswith('{"transaction_id": "a"')


def test_region_column_entirely_null() -> None:
    chunk = raw_chunk([GOOD, GOOD | {"transaction_id": "u"}]).set_column(5, "region", pa.nulls(2))
    good, bad = validate(chunk, Rates.single(BOOK, TAXES))
    assert good.column("region").to_pylist() == ["*", "*"] and bad.num_rows == 0


DIGIT = st.sampled_from("0123456789")


@settings(max_examples=300, deadline=None)
@given(
    st.tuples(
        st.integers(0, 10_000).map(lambda y: f"{y:04d}"[-4:]),
        st.integers(0, 14).map(lambda v: f"{v:02d}"),
        st.integers(0, 32).map(lambda v: f"{v:02d}"),
        st.integers(0, 25).map(lambda v: f"{v:02d}"),
        st.integers(0, 61).map(lambda v: f"{v:02d}"),
        st.integers(0, 61).map(lambda v: f"{v:02d}"),
        st.one_of(st.just(""), st.text(DIGIT, min_size=1, max_size=12).map(lambda f: "." + f)),
        st.one_of(
            st.sampled_from(["", "Z", "+00:00", "-00:00"]),
            st.tuples(st.sampled_from("+-"), st.integers(0, 25), st.integers(0, 61)).map(
                lambda t: f"{t[0]}{t[1]:02d}:{t[2]:02d}"
            ),
        ),
    )
)
def test_timestamps_match_the_model(parts: tuple[str, ...]) -> None:
    y, mo, d, h, mi, s, fraction, zone = parts
    text = f"{y}-{mo}-{d}T{h}:{mi}:{s}{fraction}{zone}"
    assert_matches_model([{**GOOD, "timestamp": text}], chunk_size=1)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["", "+", "-"]),
    st.text(DIGIT, min_size=1, max_size=13),
    st.one_of(st.none(), st.text(DIGIT, min_size=0, max_size=9)),
)
def test_quantities_match_the_model(sign: str, whole: str, fraction: str | None) -> None:
    text = sign + whole + ("" if fraction is None else "." + fraction)
    assert_matches_model([{**GOOD, "quantity": text}], chunk_size=1)


def test_rejects_of_a_file_carry_their_rows_raw_text(tmp_path: Path) -> None:
    """The raw text of a chunk read from a file is made for its rejects: every header column in order,
    an extra one included, for exactly the rejected rows."""
    path = tmp_path / "b.csv"
    path.write_text(
        "note,transaction_id,account_id,timestamp,product,quantity\n"
        "first,t1,a,2026-03-02T09:15:00Z,cpu,1\n"
        "bad,t2,a,2026-03-02T09:15:00Z,disk,1\n"
        "again,t1,a,2026-03-02T09:15:00Z,cpu,-2\n"
        "short,t3\n"
    )
    with path.open("rb") as source:
        [chunk] = read_chunks(source, "csv")
    good, bad = validate(chunk, Rates.single(BOOK, TAXES))
    assert good["row"].to_pylist() == [1]
    assert bad["row"].to_pylist() == [2, 3, 4]
    assert bad["reason"].to_pylist() == ["unknown_product", "negative_quantity", "missing_field"]
    assert bad["raw"].to_pylist() == with_raw(chunk)["raw"].to_pylist()[1:]
    assert [json.loads(raw) for raw in bad["raw"].to_pylist()] == [
        {"note": "bad", "transaction_id": "t2", "account_id": "a", "timestamp": "2026-03-02T09:15:00Z"}
        | {"product": "disk", "quantity": "1"},
        {"note": "again", "transaction_id": "t1", "account_id": "a", "timestamp": "2026-03-02T09:15:00Z"}
        | {"product": "cpu", "quantity": "-2"},
        {"note": "short", "transaction_id": "t3"},
    ]
