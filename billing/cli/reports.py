"""``billing report``: aggregates, invoices and rejects, of one batch or summed over batches."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, cast

import click
from rich.markup import escape

from ..ledger import pending_report
from ..sql import open_store
from .output import console

if TYPE_CHECKING:
    from .. import reports


@click.command()
@click.argument("kind", type=click.Choice(["aggregates", "invoices", "rejects"]))
@click.option("--batch", "batch_ids", multiple=True, help="Only these batches, whatever their state (repeatable).")
@click.option("--period", help="Billing period YYYY-MM.")
@click.option("--account", "accounts", multiple=True, help="Only these accounts (repeatable).")
@click.option("--product", "products", multiple=True, help="Only these products (repeatable).")
@click.option("--currency", "currencies", multiple=True, help="Only these currencies (repeatable).")
@click.option("--from", "start", type=click.DateTime(["%Y-%m-%d"]), help="First billing day (UTC), inclusive.")
@click.option("--to", "end", type=click.DateTime(["%Y-%m-%d"]), help="Last billing day (UTC), inclusive.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "parquet", "html"]), default="table")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path))
def report(
    kind: str,
    batch_ids: tuple[str, ...],
    period: str | None,
    accounts: tuple[str, ...],
    products: tuple[str, ...],
    currencies: tuple[str, ...],
    start: datetime | None,
    end: datetime | None,
    fmt: str,
    output: Path | None,
) -> None:
    """Print or write a report: of one batch (--batch ID), or summed over every complete batch (or the
    batches named) under the filters. net, tax and total are exact integers in minor units (cents for USD) in
    csv, json and parquet; table and html (one self-contained file, with charts) show currency units. Invoices of
    a closed --period also name the pending difference (what the next close would issue)."""
    from shared.settings import Settings
    from store import Filters

    from .. import reports  # pandas and the report writers: only for the commands that report

    try:
        filters = Filters(accounts, products, currencies, batch_ids, start and start.date(), end and end.date(), period)
    except ValueError as exc:  # a malformed period, a reversed range
        raise click.UsageError(str(exc)) from exc
    one_batch = batch_ids[0] if len(batch_ids) == 1 and filters == Filters(batches=batch_ids) else None
    settings = Settings()
    with open_store(settings) as store:
        frame = getattr(reports, kind)(store, one_batch or filters)
        pending = (
            pending_report(store, period, accounts, currencies)
            if kind == "invoices" and period and not batch_ids
            else []
        )
    if fmt == "html":
        from ..console import render  # Jinja2 and the charts: only for HTML

        text: str | None = render.report_file(kind, frame, filters, output)
    else:
        text = reports.write_report(frame, cast("reports.Format", fmt), output)
    if text is not None:
        click.echo(text)
    if one_batch is None and kind != "rejects":
        included = ", ".join(b.batch_id for b in frame.attrs["batches"]) or "none"
        console.print(f"batches included: {escape(included)}", soft_wrap=True)
        for batch in frame.attrs["excluded"]:
            console.print(f"batch excluded ({batch.state}): {escape(batch.batch_id)}", soft_wrap=True)
    for line in pending:
        console.print(escape(line), soft_wrap=True, highlight=False)


COMMANDS: tuple[click.Command, ...] = (report,)
