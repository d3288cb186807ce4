"""Deterministic sample data for the demo and the benchmarks: reference data and batch files.

:func:`generate` streams a realistic batch chunk by chunk (vectorised with numpy and Arrow, bounded
memory): ~500 accounts, the products of the sample price book, timestamps over one week (Monday to
Sunday, peak and off-peak) written with various UTC offsets, small quantities with up to 6
decimals, mostly present regions, unique transaction ids, and a share ``reject_rate`` of rows
deliberately broken in one of the ways listed in :data:`DEFECTS`. The same arguments always give the
same bytes.

``messy=True`` writes the same rows the way real CSV exports do (a UTF-8 byte order mark, text
fields quoted, spaces around values, a free-text ``notes`` column, now and then with a comma, a
doubled quote or a line break inside its quotes), all of it allowed by the parsing rules: the file
reads to exactly the clean file's fields once each is stripped, so the same rows are accepted and
rejected, for the same reasons, with the same amounts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shared.rules.batchfile import FORMATS, RAW_COLUMNS

_PRICE_BOOK = """\
product,currency,unit_price,offpeak_unit_price,minimum_charge
compute.vcpu-hour,USD,0.0416,0.0291,
compute.gpu-hour,USD,2.48,1.736,0.50
storage.gb-month,EUR,0.0184,,
network.egress-gb,EUR,0.087,0.0435,0.01
api.request,GBP,0.000035,,0.05
sms.message,GBP,0.0395,,
voice.minute,CHF,0.0125,0.008,
transfer.jp-gb,JPY,3.5,2.1,100
messaging.kr,KRW,12.75,,500
backup.gb,BHD,0.0075,0.00375,0.100
vm.kw-hour,KWD,0.0123,0.0099,
"""

_TAX_TABLE = """\
region,tax_rate
*,0
DE,0.19
FR,0.20
GB,0.20
US-CA,0.0725
JP,0.10
CH,0.081
BH,0.10
"""

#: The kinds of deliberately bad rows :func:`generate` writes (named after the expected reason).
DEFECTS = (
    "missing_field",
    "invalid_transaction_id",
    "invalid_account_id",
    "invalid_timestamp",
    "timestamp_without_timezone",
    "invalid_quantity",
    "negative_quantity",
    "quantity_out_of_range",
    "too_many_decimals",
    "unknown_product",
    "unknown_region",
    "duplicate_transaction_id",
)

_ACCOUNTS = 500
_WEEK_START = np.datetime64("2026-03-02T00:00:00", "s")  # a Monday
_SECONDS = 7 * 86_400
_OFFSETS = (
    ("Z", 0),
    ("+01:00", 60),
    ("+02:00", 120),
    ("-05:00", -300),
    ("-08:00", -480),
    ("+05:30", 330),
    ("+09:00", 540),
)
_OFFSET_WEIGHTS = (0.35, 0.2, 0.1, 0.15, 0.08, 0.05, 0.07)
_REGIONS = ("DE", "FR", "GB", "US-CA", "JP", "CH", "BH", "")
_REGION_WEIGHTS = (0.2, 0.12, 0.18, 0.2, 0.08, 0.06, 0.04, 0.12)
_DECIMALS = (0, 1, 2, 3, 6)
_DECIMAL_WEIGHTS = (0.3, 0.15, 0.25, 0.2, 0.1)
_BAD_VALUES = {
    "invalid_transaction_id": ("tx id with spaces", "tx#42", "x" * 65),
    "invalid_account_id": ("acct/7", "acct 7", "ä-account"),
    "invalid_timestamp": ("2026-02-30T10:00:00Z", "2026-03-02 10:00:00Z", "yesterday", "2026-03-02T10:00Z"),
    "timestamp_without_timezone": ("2026-03-02T10:00:00", "2026-03-04T21:30:15.5"),
    "invalid_quantity": ("1e3", "12.", ".5", "one", "1,5"),
    "negative_quantity": ("-1", "-0.25", "-3.500"),
    "quantity_out_of_range": ("1000000000.000001", "5000000000"),
    "too_many_decimals": ("0.1234567", "1.0000000"),
    "unknown_product": ("compute.tpu-hour", "COMPUTE.VCPU-HOUR"),
    "unknown_region": ("ZZ", "de", "US-NY"),
}
#: The messy CSV: its extra column, what a note says (weights below), and how often things happen.
NOTES_COLUMN = "notes"
_NOTES = (
    "",
    "monthly usage",
    "reviewed, no change",
    'customer said "urgent"',
    "credit applied",
    "Überstunden genehmigt",
    "migrated from legacy system; see ticket 4411, 4412",
    "n/a",
    "first line of a note\nand its second line",
)
_NOTE_WEIGHTS = (0.45, 0.15, 0.1, 0.05, 0.08, 0.04, 0.05, 0.075, 0.005)
_QUOTED_ROWS = 0.25  # share of rows whose text fields are all quoted (the rest quote only what needs it)
_PADDED_CELLS = 0.15  # share of cells with spaces before them, and (independently) after them
_PADS = (" ", "  ", "   ")
_QUOTE_NEEDED = '[,"\r\n]'

_DEFECT_FIELDS = {
    "invalid_transaction_id": "transaction_id",
    "invalid_account_id": "account_id",
    "invalid_timestamp": "timestamp",
    "timestamp_without_timezone": "timestamp",
    "invalid_quantity": "quantity",
    "negative_quantity": "quantity",
    "quantity_out_of_range": "quantity",
    "too_many_decimals": "quantity",
    "unknown_product": "product",
    "unknown_region": "region",
}


def sample_price_book_bytes() -> bytes:
    """The sample price book as CSV bytes (currencies with 0, 2 and 3 minor digits)."""
    return _PRICE_BOOK.encode()


def sample_tax_table_bytes() -> bytes:
    """The sample tax table as CSV bytes (with the ``*`` default row)."""
    return _TAX_TABLE.encode()


def write_price_book(path: str | Path) -> None:
    """Write the sample price book CSV to ``path``."""
    Path(path).write_bytes(sample_price_book_bytes())


def write_tax_table(path: str | Path) -> None:
    """Write the sample tax table CSV to ``path``."""
    Path(path).write_bytes(sample_tax_table_bytes())


def generate(
    rows: int,
    out: Path,
    *,
    seed: int = 0,
    fmt: str = "csv",
    reject_rate: float = 0.002,
    chunk_rows: int = 100_000,
    messy: bool = False,
) -> None:
    """Write a sample batch of ``rows`` rows in ``fmt`` (csv, jsonl or parquet) to ``out``; ``messy``
    (CSV only): the same rows as a real export writes them (see the module's docstring)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown batch format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if messy and fmt != "csv":
        raise ValueError("only a CSV batch can be messy")
    if rows < 0 or chunk_rows < 1 or not 0 <= reject_rate <= 1:
        raise ValueError("rows must be >= 0, chunk_rows >= 1 and reject_rate within 0..1")
    rng = np.random.default_rng(seed)
    products = pa.array([line.split(",", 1)[0] for line in _PRICE_BOOK.splitlines()[1:]], pa.string())
    accounts = pc.binary_join_element_wise(
        "acct-", pc.utf8_lpad(pa.array(np.arange(_ACCOUNTS)).cast(pa.string()), 4, "0"), ""
    )
    schema = pa.schema([(name, pa.string()) for name in RAW_COLUMNS])
    mess = np.random.default_rng([seed, 1])  # its own stream: the rows are drawn as for the clean file
    with open(out, "wb") as sink:
        writer = pq.ParquetWriter(sink, schema, compression="zstd") if fmt == "parquet" else None
        if messy:
            sink.write(("\ufeff" + ",".join(f'"{name}"' for name in (*RAW_COLUMNS, NOTES_COLUMN)) + "\n").encode())
        elif fmt == "csv":
            sink.write((",".join(RAW_COLUMNS) + "\n").encode())
        try:
            for start in range(0, rows, chunk_rows):
                table = _chunk(rng, start, min(chunk_rows, rows - start), seed, products, accounts, reject_rate)
                if writer is not None:
                    writer.write_table(table)
                elif messy:
                    sink.write(_messy_csv_bytes(mess, table))
                elif fmt == "csv":
                    sink.write(_csv_bytes(table))
                else:
                    sink.write(_jsonl_bytes(rng, table))
        finally:
            if writer is not None:
                writer.close()


def _chunk(
    rng: np.random.Generator,
    start: int,
    n: int,
    seed: int,
    products: pa.Array,
    accounts: pa.Array,
    reject_rate: float,
) -> pa.Table:
    """``n`` rows starting at data row index ``start`` (0-based), defects applied."""
    ids = pc.binary_join_element_wise(
        f"tx-{seed}-", pc.utf8_lpad(pa.array(np.arange(start, start + n, dtype=np.int64)).cast(pa.string()), 9, "0"), ""
    )
    account = accounts.take(pa.array((_ACCOUNTS * rng.random(n) ** 2).astype(np.int64)))  # a few big accounts
    weights = np.linspace(2.0, 0.5, len(products))
    product = products.take(pa.array(rng.choice(len(products), n, p=weights / weights.sum())))
    columns = {
        "transaction_id": ids,
        "account_id": account,
        "timestamp": _timestamps(rng, n),
        "product": product,
        "quantity": _quantities(rng, n),
        "region": pa.array(
            np.array(_REGIONS, dtype=object)[rng.choice(len(_REGIONS), n, p=_REGION_WEIGHTS)], pa.string()
        ),
    }
    bad = np.flatnonzero(rng.random(n) < reject_rate)
    if len(bad):
        _apply_defects(rng, columns, bad)
    return pa.table(columns)


def _timestamps(rng: np.random.Generator, n: int) -> pa.Array:
    """Instants over one week written in local time with one of several UTC offsets."""
    instant = _WEEK_START + rng.integers(0, _SECONDS, n).astype("timedelta64[s]")
    which = rng.choice(len(_OFFSETS), n, p=_OFFSET_WEIGHTS)
    minutes = np.array([m for _, m in _OFFSETS])[which]
    local = pa.array(instant + minutes.astype("timedelta64[m]"), pa.timestamp("s"))
    text = pc.strftime(local, format="%Y-%m-%dT%H:%M:%S")
    micros = pc.utf8_lpad(pa.array(rng.integers(0, 1_000_000, n)).cast(pa.string()), 6, "0")
    fraction = pc.if_else(pa.array(rng.random(n) < 0.15), pc.binary_join_element_wise(".", micros, ""), "")
    suffix = pa.array(np.array([s for s, _ in _OFFSETS], dtype=object)[which], pa.string())
    return pc.binary_join_element_wise(text, fraction, suffix, "")


def _quantities(rng: np.random.Generator, n: int) -> pa.Array:
    """Small non-negative decimals with 0 to 6 fractional digits (trailing zeros kept)."""
    whole = np.where(rng.random(n) < 0.8, rng.integers(0, 10, n), rng.integers(10, 5_000, n))
    whole_text = pa.array(whole).cast(pa.string())
    fraction = pc.utf8_lpad(pa.array(rng.integers(0, 1_000_000, n)).cast(pa.string()), 6, "0")
    candidates = [whole_text] + [
        pc.binary_join_element_wise(whole_text, ".", pc.utf8_slice_codeunits(fraction, 0, d), "") for d in _DECIMALS[1:]
    ]
    return pc.choose(pa.array(rng.choice(len(_DECIMALS), n, p=_DECIMAL_WEIGHTS)), *candidates)


def _apply_defects(rng: np.random.Generator, columns: dict[str, pa.Array], bad: np.ndarray) -> None:
    """Break the rows at positions ``bad`` in place, each in one way drawn from :data:`DEFECTS`."""
    kinds = rng.choice(len(DEFECTS), len(bad))
    for k, kind in enumerate(DEFECTS):
        where = bad[kinds == k]
        if kind == "duplicate_transaction_id":
            where = where[where > 0]
        if not len(where):
            continue
        if kind == "missing_field":
            field = RAW_COLUMNS[int(rng.integers(0, 5))]
            values = pa.array([""] * len(where), pa.string())
        elif kind == "duplicate_transaction_id":
            field = "transaction_id"
            values = columns[field].take(pa.array(where - 1))
        else:
            field = _DEFECT_FIELDS[kind]
            choices = _BAD_VALUES[kind]
            values = pa.array([choices[i] for i in rng.integers(0, len(choices), len(where))], pa.string())
        mask = np.zeros(len(columns[field]), dtype=bool)
        mask[where] = True
        columns[field] = pc.replace_with_mask(columns[field], pa.array(mask), values)


def _csv_bytes(table: pa.Table) -> bytes:
    """The rows as CSV lines, quoting only the values that need it."""
    cells = []
    for name in RAW_COLUMNS:
        values = table.column(name).combine_chunks()
        quoted = pc.binary_join_element_wise('"', pc.replace_substring(values, '"', '""'), '"', "")
        cells.append(pc.if_else(pc.match_substring_regex(values, '[,"\r\n]'), quoted, values))
    return _concatenated(pc.binary_join_element_wise(pc.binary_join_element_wise(*cells, ","), "\n", ""))


def _messy_csv_bytes(rng: np.random.Generator, table: pa.Table) -> bytes:
    """The rows as a real export writes them: a ``notes`` column added; every cell possibly padded
    with spaces (inside its quotes when quoted); the text fields of a share of rows quoted, and in
    the others only the values that need it."""
    n = table.num_rows
    notes = pa.array(np.array(_NOTES, dtype=object)[rng.choice(len(_NOTES), n, p=_NOTE_WEIGHTS)], pa.string())
    quoted_row = rng.random(n) < _QUOTED_ROWS
    cells = []
    for name, values in [*((name, table.column(name).combine_chunks()) for name in RAW_COLUMNS), ("notes", notes)]:
        need = pc.match_substring_regex(values, _QUOTE_NEEDED)
        quote = need if name == "quantity" else pc.or_(need, pa.array(quoted_row))
        padded = values
        for side in ("before", "after"):
            pads = pa.array(np.array(_PADS, dtype=object)[rng.choice(len(_PADS), n)], pa.string())
            pad = pc.if_else(pa.array(rng.random(n) < _PADDED_CELLS), pads, "")
            padded = pc.binary_join_element_wise(*((pad, padded) if side == "before" else (padded, pad)), "")
        quoted = pc.binary_join_element_wise('"', pc.replace_substring(padded, '"', '""'), '"', "")
        cells.append(pc.if_else(quote, quoted, padded))
    return _concatenated(pc.binary_join_element_wise(pc.binary_join_element_wise(*cells, ","), "\n", ""))


def _jsonl_bytes(rng: np.random.Generator, table: pa.Table) -> bytes:
    """The rows as JSON Lines; some numeric quantities as JSON numbers, empty regions as null."""
    n = table.num_rows
    pieces = []
    for name in RAW_COLUMNS:
        values = table.column(name).combine_chunks()
        quoted = pc.binary_join_element_wise('"', pc.replace_substring(values, '"', '\\"'), '"', "")
        if name == "quantity":
            number = pc.match_substring_regex(values, r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$")
            as_number = pc.and_(number, pa.array(rng.random(n) < 0.05))
            quoted = pc.if_else(as_number, values, quoted)
        elif name == "region":
            quoted = pc.if_else(pc.equal(values, ""), "null", quoted)
        pieces.append(pc.binary_join_element_wise(f'"{name}":', quoted, ""))
    lines = pc.binary_join_element_wise("{", pc.binary_join_element_wise(*pieces, ","), "}\n", "")
    return _concatenated(lines)


def _concatenated(strings: pa.Array) -> bytes:
    """The values of a null-free string array back to back (straight from its data buffer)."""
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int32)[strings.offset : strings.offset + len(strings) + 1]
    data = strings.buffers()[2]
    return b"" if data is None else data.to_pybytes()[offsets[0] : offsets[-1]]
