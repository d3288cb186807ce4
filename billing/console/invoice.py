"""A document as it reads and prints: the figures of an invoice or adjustment laid out once (:func:`view`), for
the console's page and ``billing documents show --format html`` (one template, ``document.html``) and for the
PDF (:mod:`billing.console.pdf`). Money in the currency's own units; the machine-readable forms keep integer
minor units (:meth:`store.Document.to_json_dict`)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.rules.reference import money
from store import Document

from . import render

#: The issuer's block: a placeholder until the issuer's own details are configured.
ISSUER = ("Issuer name (placeholder)", "Street and number", "Postcode, city, country", "Tax registration number")
COLUMNS = ("product", "transactions", "quantity", "net", "tax", "total")


@dataclass(frozen=True)
class InvoiceView:
    """What a document page shows, every value already text."""

    number: int
    title: str
    facts: tuple[tuple[str, str], ...]
    lines: tuple[tuple[str, ...], ...]
    totals: tuple[tuple[str, str], ...]
    references: tuple[tuple[str, str], ...]
    batches: tuple[str, ...]
    note: str
    issuer: tuple[str, ...] = ISSUER
    columns: tuple[str, ...] = COLUMNS


def view(doc: Document) -> InvoiceView:
    """The document's figures as text: money in the currency's units (``1,234.56 EUR``), exact."""
    batches = tuple(sorted({batch for line in doc.lines for batch in line.batches}))
    lines = tuple(
        (
            line.product,
            f"{line.sums.transactions:,}",
            line.to_json_dict()["quantity"],
            *(money(getattr(line.sums, m), doc.currency) for m in ("net", "tax", "total")),
        )
        for line in doc.lines
    )
    credit = "; negative amounts are credits" if doc.kind == "adjustment" else ""
    return InvoiceView(
        number=doc.number,
        title=f"{doc.kind.capitalize()} No. {doc.number}",
        facts=(
            ("number", str(doc.number)),
            ("kind", doc.kind),
            ("period", doc.period),
            ("account", doc.account_id),
            ("currency", doc.currency),
            ("issued", render.when(doc.issued_at)),
        ),
        lines=lines,
        totals=(
            ("net", money(doc.net, doc.currency)),
            ("tax", money(doc.tax, doc.currency)),
            ("total", money(doc.total, doc.currency)),
        ),
        references=(
            ("price books", " ".join(doc.pricebooks) or "—"),
            ("tax tables", " ".join(doc.tax_tables) or "—"),
            ("batches", " ".join(batches)),
        ),
        batches=batches,
        note=f"Amounts in {doc.currency}{credit}. Usage of the billing period {doc.period} (UTC).",
    )


def html(doc: Document, *, standalone: bool = False, actions: bool = False, csrf: str = "") -> str:
    """The document's page (``document.html``): ``standalone``, a file of its own (no console links or forms);
    else the console's, with void forms when ``actions`` (carrying ``csrf``)."""
    return render.page("document.html", view=view(doc), standalone=standalone, actions=actions, csrf=csrf)
