"""``billing reference``, ``billing void``: the commands of the ledger (thin: parse, then delegate to
:mod:`billing.client` and the store library, :mod:`store.ledger`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from shared.localstack import resolve
from shared.logs import redact


@click.group("reference", invoke_without_command=True)
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("."))
@click.pass_context
def reference(ctx: click.Context, out_dir: Path) -> None:
    """Write the sample price book and tax table (pricebook.csv, taxes.csv); or, with a subcommand, register
    the reference data batches are rated with."""
    if ctx.invoked_subcommand is not None:
        return
    from shared.rules.sample import write_price_book, write_tax_table

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
    from shared.rules.sample import sample_price_book_bytes, sample_tax_table_bytes

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


def add_commands(group: click.Group) -> None:
    """Add the ledger's commands to the ``billing`` group."""
    for command in (reference, void):
        group.add_command(command)
