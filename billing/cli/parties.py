"""``billing seller`` and ``billing customers``: the parties the documents name (thin: parse, then delegate to
:class:`store.Store`). Both are versioned in the store; a close snapshots the ones in force."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..sql import open_store

if TYPE_CHECKING:
    from store import Customer, Seller


@click.group("seller")
def seller_group() -> None:
    """The seller every document names (one per ledger, versioned): a close is refused until one is set."""


@seller_group.command("set")
@click.option("--name", required=True, help="The seller's legal name.")
@click.option("--address", required=True, help="The seller's postal address (one line, or several joined by ', ').")
@click.option("--country", required=True, help="ISO 3166-1 alpha-2 code, e.g. DE.")
@click.option("--tax-id", required=True, help="The seller's tax (VAT) identification number.")
@click.option("--payment-terms-days", type=int, default=30, show_default=True, help="Days from issue to due date.")
@click.option("--prefix", default="INV-", show_default=True, help="What display numbers start with.")
def seller_set(name: str, address: str, country: str, tax_id: str, payment_terms_days: int, prefix: str) -> None:
    """Register the seller as its newest version: documents issued from now on name it; those issued before keep
    the seller they were issued with."""
    from shared.settings import Settings
    from store import Seller

    seller = Seller(name, address, country, tax_id, payment_terms_days, prefix)  # refused: one line, exit 2
    with open_store(Settings()) as store:
        stored = store.set_seller(seller)
    click.echo(
        f"seller version {stored.version}: {stored.name} ({stored.country}, tax id {stored.tax_id}), "
        f"due {stored.payment_terms_days} days after issue, "
        f"numbers shown as {stored.prefix}000001, {stored.prefix}000002, …"
    )


@seller_group.command("show")
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
def seller_show(as_json: bool) -> None:
    """Print the seller in force."""
    from shared.settings import Settings

    with open_store(Settings()) as store:
        found = store.seller()
    if found is None:
        raise click.ClickException(
            "no seller registered (billing seller set --name N --address A --country CC --tax-id T)"
        )
    click.echo(json.dumps(found.to_json_dict(), indent=2) if as_json else _seller_text(found))


def _seller_text(seller: Seller) -> str:
    return "\n".join(
        [
            f"{seller.name}",
            f"address       {seller.address}",
            f"country       {seller.country}",
            f"tax id        {seller.tax_id}",
            f"payment terms {seller.payment_terms_days} days",
            f"numbers       {seller.prefix}000001, …",
            f"version       {seller.version} (set {seller.set_at.isoformat() if seller.set_at else '-'})",
        ]
    )


@click.group("customers")
def customers_group() -> None:
    """The customers documents are addressed to, by account id (versioned)."""


@customers_group.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def customers_import(file: Path) -> None:
    """Add or update customers from a CSV file (header row) or JSON Lines: account_id, name, address, country
    (ISO 3166-1 alpha-2), optional tax_id and email. All or nothing: a bad row refuses the whole file."""
    from shared.settings import Settings

    from ..customers import read_customers

    found = read_customers(file)
    with open_store(Settings()) as store:
        done = store.import_customers(found)
    click.echo(
        f"imported {len(found)} customer(s) from {file.name}: "
        f"{done.added} added, {done.changed} changed, {done.unchanged} unchanged"
    )


@customers_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
def customers_list(as_json: bool) -> None:
    """List the customers in force by account id."""
    from shared.settings import Settings

    with open_store(Settings()) as store:
        found = store.customers()
    if as_json:
        click.echo(json.dumps([c.to_json_dict() for c in found], indent=2))
    elif not found:
        click.echo("(no customers)")
    else:
        for customer in found:
            click.echo("  ".join(_cells(customer)))


@customers_group.command("show")
@click.argument("account")
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
def customers_show(account: str, as_json: bool) -> None:
    """Print the customer in force for ACCOUNT."""
    from shared.settings import Settings

    with open_store(Settings()) as store:
        found = store.customer(account)
    if found is None:
        raise click.ClickException(f"no customer record for account {account}")
    shown: dict[str, Any] = found.to_json_dict()
    click.echo(json.dumps(shown, indent=2) if as_json else "\n".join(f"{k:<10} {v or '-'}" for k, v in shown.items()))


def _cells(customer: Customer) -> list[str]:
    return [customer.account_id, customer.name, customer.country, customer.tax_id or "-", customer.email or "-"]


COMMANDS: tuple[click.Command, ...] = (seller_group, customers_group)
