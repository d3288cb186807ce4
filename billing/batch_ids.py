"""Batch ids: what one may be (:func:`check_batch_id`), and the default, the file's SHA-256 (:func:`file_digest`)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from shared.errors import InputError

#: Batch ids name blobs and prefixes (a ``/`` would nest one batch's blobs inside another's).
BATCH_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def check_batch_id(batch_id: str) -> None:
    """Refuse a batch id that cannot name blobs and prefixes (:data:`BATCH_ID`)."""
    if not BATCH_ID.fullmatch(batch_id):
        raise InputError(f"batch id {batch_id!r}: use 1 to 128 letters, digits, '.', '_', ':' or '-'")


def file_digest(path: Path) -> str:
    """Hex SHA-256 of a file, read in blocks (hashing releases the GIL): the default batch id."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
