"""Charts drawn on the server as inline SVG with matplotlib (no JavaScript, nothing fetched to show them).

Text is kept as SVG text (escaped by matplotlib), never read as math. Money is drawn from exact minor units
turned into currency units for the drawing only; the figures people read are in the tables beside.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime

import matplotlib as mpl
import numpy as np
from matplotlib import ticker
from matplotlib.figure import Figure

mpl.rcParams.update({"svg.fonttype": "none", "text.parse_math": False, "svg.hashsalt": "billing"})

WIDTH, HEIGHT = 7.0, 3.2  # inches; the page scales the SVG to its width
LIMIT = 20  # most bars or series in one chart
#: Axis labels with thousands separators, never an offset or scientific notation.
_TICKS = ticker.FuncFormatter(lambda x, _: f"{x:,.0f}" if abs(x) >= 1000 else f"{x:,.6g}")


def bars(labels: Sequence[str], values: Sequence[float], *, title: str, unit: str) -> str:
    """Horizontal bars, largest first (at most 20)."""
    pairs = sorted(zip(labels, values, strict=True), key=lambda p: -p[1])[:LIMIT][::-1]
    figure = Figure(figsize=(WIDTH, max(1.6, 0.32 * len(pairs) + 0.9)))
    axes = figure.add_subplot()
    axes.barh([label for label, _ in pairs], [value for _, value in pairs], color="#3b6ea5")
    axes.xaxis.set_major_formatter(_TICKS)
    axes.set_xlabel(unit)
    return _svg(figure, title)


def lines(series: Mapping[str, Mapping[date | datetime, float]], *, title: str, unit: str) -> str:
    """One line per series over time (the 20 largest series), with markers."""
    kept = sorted(series.items(), key=lambda item: -sum(item[1].values()))[:LIMIT]
    figure = Figure(figsize=(WIDTH, HEIGHT))
    axes = figure.add_subplot()
    for name, points in kept:
        xs = sorted(points)
        moments = np.array([_naive_utc(x) for x in xs], dtype="datetime64[s]")
        axes.plot(moments, [points[x] for x in xs], marker="o", markersize=3, label=name)
    figure.autofmt_xdate()
    axes.yaxis.set_major_formatter(_TICKS)
    axes.set_ylabel(unit)
    if len(kept) > 1:
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _svg(figure, title)


def timeline(phases: Sequence[tuple[str, float, float]], *, title: str) -> str:
    """Phases as bars from their start to their end, in seconds since the first."""
    figure = Figure(figsize=(WIDTH, max(1.6, 0.35 * len(phases) + 0.9)))
    axes = figure.add_subplot()
    names = [name for name, _, _ in phases][::-1]
    axes.barh(names, [max(end - start, 0.0) for _, start, end in phases][::-1], left=[s for _, s, _ in phases][::-1])
    axes.set_xlabel("seconds since accepted")
    return _svg(figure, title)


def _naive_utc(moment: date | datetime) -> date | datetime:
    """numpy keeps no time zone: an aware instant as naive UTC."""
    return moment.astimezone(UTC).replace(tzinfo=None) if isinstance(moment, datetime) and moment.tzinfo else moment


def _svg(figure: Figure, title: str) -> str:
    figure.suptitle(title, fontsize="medium")
    figure.tight_layout()
    out = io.StringIO()
    figure.savefig(out, format="svg", metadata=dict.fromkeys(("Date", "Creator", "Format", "Type")))
    text = out.getvalue()
    return text[text.index("<svg") :]
