"""``billing reference``, ``void``, ``close`` and ``documents``: the commands of the ledger (thin: parse, then
delegate to :mod:`billing.client`, :mod:`billing.ledger` and :class:`store.Store`). Tables show money in the
currency's own units; JSON keeps integer minor units."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, cast

import click

from shared.localstack import resolve
from shared.logs import redact

from ..ledger import close_summary, void_batch
from ..sql import open_store

if TYPE_CHECKING:
    from collections.abc import Iterable

    from store import Document

#: How many characters of a price book's hash a table shows.
HASH_SHOWN = 12


@click.group("reference", invoke_without_command=True)
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("."))
@click.pass_context
def reference(ctx: click.Context, out_dir: Path) -> None:
    """Write the sample price book and tax table (pricebook.csv, taxes.csv); or, with a subcommand, register
    the reference data batches are rated with."""
    if ctx.invoked_subcommand is not None:
        return
    from ..sample import write_price_book, write_tax_table

    out_dir.mkdir(parents=True, exist_ok=True)
    write_price_book(out_dir / "pricebook.csv")
    write_tax_table(out_dir / "taxes.csv")
    click.echo(f"wrote {out_dir / 'pricebook.csv'} and {out_dir / 'taxes.csv'}")


@reference.command("set")
@click.option("--pricebook", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--taxes", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--sample", is_flag=True, help="The sample price book and tax table (what `billing reference` writes).")
@click.option(
    "--effective-from",
    metavar="YYYY-MM-DD",
    help="The UTC date the version is in force from (default: today, UTC; with --sample, every date).",
)
def reference_set(pricebook: Path | None, taxes: Path | None, sample: bool, effective_from: str | None) -> None:
    """Register a price book and a tax table (stored by content hash) as the version in force from a UTC date on
    (one of the same date is replaced): `billing submit` without --pricebook and --taxes rates each row with the
    version in force on its date."""
    from shared.refstore import FIRST_DATE

    from .. import client
    from ..sample import sample_price_book_bytes, sample_tax_table_bytes

    if sample == (pricebook is not None or taxes is not None) or (not sample and (pricebook is None or taxes is None)):
        raise click.UsageError("give --pricebook and --taxes, or --sample")
    start = _effective_date(effective_from, FIRST_DATE if sample else datetime.now(UTC).date())
    if sample:
        book, table = sample_price_book_bytes(), sample_tax_table_bytes()
    else:
        assert pricebook is not None and taxes is not None
        book, table = pricebook.read_bytes(), taxes.read_bytes()
    registry = asyncio.run(client.register(resolve(), book, table, start))
    version = next(r.version for r in registry if r.version.effective_from == start)
    click.echo(
        f"registered price book {version.pricebook_hash} and tax table {version.taxes_hash}, in force from {start}"
    )


def _effective_date(text: str | None, default: date) -> date:
    """The date ``--effective-from`` names (``default`` without it); a text that is not one is a usage error."""
    if text is None:
        return default
    try:
        if len(text) != len("YYYY-MM-DD"):
            raise ValueError
        return date.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a date YYYY-MM-DD", param_hint="--effective-from") from None


@reference.command("list")
@click.option("--json", "as_json", is_flag=True, help="A JSON array of the versions.")
def reference_list(as_json: bool) -> None:
    """The registered versions, oldest first: the UTC date each is in force from, its price book's and tax table's
    content hashes, when it was registered."""
    from .. import client

    registry = asyncio.run(client.registry(resolve()))
    if as_json:
        click.echo(json.dumps([registered.to_json() for registered in registry], indent=2))
        return
    if not registry:
        raise click.ClickException("no reference data registered (billing reference set --pricebook P --taxes T)")
    click.echo(f"{'effective_from':<14} {'pricebook':<64} {'taxes':<64} registered_at")
    for registered in registry:
        version, at = registered.version, registered.registered_at
        click.echo(
            f"{version.effective_from!s:<14} {version.pricebook_hash:<64} {version.taxes_hash:<64} "
            f"{'-' if at is None else at.isoformat(timespec='seconds')}"
        )


@click.command("void")
@click.argument("batch_id")
def void(batch_id: str) -> None:
    """Void a complete batch: it counts nowhere from now on (its aggregates stay stored, marked voided), and its
    batch id stays taken (submitting it again is refused). An unknown, incomplete or voided batch is refused."""
    settings = resolve()
    with open_store(settings) as store:
        voided = asyncio.run(void_batch(settings, store, batch_id))
    click.echo(redact(f"batch {batch_id} (seq {voided.seq}) voided: it counts nowhere from now on"))


@click.command("close")
@click.option("--period", required=True, help="The billing period, YYYY-MM (UTC), ended.")
@click.option(
    "--require-customers",
    is_flag=True,
    help="Refuse (nothing issued) if an account to document has no customer record.",
)
@click.option("--list", "list_all", is_flag=True, help="Print each document issued as well.")
def close(period: str, require_customers: bool, list_all: bool) -> None:
    """Close an ended billing period: issue a document (an invoice the first time, then credit or debit notes
    that correct it) for each account and currency whose billed amounts changed since its last document of the
    period, in one transaction, and print a summary. With nothing changed it issues nothing and says so. A
    seller must be registered first (billing seller set)."""
    from shared.settings import Settings

    checked = _period(period)
    with open_store(Settings()) as store:
        issued = store.close_period(checked, require_customers=require_customers)
    for line in close_summary(checked, issued):
        click.echo(line)
    if list_all:
        for doc in issued:
            click.echo(_summary(doc))


def _period(period: str) -> str:
    """``period`` if it is ``YYYY-MM``; refused on one line (exit 2) else."""
    import re

    from store import PERIOD_PATTERN, LedgerError

    if not re.fullmatch(PERIOD_PATTERN, period):
        raise LedgerError(f"billing period {period!r} is not YYYY-MM")
    return period


@click.group("documents")
def documents_group() -> None:
    """The documents closes issued: invoices, credit notes and debit notes, numbered, never changed."""


@documents_group.command("list")
@click.option("--period", help="Only this billing period (YYYY-MM).")
@click.option("--account", help="Only this account.")
@click.option("--kind", type=click.Choice(["invoice", "credit_note", "debit_note"]), help="Only this kind.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def documents_list(period: str | None, account: str | None, kind: str | None, fmt: str) -> None:
    """List documents by number (JSON: each in full, money in integer minor units)."""
    from shared.settings import Settings

    checked = None if period is None else _period(period)
    with open_store(Settings()) as store:
        found = store.documents(period=checked, account=account, kind=kind)
    if fmt == "json":
        click.echo(json.dumps([doc.to_json_dict() for doc in found], indent=2))
    elif not found:
        click.echo("(no documents)")
    else:
        for doc in found:
            click.echo(_summary(doc))


@documents_group.command("show")
@click.argument("number", type=click.IntRange(min=1))
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json", "html", "pdf"]), default="table", show_default=True
)
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="Write to this file (pdf: required).")
def documents_show(number: int, fmt: str, output: Path | None) -> None:
    """Show one document: its head, its lines (per product, with the batches that changed each) and totals; html
    and pdf read and print as an invoice, money in the currency's units (json: integer minor units)."""
    from shared.settings import Settings

    if fmt == "pdf" and output is None:
        raise click.UsageError("--format pdf writes a file: give --output F")
    with open_store(Settings()) as store:
        found = store.document(number)
    if found is None:
        raise click.ClickException(f"no document numbered {number}")
    if fmt == "pdf":
        from ..console.pdf import pdf  # ReportLab: only for PDF

        assert output is not None
        output.write_bytes(pdf(found))
        click.echo(f"wrote {output}")
        return
    if fmt == "html":
        from ..console.invoice import html  # Jinja2: only for HTML

        text = html(found, standalone=True)
    else:
        text = json.dumps(found.to_json_dict(), indent=2) if fmt == "json" else _document_table(found)
    if output is None:
        click.echo(text)
    else:
        output.write_text(text + "\n", encoding="utf-8")
        click.echo(f"wrote {output}")


@documents_group.command("export")
@click.option("--period", help="Only this billing period (YYYY-MM).")
@click.option("--what", type=click.Choice(["documents", "lines", "taxes"]), default="documents", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["csv", "parquet"]), required=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="The file to write.")
def documents_export(period: str | None, what: str, fmt: str, out: Path) -> None:
    """Export the register: one record per document (number, display number, kind, period, account, the
    customer's name, currency, net, tax, total, issued, due, what it corrects), per line (number, display
    number, product, transactions, quantity, net, tax, total, price book, unit, unit price, off-peak unit price)
    or per tax rate of a document (number, display number, rate, regions, net, tax), money in integer minor
    units."""
    from shared.settings import Settings

    from ..register import Format, What, register, write_register

    checked = None if period is None else _period(period)
    with open_store(Settings()) as store:
        found = store.documents(period=checked)
    table = register(found, cast("What", what), cast("Format", fmt))
    write_register(table, cast("Format", fmt), out)
    record = {"documents": "document", "lines": "line", "taxes": "tax"}[what]
    click.echo(f"wrote {table.num_rows} {record} record(s) to {out}")


def _document_table(found: Document) -> str:
    """The document as terminal text, money in the currency's units: its head, a line per product and price book
    (with the price book's unit and prices, ``-`` where not known), the totals and the tax per rate."""
    from shared.rules.reference import money  # Arrow and NumPy: only where money is shown

    first, last = found.service_period
    head = [
        f"{found.kind.replace('_', ' ').capitalize()} {found.display_number} (No. {found.number})",
        f"period {found.period} ({first} to {last})   account {found.account_id}   currency {found.currency}",
        f"issued {found.issued_at.isoformat()}   due {found.due_date or '-'}",
        *_parties(found),
        f"price books {', '.join(found.pricebooks) or '-'}   tax tables {', '.join(found.tax_tables) or '-'}",
        f"money in {found.currency}, in its own units",
    ]
    names = ("product", "price book", "unit", "unit price", "off-peak", "transactions", "quantity", "net", "tax")
    rows: list[tuple[str, ...]] = [(*names, "total", "batches")]
    for line in found.lines:
        shown = line.to_json_dict()
        prices = [shown[k] or "-" for k in ("unit", "unit_price", "offpeak_unit_price")]
        amounts = [money(shown[m], found.currency) for m in ("net", "tax", "total")]
        counted = (str(line.sums.transactions), shown["quantity"])
        book = line.pricebook[:HASH_SHOWN] or "-"
        rows.append((line.product, book, *prices, *counted, *amounts, " ".join(line.batches)))
    totals = (money(getattr(found, m), found.currency) for m in ("net", "tax", "total"))
    rows.append(("total", "", "", "", "", "", "", *totals, ""))
    return "\n".join(head + _aligned(rows, right=range(3, 10)) + _tax_block(found))


def _tax_block(found: Document) -> list[str]:
    """The tax per rate: rate, regions, taxable net and tax (none for a document without tax entries)."""
    from shared.rules.reference import money, percent

    if not found.taxes:
        return []
    rows: list[tuple[str, ...]] = [("tax rate", "regions", "net", "tax")]
    for tax in found.taxes:
        amounts = (money(tax.net, found.currency), money(tax.tax, found.currency))
        rows.append((percent(tax.rate), " ".join(tax.regions) or "-", *amounts))
    return ["", "tax by rate", *_aligned(rows, right=(0, 2, 3))]


def _aligned(rows: list[tuple[str, ...]], right: Iterable[int]) -> list[str]:
    """The rows as columns, those of ``right`` right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    at_right = set(right)
    cells = (
        (
            cell.rjust(w) if i in at_right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=False))
        )
        for row in rows
    )
    return ["  ".join(row).rstrip() for row in cells]


def _parties(found: Document) -> list[str]:
    """The seller, the buyer, and what the document corrects or is corrected by."""
    seller = found.seller
    buyer = found.customer
    lines = [
        f"seller {seller['name']}, {seller['address']}, {seller['country']}, tax id {seller['tax_id']}"
        if seller
        else "",
        f"buyer {buyer['name']} ({found.account_id}), {buyer['address']}, {buyer['country']}"
        + (f", tax id {buyer['tax_id']}" if buyer["tax_id"] else "")
        if buyer
        else f"buyer {found.account_id} (no customer record)",
        f"corrects {', '.join(map(str, found.corrects))}" if found.corrects else "",
        f"corrected by {', '.join(map(str, found.corrected_by))}" if found.corrected_by else "",
    ]
    return [line for line in lines if line]


def _summary(doc: Document) -> str:
    from shared.rules.reference import money

    amounts = "  ".join(f"{m} {money(getattr(doc, m), doc.currency)}" for m in ("net", "tax", "total"))
    return f"{doc.display_number}  {doc.kind:<11}  {doc.period}  {doc.account_id}  {amounts}"


COMMANDS: tuple[click.Command, ...] = (reference, void, close, documents_group)
