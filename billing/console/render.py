"""The console's HTML: one Jinja2 environment (autoescaped: everything from a batch file shows as text), money
in the currency's own units, and the self-contained HTML report of ``billing report --format html``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from shared.rules.reference import CURRENCY_DIGITS, money
from store import MONEY_COLUMNS, Filters

from . import charts

ENVIRONMENT = jinja2.Environment(
    loader=jinja2.PackageLoader("billing.console", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def units(minor: int, currency: str) -> float:
    """Minor units as currency units, for drawing only (the tables show the exact figure)."""
    return float(Decimal(minor).scaleb(-CURRENCY_DIGITS.get(currency, 0)))


def when(value: datetime | str | None) -> str:
    """A UTC timestamp to the second, or an em dash."""
    if value is None:
        return "—"
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def kind_label(kind: str) -> str:
    """A document kind as words (``credit_note`` -> ``credit note``)."""
    return kind.replace("_", " ")


ENVIRONMENT.filters.update(money=money, when=when, kind_label=kind_label)


def page(template: str, **context: Any) -> str:
    """Render one template of ``templates/``."""
    return ENVIRONMENT.get_template(template).render(**context)


def daily_net_chart(rows: Iterable[Mapping[str, Any]], *, title: str) -> list[str]:
    """Per currency, net per billing day, one line per product (rows with ``billing_day``, ``product``)."""
    by_currency: dict[str, dict[str, dict[date, float]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    for row in rows:
        day = row["billing_day"]
        day = date.fromisoformat(day) if isinstance(day, str) else day
        by_currency[row["currency"]][row["product"]][day] += units(row["net"], row["currency"])
    return [
        charts.lines(series, title=f"{title} ({currency})", unit=currency)
        for currency, series in sorted(by_currency.items())
    ]


def net_by_chart(rows: Iterable[Mapping[str, Any]], label: str, *, title: str) -> list[str]:
    """Per currency, bars of net per ``label`` (account, product)."""
    by_currency: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in rows:
        by_currency[row["currency"]][str(row[label])] += units(row["net"], row["currency"])
    return [
        charts.bars(list(values), list(values.values()), title=f"{title} ({currency})", unit=currency)
        for currency, values in sorted(by_currency.items())
    ]


def report_file(kind: str, frame: pd.DataFrame, filters: Filters, output: Path | None) -> str | None:
    """``billing report --format html``: one self-contained page (inline style, inline SVG charts, no script,
    nothing to fetch) with the table and its charts; its text, or None once written to ``output``."""
    records = [{str(k): v for k, v in record.items()} for record in frame.to_dict(orient="records")]
    if kind == "invoices":
        drawn = net_by_chart(records, "account_id", title="Net by account")
    elif kind == "aggregates":
        drawn = daily_net_chart(records, title="Daily net by product")
    else:
        counts: dict[str, float] = defaultdict(float)
        for record in records:
            counts[str(record["reason"])] += 1
        title = "Rejects by reason"
        drawn = [charts.bars(list(counts), list(counts.values()), title=title, unit="rows")] if counts else []
    text = page(
        "report.html",
        kind=kind,
        filters=filters,
        columns=list(frame.columns),
        rows=records,
        money_columns=MONEY_COLUMNS,
        charts=drawn,
        batches=frame.attrs.get("batches", []),
        excluded=frame.attrs.get("excluded", []),
        generated=datetime.now().astimezone(),
    )
    if output is None:
        return text
    output.write_text(text, encoding="utf-8")
    return None
