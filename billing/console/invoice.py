"""A document as it reads and prints: the figures of an invoice, credit note or debit note laid out once
(:func:`view`), for the console's page and ``billing documents show --format html`` (one template,
``document.html``) and for the PDF (:mod:`billing.console.pdf`).

Everything is rendered from the document's JSON (:meth:`store.Document.to_json_dict`, docs/billing-rules.md):
seller and buyer blocks, the display number once, a title by kind, service period, issue and due dates, the lines
with unit and unit prices, the tax per rate, the totals, and what a note corrects or an invoice is corrected by.
Keys a document issued before they existed lacks are left out, or said to be not recorded. Money in the currency's
own units; the machine-readable forms keep integer minor units."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from shared.rules.reference import money, percent
from store import Document

from . import render

#: A document's title by its kind.
TITLES = {"invoice": "Invoice", "credit_note": "Credit note", "debit_note": "Debit note"}
#: The blocks of a party the document does not record (issued before parties were kept).
NOT_RECORDED = ("not recorded",)
TAX_COLUMNS = ("rate", "regions", "taxable net", "tax")
#: How many characters of a price book's hash name it on a line.
HASH_SHOWN = 8


@dataclass(frozen=True)
class InvoiceView:
    """What a document page shows, every value already text. ``numeric`` says which of ``columns`` are figures
    (right-aligned); ``seller`` and ``buyer`` are the lines of their blocks, the name first."""

    number: int
    title: str
    seller: tuple[str, ...]
    buyer: tuple[str, ...]
    facts: tuple[tuple[str, str], ...]
    columns: tuple[str, ...]
    numeric: tuple[bool, ...]
    lines: tuple[tuple[str, ...], ...]
    taxes: tuple[tuple[str, ...], ...]
    totals: tuple[tuple[str, str], ...]
    references: tuple[tuple[str, str], ...]
    batches: tuple[str, ...]
    note: str
    tax_columns: tuple[str, ...] = TAX_COLUMNS


def document_json(doc: Document | Mapping[str, Any]) -> Mapping[str, Any]:
    """A document as its JSON dict (given one, as it is)."""
    return doc.to_json_dict() if isinstance(doc, Document) else doc


def view(doc: Document | Mapping[str, Any]) -> InvoiceView:
    """The document's figures as text: money in the currency's units (``1,234.56 EUR``), exact."""
    found = document_json(doc)
    currency = found["currency"]
    lines = found.get("lines") or []
    batches = tuple(sorted({batch for line in lines for batch in line.get("batches", ())}))
    columns, numeric, rows = _lines(lines, currency)
    credit = "; negative amounts are credits" if found["kind"] == "credit_note" else ""
    return InvoiceView(
        number=found["number"],
        title=f"{kind_title(found['kind'])} {shown_number(found)}",
        seller=_seller(found.get("seller")),
        buyer=_buyer(found.get("customer"), found["account_id"]),
        facts=_facts(found),
        columns=columns,
        numeric=numeric,
        lines=rows,
        taxes=tuple(_tax(entry, currency) for entry in found.get("taxes") or ()),
        totals=tuple((name, money(found[name], currency)) for name in ("net", "tax", "total")),
        references=(
            ("price books", " ".join(found.get("pricebooks") or ()) or "—"),
            ("tax tables", " ".join(found.get("tax_tables") or ()) or "—"),
            ("batches", " ".join(batches) or "—"),
        ),
        batches=batches,
        note=f"Amounts in {currency}{credit}. Usage of the billing period {found['period']} (UTC).",
    )


def kind_title(kind: str) -> str:
    """``Invoice``, ``Credit note``, ``Debit note`` (any other kind from its name)."""
    return TITLES.get(kind, kind.replace("_", " ").capitalize())


def shown_number(found: Mapping[str, Any]) -> str:
    """The document's display number (``INV-000123``), or ``No. 123`` where it has none."""
    return str(found.get("display_number") or f"No. {found['number']}")


def other_number(found: Mapping[str, Any], number: int) -> str:
    """Another document's number as this one shows its own: with this one's prefix where it has a display number."""
    display, own = found.get("display_number"), f"{found['number']:06d}"
    if display and str(display).endswith(own):
        return f"{str(display)[: -len(own)]}{number:06d}"
    return f"No. {number}"


def _facts(found: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The facts beside the title: period, service period, issue and due dates, account, currency, what it corrects
    or is corrected by (those it records)."""
    facts = [("period", str(found["period"]))]
    service = found.get("service_period")
    if service:
        facts.append(("service period", f"{service['from']} to {service['to']}"))
    facts.append(("issued", render.when(found["issued_at"])))
    if found.get("due_date"):
        facts.append(("due", str(found["due_date"])))
    facts += [("account", str(found["account_id"])), ("currency", str(found["currency"]))]
    for key, name in (("corrects", "corrects"), ("corrected_by", "corrected by")):
        if found.get(key):
            facts.append((name, ", ".join(other_number(found, n) for n in found[key])))
    return tuple(facts)


def _seller(seller: Mapping[str, Any] | None) -> tuple[str, ...]:
    return _party(seller) if seller else NOT_RECORDED


def _buyer(customer: Mapping[str, Any] | None, account_id: str) -> tuple[str, ...]:
    """The customer's block, or the account id alone where it has no customer record."""
    if not customer:
        return (account_id,)
    return (*_party(customer), f"account {account_id}")


def _party(party: Mapping[str, Any]) -> tuple[str, ...]:
    """Name, address lines, country, tax id (those given)."""
    address = [part.strip() for part in str(party.get("address") or "").splitlines() if part.strip()]
    block = [str(party.get("name") or "—"), *address]
    if party.get("country"):
        block.append(str(party["country"]))
    if party.get("tax_id"):
        block.append(f"tax id {party['tax_id']}")
    return tuple(block)


def _lines(
    lines: Sequence[Mapping[str, Any]], currency: str
) -> tuple[tuple[str, ...], tuple[bool, ...], tuple[tuple[str, ...], ...]]:
    """The lines' columns, which are figures, and their text: the price book only where a product's lines are
    split by it, unit and unit price where the lines have them, the off-peak price where one differs."""
    split = {product for product, count in Counter(line["product"] for line in lines).items() if count > 1}
    priced = any("unit_price" in line for line in lines)
    offpeak = any(_differs(line.get("offpeak_unit_price"), line.get("unit_price")) for line in lines)
    columns: list[tuple[str, bool]] = [("product", False)]
    if split:
        columns.append(("price book", False))
    columns += [("transactions", True), ("quantity", True)]
    if priced:
        columns += [("unit", False), (f"unit price ({currency})", True)]
    if offpeak:
        columns.append((f"off-peak price ({currency})", True))
    columns += [("net", True), ("tax", True), ("total", True)]
    rows = []
    for line in lines:
        row = [str(line["product"])]
        if split:
            row.append(str(line.get("pricebook") or "")[:HASH_SHOWN] if line["product"] in split else "")
        row += [f"{line['transactions']:,}", str(line["quantity"])]
        if priced:
            row += [str(line.get("unit") or "—"), str(line.get("unit_price") or "—")]
        if offpeak:
            row.append(str(line.get("offpeak_unit_price") or line.get("unit_price") or "—"))
        row += [money(line[name], currency) for name in ("net", "tax", "total")]
        rows.append(tuple(row))
    return tuple(name for name, _ in columns), tuple(figure for _, figure in columns), tuple(rows)


def _differs(offpeak: str | None, price: str | None) -> bool:
    """Whether an off-peak price is given and differs from the unit price (as numbers where they are)."""
    if offpeak is None or price is None:
        return False
    try:
        return Decimal(offpeak) != Decimal(price)
    except InvalidOperation:
        return offpeak != price


def _tax(entry: Mapping[str, Any], currency: str) -> tuple[str, ...]:
    """One rate of the tax breakdown: the rate as a percentage, its regions, taxable net, tax."""
    regions = ", ".join(_region(region) for region in entry.get("regions") or ()) or "—"
    rate = percent(None if entry["rate"] is None else str(entry["rate"]))
    return (rate, regions, money(entry["net"], currency), money(entry["tax"], currency))


def _region(region: str) -> str:
    return {"*": "other regions (*)", "": "not recorded"}.get(region, region)


def html(
    doc: Document | Mapping[str, Any],
    *,
    standalone: bool = False,
    actions: bool = False,
    csrf: str = "",
    voidable: frozenset[str] = frozenset(),
) -> str:
    """The document's page (``document.html``): ``standalone``, a file of its own (no console links or forms); else
    the console's, with a void form for each of its batches in ``voidable`` when ``actions`` (carrying ``csrf``)."""
    return render.page(
        "document.html", view=view(doc), standalone=standalone, actions=actions, csrf=csrf, voidable=voidable
    )
