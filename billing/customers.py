"""A customers file as ``billing customers import`` reads it: CSV with a header row, or JSON Lines (one object a
line), with the columns ``account_id``, ``name``, ``address``, ``country`` and optional ``tax_id``, ``email``.
All or nothing: the first bad row refuses the whole file, naming its row number and why."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.errors import InputError

if TYPE_CHECKING:
    from store import Customer

COLUMNS = ("account_id", "name", "address", "country", "tax_id", "email")
REQUIRED = COLUMNS[:4]
JSON_LINES_SUFFIXES = (".jsonl", ".ndjson", ".json")


class CustomersRefused(InputError):
    """A customers file refused whole (one line: the file, the row and why)."""


def read_customers(path: Path) -> list[Customer]:
    """The customers of the file at ``path``, in file order; :class:`CustomersRefused` for a file not read whole."""
    from store import Customer, LedgerError

    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CustomersRefused(f"{path.name}: not UTF-8 (byte {exc.start}); nothing imported") from None
    except OSError as exc:
        raise CustomersRefused(f"{path.name}: cannot be read ({exc.strerror}); nothing imported") from None
    json_lines = path.suffix.lower() in JSON_LINES_SUFFIXES or text.lstrip().startswith("{")
    found: list[Customer] = []
    rows_of: dict[str, int] = {}
    for number, record in _json_lines(path.name, text) if json_lines else _csv(path.name, text):
        try:
            customer = Customer(**record)
        except LedgerError as exc:
            raise CustomersRefused(f"{path.name} row {number}: {exc}; nothing imported") from None
        if customer.account_id in rows_of:
            first = rows_of[customer.account_id]
            raise CustomersRefused(
                f"{path.name} row {number}: account id {customer.account_id} again (row {first}); nothing imported"
            )
        rows_of[customer.account_id] = number
        found.append(customer)
    if not found:
        raise CustomersRefused(f"{path.name}: no customers in it; nothing imported")
    return found


def _checked(name: str, number: int, record: dict[str, Any]) -> dict[str, Any]:
    """The record's values by column; unknown, missing or non-text values refused."""
    unknown = sorted(set(record) - set(COLUMNS))
    if unknown:
        raise CustomersRefused(f"{name} row {number}: unknown column {unknown[0]!r}; nothing imported")
    for column in COLUMNS:
        value = record.get(column)
        if value is None and column in REQUIRED:
            raise CustomersRefused(f"{name} row {number}: {column} is missing; nothing imported")
        if value is not None and not isinstance(value, str):
            raise CustomersRefused(f"{name} row {number}: {column} is not text; nothing imported")
    return {column: record.get(column) for column in COLUMNS}


def _csv(name: str, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
    header = reader.fieldnames or []
    missing = [column for column in REQUIRED if column not in header]
    if missing:
        raise CustomersRefused(f"{name}: the header has no column {missing[0]!r}; nothing imported")
    try:
        for number, row in enumerate(reader, start=1):
            if None in row:
                raise CustomersRefused(f"{name} row {number}: more fields than the header names; nothing imported")
            if any(value is None for value in row.values()):
                raise CustomersRefused(f"{name} row {number}: fewer fields than the header names; nothing imported")
            yield number, _checked(name, number, row)
    except csv.Error as exc:
        raise CustomersRefused(f"{name} line {reader.line_num}: {exc}; nothing imported") from None


def _json_lines(name: str, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CustomersRefused(f"{name} row {number}: not JSON ({exc.msg}); nothing imported") from None
        if not isinstance(record, dict):
            raise CustomersRefused(f"{name} row {number}: not a JSON object; nothing imported")
        yield number, _checked(name, number, record)
