"""A document as PDF, laid out with ReportLab's platypus from the figures of :func:`billing.console.invoice.view`
(the HTML page's too): A4, the seller's block and the document's facts, the buyer's block, the lines with totals,
the tax by rate, the reference data. The font is ReportLab's own Bitstream Vera, embedded, so that the file reads
the same everywhere."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any
from xml.sax.saxutils import escape

from reportlab.lib import colors
from reportlab.lib.enums import TA_RIGHT
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import ParagraphStyle
from reportlab.lib.units import mm
from reportlab.pdfbase import pdfmetrics
from reportlab.pdfbase.ttfonts import TTFont
from reportlab.platypus import Flowable, Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle

from store import Document

from .invoice import InvoiceView, view

FONT, BOLD = "Vera", "VeraBd"
#: The least width of the product column.
PRODUCT_WIDTH = 40 * mm
INK, RULE, SHADE = colors.HexColor("#1d2330"), colors.HexColor("#c9ced6"), colors.HexColor("#eef1f5")


def _styles() -> dict[str, ParagraphStyle]:
    for name in (FONT, BOLD):
        if name not in pdfmetrics.getRegisteredFontNames():
            pdfmetrics.registerFont(TTFont(name, f"{name}.ttf"))
    body = ParagraphStyle("body", fontName=FONT, fontSize=9, leading=12, textColor=INK)
    return {
        "body": body,
        "small": ParagraphStyle("small", parent=body, fontSize=7.5, leading=10),
        "title": ParagraphStyle("title", parent=body, fontName=BOLD, fontSize=16, leading=20, spaceAfter=4),
        "bold": ParagraphStyle("bold", parent=body, fontName=BOLD),
    }


def pdf(doc: Document | Mapping[str, Any]) -> bytes:
    """The document (or its JSON dict) as a PDF file's bytes."""
    shown = view(doc)
    styles = _styles()
    out = io.BytesIO()
    page = SimpleDocTemplate(
        out,
        pagesize=A4,
        title=shown.title,
        author=shown.seller[0],
        subject=f"{shown.title}, {shown.note}",
        leftMargin=18 * mm,
        rightMargin=18 * mm,
        topMargin=16 * mm,
        bottomMargin=16 * mm,
    )
    page.build(
        [
            *_head(shown, styles, page.width),
            Spacer(1, 8 * mm),
            _lines(shown, styles, page.width),
            *_taxes(shown, styles),
            *_foot(shown, styles),
        ]
    )
    return out.getvalue()


def _text(value: str, style: ParagraphStyle) -> Paragraph:
    return Paragraph(escape(value), style)


def _party(heading: str, lines: Sequence[str], styles: dict[str, ParagraphStyle]) -> list[Flowable]:
    """A party's block: its heading, then its name in bold and the rest of its lines."""
    return [
        _text(heading.upper(), styles["small"]),
        _text(lines[0], styles["bold"]),
        *(_text(line, styles["body"]) for line in lines[1:]),
    ]


def _head(shown: InvoiceView, styles: dict[str, ParagraphStyle], width: float) -> list[Flowable]:
    """The seller's block beside the title and facts, the buyer's block below."""
    facts = Table(
        [[_text(name, styles["small"]), _text(value, styles["body"])] for name, value in shown.facts],
        colWidths=[26 * mm, None],
        style=TableStyle([("VALIGN", (0, 0), (-1, -1), "TOP"), ("LEFTPADDING", (0, 0), (-1, -1), 0)]),
    )
    head = Table(
        [[_party("Seller", shown.seller, styles), [_text(shown.title, styles["title"]), facts]]],
        colWidths=[width * 0.5, width * 0.5],
        style=TableStyle([("VALIGN", (0, 0), (-1, -1), "TOP"), ("LEFTPADDING", (0, 0), (-1, -1), 0)]),
    )
    return [head, Spacer(1, 6 * mm), *_party("Buyer", shown.buyer, styles)]


def _lines(shown: InvoiceView, styles: dict[str, ParagraphStyle], width: float) -> Table:
    """The lines and totals: plain text (figures right-aligned) in columns as wide as their widest value (their
    headings wrap), the product column taking the rest (its names wrap too); a smaller type where the columns would
    not fit otherwise."""
    count = len(shown.columns)
    texts = [list(shown.columns), *(list(line) for line in shown.lines)]
    texts += [[name, *([""] * (count - 2)), value] for name, value in shown.totals]

    def widest(text: str, size: float, whole: bool) -> float:
        return max(
            float(pdfmetrics.stringWidth(part, BOLD, size)) for part in ([text] if whole else text.split() or [""])
        )

    def figure_widths(size: float) -> list[float]:
        return [max(widest(row[i], size, n > 0) for n, row in enumerate(texts)) + 5 * mm for i in range(1, count)]

    size = styles["body"].fontSize
    room = width - PRODUCT_WIDTH
    if sum(figure_widths(size)) > room:
        size *= room / sum(figure_widths(size))
    body = ParagraphStyle("cell", parent=styles["body"], fontSize=size, leading=size * 1.3)
    bold = ParagraphStyle("cell-bold", parent=body, fontName=BOLD)
    heading = ParagraphStyle("cell-heading", parent=bold, alignment=TA_RIGHT)
    first_total = len(texts) - len(shown.totals)
    rows = [[_text(row[0], body if 0 < n < first_total else bold), *row[1:]] for n, row in enumerate(texts)]
    rows[0][1:] = [_text(name, heading if shown.numeric[i] else bold) for i, name in enumerate(texts[0]) if i]
    numbers = figure_widths(size)
    return Table(
        rows,
        colWidths=[width - sum(numbers), *numbers],
        repeatRows=1,
        style=TableStyle(
            [
                ("FONT", (1, 0), (-1, -1), FONT, size, body.leading),
                ("FONT", (1, 0), (-1, 0), BOLD, size, body.leading),
                ("FONT", (1, first_total), (-1, -1), BOLD, size, body.leading),
                ("TEXTCOLOR", (0, 0), (-1, -1), INK),
                *(("ALIGN", (i, 0), (i, -1), "RIGHT") for i, figure in enumerate(shown.numeric) if figure),
                ("ALIGN", (-1, first_total), (-1, -1), "RIGHT"),
                ("BACKGROUND", (0, 0), (-1, 0), SHADE),
                ("LINEBELOW", (0, 0), (-1, -1), 0.4, RULE),
                ("LINEABOVE", (0, first_total), (-1, first_total), 1, INK),
                ("VALIGN", (0, 0), (-1, -1), "TOP"),
                *(("SPAN", (0, row), (-2, row)) for row in range(first_total, len(rows))),
            ]
        ),
    )


def _taxes(shown: InvoiceView, styles: dict[str, ParagraphStyle]) -> list[Flowable]:
    """The tax by rate (rate, regions, taxable net, tax), where the document has it."""
    if not shown.taxes:
        return []
    size, leading = styles["body"].fontSize, styles["body"].leading
    table = Table(
        [list(shown.tax_columns), *(list(entry) for entry in shown.taxes)],
        hAlign="LEFT",
        style=TableStyle(
            [
                ("FONT", (0, 0), (-1, -1), FONT, size, leading),
                ("FONT", (0, 0), (-1, 0), BOLD, size, leading),
                ("TEXTCOLOR", (0, 0), (-1, -1), INK),
                ("ALIGN", (0, 0), (0, -1), "RIGHT"),
                ("ALIGN", (2, 0), (-1, -1), "RIGHT"),
                ("BACKGROUND", (0, 0), (-1, 0), SHADE),
                ("LINEBELOW", (0, 0), (-1, -1), 0.4, RULE),
            ]
        ),
    )
    return [Spacer(1, 6 * mm), _text("Tax by rate", styles["bold"]), Spacer(1, 2 * mm), table]


def _foot(shown: InvoiceView, styles: dict[str, ParagraphStyle]) -> list[Flowable]:
    notes = [shown.note, *(f"{name}: {value}" for name, value in shown.references)]
    return [Spacer(1, 6 * mm), *(_text(note, styles["small"]) for note in notes)]
