"""The parties a document names: the seller (one per ledger) and the customers (one per account id).

Both are versioned, never changed in place: every :func:`set_seller` adds a seller version (the newest is in
force); :func:`import_customers` adds a version for each customer new or changed, all of a file or nothing, and
keeps the earlier ones. A close snapshots the seller and each document's customer in force as it issues
(:mod:`store.ledger.closing`). Countries are ISO 3166-1 alpha-2 codes (``pycountry``). A value refused is a
:class:`~store.ledger.numbers.LedgerError` of one line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any, Self

import pycountry
import sqlalchemy as sa

from ..engine import CHUNK, chunks, writing
from ..schema import customers as customers_table
from ..schema import sellers
from .numbers import LedgerError

ACCOUNT_PATTERN = r"[A-Za-z0-9._:-]{1,64}"
DEFAULT_TERMS_DAYS = 30
DEFAULT_PREFIX = "INV-"
_EMAIL = r"[^@\s]+@[^@\s]+\.[^@\s]+"
_PREFIX = r"[A-Za-z0-9._/-]{0,16}"


def country_code(value: str) -> str:
    """``value`` as an ISO 3166-1 alpha-2 code (upper case); :class:`LedgerError` when it names no country."""
    code = value.strip().upper()
    if not re.fullmatch(r"[A-Z]{2}", code) or pycountry.countries.get(alpha_2=code) is None:
        raise LedgerError(f"country {value!r} is not an ISO 3166-1 alpha-2 code (e.g. DE, US, JP)")
    return code


def _text(what: str, value: str, longest: int) -> str:
    text = value.strip()
    if not text:
        raise LedgerError(f"{what} is missing")
    if len(text) > longest:
        raise LedgerError(f"{what} is longer than {longest} characters")
    return text


def _optional(what: str, value: str | None, longest: int) -> str | None:
    return None if value is None or not value.strip() else _text(what, value, longest)


@dataclass(frozen=True)
class Seller:
    """Who issues the documents; ``version`` and ``set_at`` once stored."""

    name: str
    address: str
    country: str
    tax_id: str
    payment_terms_days: int = DEFAULT_TERMS_DAYS
    prefix: str = DEFAULT_PREFIX
    version: int = field(default=0, compare=False)
    set_at: datetime | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", _text("the seller's name", self.name, 255))
        object.__setattr__(self, "address", _text("the seller's address", self.address, 2000))
        object.__setattr__(self, "country", country_code(self.country))
        object.__setattr__(self, "tax_id", _text("the seller's tax id", self.tax_id, 64))
        if not 0 <= self.payment_terms_days <= 3650:
            raise LedgerError(f"payment terms of {self.payment_terms_days} days: give 0 to 3650")
        if not re.fullmatch(_PREFIX, self.prefix):
            raise LedgerError(f"prefix {self.prefix!r}: up to 16 letters, digits and . _ / -")

    def snapshot(self) -> dict[str, Any]:
        """What a document keeps of it (``name``, ``address``, ``country``, ``tax_id``, the terms and prefix)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.compare}

    def to_json_dict(self) -> dict[str, Any]:
        found = self.snapshot() | {"version": self.version}
        return found | {"set_at": self.set_at.isoformat() if self.set_at else None}


@dataclass(frozen=True)
class Customer:
    """Who an account's documents are addressed to; ``version`` and ``set_at`` once stored."""

    account_id: str
    name: str
    address: str
    country: str
    tax_id: str | None = None
    email: str | None = None
    version: int = field(default=0, compare=False)
    set_at: datetime | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not re.fullmatch(ACCOUNT_PATTERN, self.account_id):
            raise LedgerError(f"account id {self.account_id!r}: 1 to 64 letters, digits and . _ : -")
        object.__setattr__(self, "name", _text("name", self.name, 255))
        object.__setattr__(self, "address", _text("address", self.address, 2000))
        object.__setattr__(self, "country", country_code(self.country))
        object.__setattr__(self, "tax_id", _optional("tax_id", self.tax_id, 64))
        email = _optional("email", self.email, 254)
        if email is not None and not re.fullmatch(_EMAIL, email):
            raise LedgerError(f"email {email!r} is not an e-mail address")
        object.__setattr__(self, "email", email)

    def snapshot(self) -> dict[str, Any]:
        """What a document keeps of it: ``account_id``, ``name``, ``address``, ``country``, ``tax_id``."""
        return {k: getattr(self, k) for k in ("account_id", "name", "address", "country", "tax_id")}

    def to_json_dict(self) -> dict[str, Any]:
        found = self.snapshot() | {"email": self.email, "version": self.version}
        return found | {"set_at": self.set_at.isoformat() if self.set_at else None}

    @classmethod
    def of(cls, row: sa.RowMapping) -> Self:
        return cls(**{f.name: row[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class Imported:
    """What an import did: customers added, changed (a new version), unchanged."""

    added: int
    changed: int
    unchanged: int


def set_seller(engine: sa.Engine, seller: Seller, *, now: datetime | None = None) -> Seller:
    """Add ``seller`` as the newest seller version; the version stored."""
    with writing(engine) as conn:
        latest = conn.execute(sa.select(sa.func.max(sellers.c.version))).scalar()
        stored = replace(seller, version=int(latest or 0) + 1, set_at=now or datetime.now(UTC))
        conn.execute(sa.insert(sellers).values(**{f.name: getattr(stored, f.name) for f in fields(stored)}))
    return stored


def current_seller(conn: sa.Connection) -> Seller | None:
    """The seller in force (its newest version), None before the first is set."""
    row = conn.execute(sa.select(sellers).order_by(sellers.c.version.desc()).limit(1)).mappings().first()
    return None if row is None else Seller(**{f.name: row[f.name] for f in fields(Seller)})


def seller(engine: sa.Engine) -> Seller | None:
    """The seller in force, None before the first is set."""
    with engine.connect() as conn:
        return current_seller(conn)


def import_customers(engine: sa.Engine, found: Sequence[Customer], *, now: datetime | None = None) -> Imported:
    """Upsert customers by account id in one transaction: a new version for each new or changed one."""
    ids = [c.account_id for c in found]
    if len(set(ids)) != len(ids):
        raise LedgerError("an account id is given twice")
    set_at, added, changed = now or datetime.now(UTC), [], 0
    with writing(engine) as conn:
        known = customers_of(conn, ids)
        for customer in found:
            before = known.get(customer.account_id)
            if before != customer:
                changed += before is not None
                added.append(replace(customer, version=before.version + 1 if before else 1, set_at=set_at))
        for chunk in chunks([{f.name: getattr(c, f.name) for f in fields(c)} for c in added], CHUNK):
            conn.execute(sa.insert(customers_table), chunk)
    return Imported(len(added) - changed, changed, len(found) - len(added))


def customers_of(conn: sa.Connection, account_ids: Iterable[str] | None = None) -> dict[str, Customer]:
    """The customers in force (newest versions) of ``account_ids`` (None: every account), by account id."""
    c = customers_table
    newest = sa.select(c.c.account_id, sa.func.max(c.c.version).label("version")).group_by(c.c.account_id)
    wanted = None if account_ids is None else sorted(set(account_ids))
    found: dict[str, Customer] = {}
    for of_ids in [None] if wanted is None else [wanted[i : i + 500] for i in range(0, len(wanted), 500)]:
        latest = (newest if of_ids is None else newest.where(c.c.account_id.in_(of_ids))).subquery()
        query = sa.select(c).join(
            latest, sa.and_(c.c.account_id == latest.c.account_id, c.c.version == latest.c.version)
        )
        found |= {row["account_id"]: Customer.of(row) for row in conn.execute(query).mappings()}
    return found


def customers(engine: sa.Engine) -> list[Customer]:
    """Every customer in force, by account id (code point order)."""
    with engine.connect() as conn:
        return sorted(customers_of(conn).values(), key=lambda c: c.account_id)


def customer(engine: sa.Engine, account_id: str) -> Customer | None:
    """The customer in force for ``account_id``, if any."""
    with engine.connect() as conn:
        return customers_of(conn, [account_id]).get(account_id)
