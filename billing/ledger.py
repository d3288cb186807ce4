"""``billing reference``, ``billing void``, ``billing close``, ``billing documents``: the commands of the ledger
(thin: parse, then delegate to :mod:`billing.client` and the store library, :mod:`store.ledger` and
:mod:`store.documents`). Tables show money in the currency's own units; JSON keeps integer minor units."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from shared.localstack import resolve
from shared.logs import redact

if TYPE_CHECKING:
    from store.documents import Document


@click.group("reference", invoke_without_command=True)
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("."))
@click.pass_context
def reference(ctx: click.Context, out_dir: Path) -> None:
    """Write the sample price book and tax table (pricebook.csv, taxes.csv); or, with a subcommand, register
    the reference data batches are rated with."""
    if ctx.invoked_subcommand is not None:
        return
    from billing.sample import write_price_book, write_tax_table

    out_dir.mkdir(parents=True, exist_ok=True)
    write_price_book(out_dir / "pricebook.csv")
    write_tax_table(out_dir / "taxes.csv")
    click.echo(f"wrote {out_dir / 'pricebook.csv'} and {out_dir / 'taxes.csv'}")


@reference.command("set")
@click.option("--pricebook", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--taxes", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--sample", is_flag=True, help="The sample price book and tax table (what `billing reference` writes).")
def reference_set(pricebook: Path | None, taxes: Path | None, sample: bool) -> None:
    """Register a price book and a tax table (stored by content hash): `billing submit` without --pricebook
    or --taxes rates with them from now on."""
    from billing.sample import sample_price_book_bytes, sample_tax_table_bytes

    from . import client

    if sample == (pricebook is not None or taxes is not None) or (not sample and (pricebook is None or taxes is None)):
        raise click.UsageError("give --pricebook and --taxes, or --sample")
    if sample:
        book, table = sample_price_book_bytes(), sample_tax_table_bytes()
    else:
        assert pricebook is not None and taxes is not None
        book, table = pricebook.read_bytes(), taxes.read_bytes()
    registered = asyncio.run(client.register(resolve(), book, table))
    click.echo(f"registered price book {registered.pricebook_hash} and tax table {registered.taxes_hash}")


@reference.command("show")
def reference_show() -> None:
    """Print the registered price book's and tax table's content hashes."""
    from . import client

    registered = asyncio.run(client.registered(resolve()))
    if registered is None:
        raise click.ClickException("no reference data registered (billing reference set --pricebook P --taxes T)")
    click.echo(f"pricebook {registered.pricebook_hash}")
    click.echo(f"taxes {registered.taxes_hash}")


@click.command("void")
@click.argument("batch_id")
def void(batch_id: str) -> None:
    """Void a complete batch: it counts nowhere from now on (its aggregates stay stored, marked voided), and its
    batch id stays taken (submitting it again is refused). An unknown, incomplete or voided batch is refused."""
    from store import Store
    from store.ledger import AlreadyVoided
    from store.ledger import void as void_batch

    from . import client

    settings = resolve()
    with Store(settings.sql_url_value) as store:
        try:
            voided = void_batch(store.engine, batch_id)
        except AlreadyVoided:
            asyncio.run(client.mark_voided(settings, batch_id))  # a void whose inbox mark was never written
            raise
    asyncio.run(client.mark_voided(settings, batch_id))
    click.echo(redact(f"batch {batch_id} (seq {voided.seq}) voided: it counts nowhere from now on"))


@click.command("close")
@click.option("--period", required=True, help="The billing period, YYYY-MM (UTC), not in the future.")
def close(period: str) -> None:
    """Close a billing period: issue a document (an invoice the first time, then signed adjustments) for each
    account and currency whose billed amounts changed since its last document of the period, in one
    transaction. With nothing changed it issues nothing and says so."""
    from shared.settings import Settings
    from store import Store
    from store.documents import close as close_period

    with Store(Settings().sql_url_value) as store:
        issued = close_period(store.engine, period)
    if not issued:
        click.echo(f"period {period}: nothing to issue (no billed amount changed since its last close)")
        return
    first, last = issued[0].number, issued[-1].number
    click.echo(f"period {period}: issued {len(issued)} document(s), numbers {first} to {last}")
    for doc in issued:
        click.echo(_summary(doc))


@click.group("documents")
def documents_group() -> None:
    """The documents closes issued: invoices and adjustments, numbered, never changed."""


@documents_group.command("list")
@click.option("--period", help="Only this billing period (YYYY-MM).")
@click.option("--account", help="Only this account.")
@click.option("--kind", type=click.Choice(["invoice", "adjustment"]), help="Only this kind.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def documents_list(period: str | None, account: str | None, kind: str | None, fmt: str) -> None:
    """List documents by number (JSON: each in full, money in integer minor units)."""
    from shared.settings import Settings
    from store import Store
    from store.documents import documents

    with Store(Settings().sql_url_value) as store:
        found = documents(store.engine, period=period, account=account, kind=kind)
    if fmt == "json":
        click.echo(json.dumps([doc.to_json_dict() for doc in found], indent=2))
    elif not found:
        click.echo("(no documents)")
    else:
        for doc in found:
            click.echo(_summary(doc))


@documents_group.command("show")
@click.argument("number", type=click.IntRange(min=1))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def documents_show(number: int, fmt: str) -> None:
    """Show one document: its head, its lines (per product, with the batches that changed each) and totals."""
    from shared.settings import Settings
    from store import Store
    from store.documents import document

    with Store(Settings().sql_url_value) as store:
        found = document(store.engine, number)
    if found is None:
        raise click.ClickException(f"no document numbered {number}")
    if fmt == "json":
        click.echo(json.dumps(found.to_json_dict(), indent=2))
        return
    click.echo(f"{found.kind.capitalize()} No. {found.number}")
    click.echo(f"period {found.period}   account {found.account_id}   currency {found.currency}")
    click.echo(f"issued {found.issued_at.isoformat()}")
    click.echo(f"price books {', '.join(found.pricebooks) or '-'}   tax tables {', '.join(found.tax_tables) or '-'}")
    rows: list[tuple[str, ...]] = [("product", "transactions", "quantity", "net", "tax", "total", "batches")]
    for line in found.lines:
        line_json = line.to_json_dict()
        money = [units(line_json[m], found.currency) for m in ("net", "tax", "total")]
        rows.append((line.product, str(line.sums.transactions), line_json["quantity"], *money, " ".join(line.batches)))
    rows.append(("total", "", "", *(units(getattr(found, m), found.currency) for m in ("net", "tax", "total")), ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [
            cell.rjust(w) if i in (1, 2, 3, 4, 5) else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        click.echo("  ".join(cells).rstrip())


def units(minor: int, currency: str) -> str:
    """Minor units in the currency's own units (ISO 4217 exponent), exactly: ``-1234, "USD"`` → ``-12.34``."""
    from shared.rules.reference import CURRENCY_DIGITS

    digits = CURRENCY_DIGITS[currency]
    sign = "-" if minor < 0 else ""
    whole, fraction = divmod(abs(minor), 10**digits)
    return f"{sign}{whole:,}" + (f".{fraction:0{digits}d}" if digits else "")


def _summary(doc: Document) -> str:
    money = "  ".join(f"{m} {units(getattr(doc, m), doc.currency)}" for m in ("net", "tax", "total"))
    return f"{doc.number}  {doc.kind:<10}  {doc.period}  {doc.account_id}  {doc.currency}  {money}"


def add_commands(group: click.Group) -> None:
    """Add the ledger's commands to the ``billing`` group."""
    for command in (reference, void, close, documents_group):
        group.add_command(command)
