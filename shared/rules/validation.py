"""Vectorised row validation (``docs/billing-rules.md``, "Parsing" and "Rejections").

Decisions where the rules leave room:

- Timestamps: year 0001–9999, month 01–12, a day that exists in that month (Gregorian leap
  years), hour 00–23, minute and second 00–59 (no leap second), offset ``±HH:MM`` with HH 00–23 and
  MM 00–59 (``-00:00`` is UTC); the UTC instant must also fall in years 0001–9999. A text of the
  timestamp shape whose date or time does not exist is ``invalid_timestamp`` even without an offset
  (fixing the zone could not make it valid); an existing one without offset is
  ``timestamp_without_timezone``.
- Fractions longer than 6 digits are kept exact for rating: ``timestamp_us`` is the instant
  truncated to the microsecond, except that an instant strictly between 19:59:59.999999 and
  20:00:00 UTC becomes 20:00:00.000000. Peak ends at 19:59:59.999999 (the rules), so such an instant is
  off-peak; with that one adjustment, peak/off-peak, weekday and billing day computed from
  ``timestamp_us`` equal those of the full-precision instant.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .batchfile import raw_texts
from .rating import PEAK_END_US, US_PER_DAY
from .reference import DEFAULT_REGION, MICRO
from .schemas import REJECT_SCHEMA
from .versions import Rates

#: Validated transactions, as rating reads them.
ACCEPTED_SCHEMA = pa.schema(
    [
        ("transaction_id", pa.string()),
        ("account_id", pa.string()),
        ("timestamp_us", pa.int64()),  # UTC, microseconds since the Unix epoch
        ("product", pa.string()),
        ("quantity_micro", pa.int64()),  # quantity × 10^6, exact
        ("region", pa.string()),  # resolved tax region; DEFAULT_REGION when the row had none
        ("row", pa.int64()),  # 1-based data row number in the batch file
    ]
)

#: Reason codes in precedence order (the first rule a row breaks names it).
REASONS = (
    "missing_field",
    "invalid_transaction_id",
    "invalid_account_id",
    "invalid_timestamp",
    "timestamp_without_timezone",
    "unknown_product",
    "invalid_quantity",
    "negative_quantity",
    "quantity_out_of_range",
    "too_many_decimals",
    "unknown_region",
    "no_reference_data",
    "duplicate_transaction_id",
)

FIELDS = ("transaction_id", "account_id", "timestamp", "product", "quantity", "region")
REQUIRED = FIELDS[:5]
MAX_QUANTITY = 1_000_000_000

_ID = r"^[A-Za-z0-9._:-]{1,64}$"
_TIMESTAMP = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})?$"
_QUANTITY = r"^[+-]?[0-9]+(\.[0-9]+)?$"
_SUB_MICRO = r"\.[0-9]{6}[0-9]*[1-9]"
_FIRST_DAY, _END_DAY = -719_162, 2_932_897  # 0001-01-01 and 10000-01-01, days since 1970-01-01


def _month_starts() -> np.ndarray:
    """Days since 1970-01-01 of the 1st of every month, index year × 12 + month − 1, years 0–10000.

    Proleptic Gregorian, by H. Hinnant's ``days_from_civil``.
    """
    index = np.arange(10_001 * 12, dtype=np.int64)
    year, month = index // 12, index % 12 + 1
    y = year - (month <= 2)
    yoe = y % 400
    doy = (153 * (month + np.where(month > 2, -3, 9)) + 2) // 5
    return (y // 400) * 146_097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719_468


_MONTH_START = _month_starts()


def validate(chunk: pa.Table, rates: Rates) -> tuple[pa.Table, pa.Table]:
    """Split raw rows into (otherwise valid in ``ACCEPTED_SCHEMA``, rejects in ``REJECT_SCHEMA``), in
    the chunk's order: every rule but ``duplicate_transaction_id`` (see :mod:`.duplicates`). Product and region are
    checked against the version of ``rates`` in force on the row's UTC date; a row dated before the first version is
    ``no_reference_data`` (its product and region cannot be checked).

    ``chunk`` is one of :func:`~shared.rules.batchfile.read_chunks`, or rows taken from one: the string
    columns of ``FIELDS`` (null = absent, not yet stripped), ``row``, and what the raw text of the
    rejects is made of.
    """
    n = chunk.num_rows
    values = {name: _stripped(chunk.column(name)) for name in FIELDS}
    present = {name: _to_bool(pc.greater(pc.binary_length(values[name]), 0)) for name in FIELDS}
    missing = np.zeros(n, dtype=bool)
    for name in REQUIRED:
        missing |= ~present[name]

    bad_tx = ~_matches(values["transaction_id"], _ID)
    bad_account = ~_matches(values["account_id"], _ID)
    ts_status, timestamp_us = _parse_timestamps(values["timestamp"])
    version = rates.in_force(timestamp_us // US_PER_DAY)
    dated = version >= 0
    unknown_product = dated & (rates.products(values["product"], version) < 0)
    q_status, quantity_micro = _parse_quantities(values["quantity"])
    region = pc.if_else(pa.array(present["region"]), values["region"], DEFAULT_REGION)
    unknown_region = dated & (rates.regions(region, version) < 0)

    rules = [missing, bad_tx, bad_account, ts_status == 1, ts_status == 2, unknown_product]
    rules += [q_status == code for code in (1, 2, 3, 4)] + [unknown_region, ~dated]
    reason = np.select(rules, np.arange(1, len(rules) + 1, dtype=np.int8), default=0).astype(np.int8)

    keep = reason == 0
    mask = pa.array(keep)
    accepted = pa.Table.from_arrays(
        [
            values["transaction_id"].filter(mask),
            values["account_id"].filter(mask),
            pa.array(timestamp_us[keep], pa.int64()),
            values["product"].filter(mask),
            pa.array(quantity_micro[keep], pa.int64()),
            region.filter(mask),
            _column(chunk, "row").cast(pa.int64()).filter(mask),
        ],
        schema=ACCEPTED_SCHEMA,
    )
    bad = ~keep
    names = np.array(("", *REASONS), dtype=object)
    rejects = pa.Table.from_arrays(
        [
            _column(chunk, "row").cast(pa.int64()).filter(pa.array(bad)),
            pa.array(names[reason[bad]], pa.string()),
            raw_texts(chunk.filter(pa.array(bad))),
        ],
        schema=REJECT_SCHEMA,
    )
    return accepted, rejects


def _parse_timestamps(ts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(status, UTC microseconds): status 0 valid, 1 invalid, 2 valid but without offset."""
    n = len(ts)
    status = np.ones(n, dtype=np.int8)
    utc_us = np.zeros(n, dtype=np.int64)
    rows = np.flatnonzero(_matches(ts, _TIMESTAMP))
    if not len(rows):
        return status, utc_us
    buf, start, length = _utf8_view(ts)
    start, end = start[rows], start[rows] + length[rows]

    def num(first: np.ndarray, width: int) -> np.ndarray:
        value = np.zeros(len(first), dtype=np.int64)
        for k in range(width):
            value = value * 10 + (buf[first + k].astype(np.int64) - 48)
        return value

    year, month, day = num(start, 4), num(start + 5, 2), num(start + 8, 2)
    hour, minute, second = num(start + 11, 2), num(start + 14, 2), num(start + 17, 2)
    zulu = buf[end - 1] == ord("Z")
    sign = buf[end - 6]
    signed = (sign == ord("+")) | (sign == ord("-"))
    suffix = np.where(zulu, 1, np.where(signed, 6, 0))
    digits = np.where(buf[np.minimum(start + 19, end - 1)] == ord("."), end - start - 20 - suffix, 0)
    fraction = np.zeros(len(rows), dtype=np.int64)
    for k in range(6):
        fraction = fraction * 10 + np.where(
            k < digits, buf[np.minimum(start + 20 + k, end - 1)].astype(np.int64) - 48, 0
        )
    offset_hour, offset_minute = num(end - 5, 2), num(end - 2, 2)
    offset_min = np.where(signed, offset_hour * 60 + offset_minute, 0)
    offset_ok = ~signed | ((offset_hour <= 23) & (offset_minute <= 59))

    month_index = year * 12 + np.clip(month, 1, 12) - 1
    days_in_month = _MONTH_START[month_index + 1] - _MONTH_START[month_index]
    date_ok = (year >= 1) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= days_in_month)
    exists = date_ok & (hour <= 23) & (minute <= 59) & (second <= 59) & offset_ok

    offset_sign = np.where(sign == ord("-"), -1, 1)
    local_us = (
        (_MONTH_START[month_index] + day - 1) * US_PER_DAY + ((hour * 60 + minute) * 60 + second) * MICRO + fraction
    )
    instant = local_us - offset_sign * offset_min * 60 * MICRO
    sub_micro = np.zeros(len(rows), dtype=bool)
    long = np.flatnonzero(digits > 6)
    if len(long):
        sub_micro[long] = _matches(ts.take(pa.array(rows[long])), _SUB_MICRO)
    instant += sub_micro & (np.mod(instant, US_PER_DAY) == PEAK_END_US)
    in_range = (instant >= _FIRST_DAY * US_PER_DAY) & (instant < _END_DAY * US_PER_DAY)

    has_zone = zulu | signed
    status[rows] = np.where(~exists | (has_zone & ~in_range), 1, np.where(has_zone, 0, 2))
    utc_us[rows] = np.where(status[rows] == 0, instant, 0)
    return status, utc_us


def _parse_quantities(q: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(status, micro-units): status 0 valid, 1 invalid, 2 negative, 3 out of range, 4 too many decimals."""
    n = len(q)
    status = np.ones(n, dtype=np.int8)
    micro = np.zeros(n, dtype=np.int64)
    rows = np.flatnonzero(_matches(q, _QUANTITY))
    if not len(rows):
        return status, micro
    text = q.take(pa.array(rows))
    minus = _to_bool(pc.starts_with(text, "-"))
    body = pc.utf8_ltrim(pc.utf8_ltrim(text, "+-"), "0")  # "-007.50" -> "7.50", "0" -> ""
    buf, start, length = _utf8_view(body)
    dot = pc.find_substring(body, ".").to_numpy(zero_copy_only=False).astype(np.int64)
    whole_digits = np.where(dot >= 0, dot, length)
    fraction_digits = np.where(dot >= 0, length - dot - 1, 0)
    last = np.maximum(start + length - 1, 0)

    whole = np.zeros(len(rows), dtype=np.int64)
    for k in range(min(10, int(whole_digits.max()))):  # more than 10 digits is out of range anyway
        digit = buf[np.minimum(start + k, last)].astype(np.int64) - 48
        whole = np.where(k < whole_digits, whole * 10 + digit, whole)
    fraction = np.zeros(len(rows), dtype=np.int64)
    places = min(6, int(fraction_digits.max()))
    for k in range(places):
        digit = buf[np.minimum(start + whole_digits + 1 + k, last)].astype(np.int64) - 48
        fraction = fraction * 10 + np.where(k < fraction_digits, digit, 0)
    fraction *= 10 ** (6 - places)

    fraction_nonzero = np.zeros(len(rows), dtype=bool)
    check = np.flatnonzero(minus | (whole == MAX_QUANTITY))  # the only rows where it matters
    if len(check):
        fraction_nonzero[check] = _matches(body.take(pa.array(check)), r"\.[0-9]*[1-9]")
    negative = minus & ((whole_digits > 0) | fraction_nonzero)
    too_big = (whole_digits > 10) | (whole > MAX_QUANTITY) | ((whole == MAX_QUANTITY) & fraction_nonzero)
    status[rows] = np.select([negative, too_big, fraction_digits > 6], np.array([2, 3, 4], dtype=np.int8), default=0)
    micro[rows] = np.where(status[rows] == 0, whole * MICRO + fraction, 0)
    return status, micro


def _column(chunk: pa.Table, name: str) -> pa.Array:
    return chunk.column(name).combine_chunks()


def _stripped(column: pa.ChunkedArray) -> pa.Array:
    """A field stripped of surrounding Unicode whitespace (a column of nulls becomes strings)."""
    return pc.utf8_trim_whitespace(column.combine_chunks().cast(pa.string()))


def _matches(values: pa.Array, pattern: str) -> np.ndarray:
    """Whether each value matches ``pattern`` (RE2); null never matches."""
    return _to_bool(pc.match_substring_regex(values, pattern))


def _to_bool(values: pa.Array) -> np.ndarray:
    flags: np.ndarray = pc.fill_null(values, False).to_numpy(zero_copy_only=False)
    return flags


def _utf8_view(values: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data bytes, start offsets, byte lengths) of a string array, without copying the data."""
    _, offsets, data = values.buffers()
    offsets = np.frombuffer(offsets, dtype=np.int32)[values.offset : values.offset + len(values) + 1].astype(np.int64)
    buf = np.frombuffer(data, dtype=np.uint8) if data is not None and data.size else np.zeros(1, dtype=np.uint8)
    return buf, offsets[:-1], np.diff(offsets)
