"""Sample reference data and the batch generator: valid, deterministic, realistic."""

from __future__ import annotations

import codecs
import re
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from benchmarks.reference_model import Row, check_batch, rate_row, read_prices, read_rates
from billing.sample import (
    DEFECTS,
    NOTES_COLUMN,
    generate,
    sample_price_book_bytes,
    sample_tax_table_bytes,
    write_price_book,
    write_tax_table,
)
from shared.rules.batchfile import FORMATS, RAW_COLUMNS, read_chunks
from shared.rules.reference import load_price_book, load_tax_table
from shared.rules.validation import validate
from shared.rules.versions import Rates

_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]{1,6})?")


def test_reference_data_is_valid_and_varied(tmp_path: Path) -> None:
    book = load_price_book(sample_price_book_bytes())
    taxes = load_tax_table(sample_tax_table_bytes())
    assert sample_price_book_bytes().splitlines()[0] == b"product,currency,unit_price,offpeak_unit_price,minimum_charge"
    assert sample_tax_table_bytes().splitlines()[0] == b"region,tax_rate"
    assert len(book.products) >= 10
    currencies = {price.currency for price in book.prices}
    assert {"JPY", "BHD", "USD", "EUR"} <= currencies
    assert any(p.offpeak_price != p.unit_price for p in book.prices)
    assert any(p.minimum_charge is not None for p in book.prices)
    assert {"*", "DE", "FR", "GB", "US-CA", "JP"} <= set(taxes.regions)
    write_price_book(tmp_path / "prices.csv")
    write_tax_table(tmp_path / "taxes.csv")
    assert (tmp_path / "prices.csv").read_bytes() == sample_price_book_bytes()
    assert (tmp_path / "taxes.csv").read_bytes() == sample_tax_table_bytes()


@pytest.mark.parametrize(("fmt", "messy"), [*((fmt, False) for fmt in FORMATS), ("csv", True)])
def test_same_seed_same_bytes(tmp_path: Path, fmt: str, messy: bool) -> None:
    a, b, c = (tmp_path / f"{name}.{fmt}" for name in "abc")
    generate(3_000, a, seed=5, fmt=fmt, chunk_rows=700, messy=messy)
    generate(3_000, b, seed=5, fmt=fmt, chunk_rows=700, messy=messy)
    generate(3_000, c, seed=6, fmt=fmt, chunk_rows=700, messy=messy)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def rows_of(path: Path, fmt: str, *, csv_fast: bool = True) -> list[dict[str, str | None]]:
    with path.open("rb") as source:
        return [row for chunk in read_chunks(source, fmt, csv_fast=csv_fast) for row in chunk.to_pylist()]


def test_messy_file_bills_as_the_clean_one(tmp_path: Path) -> None:
    """The messy file is what a real export writes (a BOM, quoted fields, padding, a notes column with
    commas, doubled quotes and line breaks) and reads, once stripped, to the clean file's rows: the same
    rows accepted and rejected for the same reasons, with the same amounts."""
    clean, messy = tmp_path / "clean.csv", tmp_path / "messy.csv"
    generate(20_000, clean, seed=4, reject_rate=0.05, chunk_rows=3_000)
    generate(20_000, messy, seed=4, reject_rate=0.05, chunk_rows=3_000, messy=True)
    data = messy.read_bytes()
    assert data.startswith(codecs.BOM_UTF8)
    text = data.decode("utf-8-sig")
    assert text.splitlines()[0] == ",".join(f'"{name}"' for name in (*RAW_COLUMNS, NOTES_COLUMN))
    assert re.search(r'^"tx-4-\d+","acct-\d+",', text, re.MULTILINE), "text fields quoted"
    assert re.search(r"^tx-4-\d+ *,acct-\d+ *,", text, re.MULTILINE), "fields left unquoted"
    assert re.search(r',\s+acct-\d+\s*,|," +acct-\d+ *",', text), "values padded with spaces"
    assert '"reviewed, no change"' in text and '""urgent""' in text and '"first line of a note\nand' in text
    assert text.count("\n") > 20_001, "a note's line break inside its quotes"

    book, taxes = sample_price_book_bytes(), sample_tax_table_bytes()
    prices, rates = read_prices(book.decode()), read_rates(taxes.decode())
    expected = check_batch(rows_of(clean, "csv"), prices, rates)
    assert {verdict for verdict in expected if isinstance(verdict, str)} == set(DEFECTS)
    for csv_fast in (True, False):
        rows = rows_of(messy, "csv", csv_fast=csv_fast)
        assert len(rows) == 20_000
        assert {name: (rows[0][name] or "").strip() for name in RAW_COLUMNS} == {
            name: (value or "").strip() for name, value in rows_of(clean, "csv")[0].items() if name in RAW_COLUMNS
        }
        verdicts = check_batch(rows, prices, rates)
        assert verdicts == expected  # every row: the same reason, or the same stripped fields
    amounts = [rate_row(row, prices, rates) for row in expected if isinstance(row, Row)]
    assert len(amounts) > 0.9 * 20_000 and sum(a.total for a in amounts) > 0

    # The pipeline's own vectorised validation agrees: the same accepted rows, the same rejects.
    def validated(path: Path) -> tuple[pa.Table, list[tuple[int, str]]]:
        book_, taxes_ = load_price_book(book), load_tax_table(taxes)
        with path.open("rb") as source:
            rates = Rates.single(book_, taxes_)
            parts = [validate(chunk, rates) for chunk in read_chunks(source, "csv", chunk_rows=3_000)]
        accepted = pa.concat_tables([part[0] for part in parts])
        rejects = [(r["row"], r["reason"]) for part in parts for r in part[1].to_pylist()]
        return accepted, rejects

    clean_accepted, clean_rejects = validated(clean)
    messy_accepted, messy_rejects = validated(messy)
    assert messy_accepted.equals(clean_accepted)
    assert messy_rejects == clean_rejects


def test_generated_rows_are_realistic(tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    generate(20_000, path, seed=2, reject_rate=0.0)
    rows = rows_of(path, "csv")
    assert len(rows) == 20_000
    book = load_price_book(sample_price_book_bytes())
    regions = set(load_tax_table(sample_tax_table_bytes()).regions)
    ids = [r["transaction_id"] for r in rows]
    assert len(set(ids)) == len(ids)
    assert all(_ID.fullmatch(i or "") for i in ids)
    assert all(_ID.fullmatch(r["account_id"] or "") for r in rows)
    assert 300 <= len({r["account_id"] for r in rows}) <= 500
    assert all(_TIMESTAMP.fullmatch(r["timestamp"] or "") for r in rows)
    offsets = Counter(re.search(r"(Z|[+-]\d{2}:\d{2})$", r["timestamp"] or "").group(1) for r in rows)  # type: ignore[union-attr]
    assert {"Z", "+01:00", "-05:00"} <= set(offsets)
    assert all(_QUANTITY.fullmatch(r["quantity"] or "") for r in rows)
    assert {len((r["quantity"] or "").partition(".")[2]) for r in rows} >= {0, 2, 3, 6}
    assert {r["product"] for r in rows} == set(book.products)
    present = [r["region"] for r in rows if r["region"]]
    assert len(present) > 0.8 * len(rows)
    assert set(present) <= regions


def test_generated_rejects_cover_every_reason(tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    generate(20_000, path, seed=4, reject_rate=0.05)
    rows = rows_of(path, "csv")
    assert len(rows) == 20_000
    ids = Counter(r["transaction_id"] for r in rows)
    assert sum(count - 1 for count in ids.values()) > 10  # duplicate transaction ids
    quantities = {r["quantity"] for r in rows}
    assert {"1e3", "-1", "0.1234567"} & quantities
    assert any(r["timestamp"] and not _TIMESTAMP.fullmatch(r["timestamp"]) for r in rows)
    assert any(
        r[field] == "" for r in rows for field in ("transaction_id", "account_id", "timestamp", "product", "quantity")
    )
    assert len(DEFECTS) == 12
    # Roughly reject_rate of the rows are broken.
    clean = [r for r in rows if _TIMESTAMP.fullmatch(r["timestamp"] or "") and _QUANTITY.fullmatch(r["quantity"] or "")]
    assert 0.9 * len(rows) < len(clean) < 0.99 * len(rows)


def test_jsonl_has_some_numeric_quantities(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    generate(2_000, path, seed=1, fmt="jsonl")
    text = path.read_text()
    assert re.search(r'"quantity":[0-9]', text)
    assert '"quantity":"' in text
    assert '"region":null' in text


def test_generate_one_million_rows(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    generate(1_000_000, path, seed=0)
    with path.open("rb") as source:
        assert sum(1 for _ in source) == 1_000_001


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        generate(10, Path("unused"), fmt="xml")
    with pytest.raises(ValueError):
        generate(-1, Path("unused"))
    with pytest.raises(ValueError, match="only a CSV"):
        generate(10, Path("unused"), fmt="jsonl", messy=True)
