"""Dated reference data through the real roles: a registry of two versions (``billing reference set
--effective-from``), one file with rows on both sides of the switch and rows before the first version; every
aggregate (per account, product, day and price book; per period, price book, tax region and rate) and every reject
against the reference model, and the price books' rows recorded by the controller."""

from __future__ import annotations

import csv
import hashlib
import json
import random
from collections import defaultdict
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from click.testing import CliRunner, Result

from benchmarks import reference_model as model
from billing.cli import cli
from billing.sample import sample_price_book_bytes, sample_tax_table_bytes
from shared.settings import Settings
from store import Store
from store.schema import aggregates, period_aggregates, rejects
from support.roles import Roles

FIELDS = ("transaction_id", "account_id", "timestamp", "product", "quantity", "region")
PRODUCTS = ("compute.vcpu-hour", "storage.gb-month", "transfer.jp-gb", "api.request")
FIRST, SWITCH = date(2026, 2, 1), date(2026, 3, 1)


def billing(*args: str, code: int = 0) -> Result:
    done = CliRunner().invoke(cli, list(args))
    assert done.exit_code == code, done.output
    return done


def march_books(folder: Path) -> tuple[Path, Path]:
    """The version from March: the sample price book with every unit price doubled and a unit column, and the
    sample tax table with a default rate of 21%."""
    rows = list(csv.DictReader(sample_price_book_bytes().decode().splitlines()))
    book = folder / "march-prices.csv"
    with book.open("w", newline="") as file:
        writer = csv.DictWriter(file, [*rows[0], "unit"])
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "unit_price": str(Decimal(row["unit_price"]) * 2), "unit": "each"})
    taxes = folder / "march-taxes.csv"
    lines = sample_tax_table_bytes().decode().splitlines()
    taxes.write_text("\n".join(line if not line.startswith("*,") else "*,0.21" for line in lines) + "\n")
    return book, taxes


def write_batch(path: Path, count: int) -> list[dict[str, str | None]]:
    pick = random.Random(11)
    days = ["2026-01-31T23:59:59Z", "2026-02-01T00:00:00Z", "2026-02-27T12:00:00Z", "2026-02-28T23:30:00-01:00"]
    days += ["2026-03-01T00:00:00Z", "2026-03-02T09:00:00+01:00", "2026-03-07T10:00:00Z"]
    rows: list[dict[str, str | None]] = [
        {
            "transaction_id": f"t{i}",
            "account_id": f"acct-{pick.randrange(3)}",
            "timestamp": pick.choice(days),
            "product": pick.choice(PRODUCTS),
            "quantity": "-1" if i % 23 == 7 else f"{pick.randrange(1, 9000) / 100}",
            "region": pick.choice(["", "DE", "JP", "XX"]),
        }
        for i in range(count)
    ]
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return rows


def test_a_file_spanning_two_versions_is_rated_by_the_version_of_each_row_s_date(
    settings_env: Settings, roles: Roles, tmp_path: Path
) -> None:
    sample_book, sample_taxes = tmp_path / "prices.csv", tmp_path / "taxes.csv"
    sample_book.write_bytes(sample_price_book_bytes())
    sample_taxes.write_bytes(sample_tax_table_bytes())
    book, taxes = march_books(tmp_path)
    refused = billing(
        "reference", "set", "--pricebook", str(book), "--taxes", str(taxes), "--effective-from", "2026-3-1", code=2
    )
    assert "--effective-from" in refused.output and "'2026-3-1' is not a date" in refused.output
    assert billing("reference", "list", "--json").output.strip() == "[]", "nothing registered"
    billing("reference", "set", "--sample", "--effective-from", "2026-03-01")  # replaced below: same date
    billing("reference", "set", "--pricebook", str(book), "--taxes", str(taxes), "--effective-from", "2026-03-01")
    billing(
        "reference",
        "set",
        "--pricebook",
        str(sample_book),
        "--taxes",
        str(sample_taxes),
        "--effective-from",
        "2026-02-01",
    )
    listed = json.loads(billing("reference", "list", "--json").output)
    hashes = [
        (hashlib.sha256(b.read_bytes()).hexdigest(), hashlib.sha256(t.read_bytes()).hexdigest())
        for b, t in ((sample_book, sample_taxes), (book, taxes))
    ]
    assert [(v["effective_from"], v["pricebook"], v["taxes"]) for v in listed] == [
        ("2026-02-01", *hashes[0]),
        ("2026-03-01", *hashes[1]),
    ]
    assert all(v["registered_at"] for v in listed)
    assert "2026-02-01" in billing("reference", "list").output

    rows = write_batch(tmp_path / "batch.csv", 600)
    billing("submit", str(tmp_path / "batch.csv"), "--batch-id", "spanning")
    for role in ("initiator", "processor", "controller"):
        roles.burst(role)

    versions = [
        model.read_version(FIRST, *(path.read_bytes().decode() for path in (sample_book, sample_taxes))),
        model.read_version(SWITCH, *(path.read_bytes().decode() for path in (book, taxes))),
    ]
    checked = model.check_batch_dated(rows, versions)
    want: dict[tuple[str, ...], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    want_per_period: dict[tuple[str, ...], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for row in checked:
        if isinstance(row, model.Row):
            rated = model.rate_dated(row, versions)
            period = (row.account_id, row.product, rated.billing_day[:7], rated.pricebook, rated.region, rated.tax_rate)
            for sums in (
                want[row.account_id, row.product, rated.billing_day, rated.pricebook],
                want_per_period[period],
            ):
                sums[:] = [sums[0] + 1, sums[1] + rated.net, sums[2] + rated.tax, sums[3] + rated.total]
    reasons = {n: r for n, r in enumerate(checked, start=1) if isinstance(r, str)}
    assert {"no_reference_data", "unknown_region", "negative_quantity"} <= set(reasons.values())

    with Store(settings_env.sql_url_value) as store:
        status = store.batch("spanning")
        assert status is not None and status.state == "complete"
        with store.engine.connect() as conn:
            got = {
                (r.account_id, r.product, r.billing_day.isoformat(), r.pricebook): _sums(r)
                for r in conn.execute(sa.select(aggregates).where(aggregates.c.batch_id == "spanning"))
            }
            a = period_aggregates
            got_per_period = {
                (r.account_id, r.product, r.period, r.pricebook, r.region, r.tax_rate): _sums(r)
                for r in conn.execute(sa.select(a).where(a.c.batch_id == "spanning"))
            }
            rejected = dict(
                conn.execute(sa.select(rejects.c.row, rejects.c.reason).where(rejects.c.batch_id == "spanning")).all()
            )
        assert got == dict(want)
        assert got_per_period == dict(want_per_period)
        assert rejected == reasons
        assert {key[3] for key in got} == {hashes[0][0], hashes[1][0]}, "both price books rated rows"
        recorded = store.price_book_rows([hashes[0][0], hashes[1][0]])
    assert {product for _, product in recorded} >= set(PRODUCTS)
    assert {row.unit for (book_hash, _), row in recorded.items() if book_hash == hashes[1][0]} == {"each"}


def _sums(row: sa.Row[Any]) -> list[int]:
    return [row.transactions, int(row.net), int(row.tax), int(row.total)]
