"""The registry of reference data versions (``shared.refstore``) on Azurite: a registry from before versions reads as
one version, a version of a date already registered replaces it, and a submission snapshots the registry's versions
into its request (the inbox file keeps them)."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

from billing import client
from billing.sample import generate, sample_price_book_bytes, sample_tax_table_bytes
from shared import submissions
from shared.messaging.envelope import content_hash
from shared.messaging.storage import Storage
from shared.refstore import FIRST_DATE, REGISTERED, ReferenceStore
from shared.rules.versions import Version
from shared.settings import Settings


async def test_an_old_registry_reads_as_one_version_and_a_date_registered_again_replaces_its_version(
    settings_env: Settings, storage: Storage
) -> None:
    await storage.ensure(containers=[settings_env.reference_container])
    container = storage.container(settings_env.reference_container)
    await container.upload_blob(REGISTERED, json.dumps({"pricebook": "p0", "taxes": "t0"}).encode(), overwrite=True)
    references = ReferenceStore(storage, container=settings_env.reference_container)
    [old] = await references.registry()
    assert (old.version, old.registered_at) == (Version(FIRST_DATE, "p0", "t0"), None)

    await references.register(Version(date(2026, 3, 1), "p1", "t1"))
    registry = await references.register(Version(date(2026, 2, 1), "p2", "t2"))
    assert [r.version.pricebook_hash for r in registry] == ["p0", "p2", "p1"]
    registry = await references.register(Version(date(2026, 3, 1), "p3", "t3"))
    assert [r.version for r in await references.registry()] == [r.version for r in registry]
    assert [(r.version.effective_from, r.version.pricebook_hash) for r in registry] == [
        (FIRST_DATE, "p0"),
        (date(2026, 2, 1), "p2"),
        (date(2026, 3, 1), "p3"),
    ]
    assert all(r.registered_at is not None for r in registry[1:])


async def test_a_submission_carries_the_registry_s_versions_or_its_own_files_on_every_date(
    settings_env: Settings, storage: Storage, tmp_path: Path
) -> None:
    book, taxes = sample_price_book_bytes(), sample_tax_table_bytes()
    await client.register(settings_env, book, taxes, date(2026, 3, 1))
    registry = await client.register(settings_env, book, taxes, date(2026, 2, 1))
    path = tmp_path / "batch.csv"
    generate(20, path, seed=1)
    await client.submit(settings_env, path, batch_id="registered")
    own_book, own_taxes = tmp_path / "prices.csv", tmp_path / "taxes.csv"
    own_book.write_bytes(book)
    own_taxes.write_bytes(taxes + b"XX,0.5\n")
    await client.submit(settings_env, path, batch_id="own", pricebook=own_book, taxes=own_taxes)
    inbox = storage.container(settings_env.inbox_container)
    requests = {}
    for batch_id in ("registered", "own"):
        properties = await submissions.inbox_file(inbox, batch_id)
        assert properties is not None
        requests[batch_id] = submissions.request_of(properties)
    registered, own = requests["registered"], requests["own"]
    assert registered.versions == tuple(r.version for r in registry)
    newest = registry[-1].version
    assert (registered.pricebook_hash, registered.taxes_hash) == (newest.pricebook_hash, newest.taxes_hash)
    digests = (content_hash(book), content_hash(own_taxes.read_bytes()))
    assert own.versions == (Version(None, *digests),) and (own.pricebook_hash, own.taxes_hash) == digests
