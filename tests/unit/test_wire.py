"""Message kinds on the wire: each kind travels under the name it always had and reads back as itself from a
message sent before kinds were an enum; a kind no role knows is poison, naming it; a known kind is poison to a
reader that does not take it."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest

from shared.errors import PoisonMessage
from shared.messages import BatchRequest, IdsPart, Kind, PoisonNotice, WorkHeader
from shared.messaging.envelope import Envelope
from shared.rules.schemas import IDS_SCHEMA
from shared.tables import decode_table, encode_table
from shared.wire import (
    ids_envelope,
    kind_of,
    manifest_envelope,
    parse_ids,
    parse_manifest,
    parse_poisoned,
    parse_request,
    parse_results,
    parse_work_header,
    poisoned_envelope,
    request_envelope,
    results_envelope,
    work_envelope,
)
from support.records import manifest, partial, result

#: The name each kind has travelled under on the queues, with its reader: messages sent with them wait there still.
READERS: dict[str, Callable[[Envelope], Any]] = {
    "request": parse_request,
    "work": parse_work_header,
    "results": parse_results,
    "manifest": parse_manifest,
    "ids": parse_ids,
    "poisoned": parse_poisoned,
}
IDS = pa.table({"row": [1, 2], "transaction_id": ["t-1", "t-2"]}, schema=IDS_SCHEMA)
#: One message of each kind, and what it carries.
SENT: dict[str, tuple[Envelope, object]] = {
    "request": (
        request_envelope(request := BatchRequest("b1", "f.csv", "b1/f.csv", "csv", "pb", "tx", datetime.now(UTC))),
        request,
    ),
    "work": (work_envelope(header := WorkHeader("b1:0", "b1", "pb", "tx", 2), encode_table(IDS)), header),
    "results": (results_envelope(results := [result("b1:0", partial(transactions=2))]), results),
    "manifest": (manifest_envelope(sent := manifest("b1")), sent),
    "ids": (ids_envelope(part := IdsPart("b1", 0, IDS)), part),
    "poisoned": (poisoned_envelope(notice := PoisonNotice("b1", "b1:0", "unratable")), notice),
}


def _as_read(envelope: Envelope) -> Envelope:
    """``envelope`` as a reader gets it: its kind and headers written as the claim check writes them (JSON) and
    read back, the kind a plain string as in a message sent before kinds were an enum."""
    message = json.loads(json.dumps({"kind": envelope.kind, "headers": envelope.headers}))
    return Envelope(message["kind"], message["headers"], envelope.payload)


def test_every_kind_travels_under_the_name_it_always_had() -> None:
    assert sorted(Kind) == sorted(READERS)


@pytest.mark.parametrize("name", READERS)
def test_a_message_sent_before_reads_back_as_its_kind_with_what_it_carried(name: str) -> None:
    envelope, carried = SENT[name]
    assert envelope.kind is Kind(name)
    read = _as_read(envelope)
    assert (type(read.kind), read.kind) == (str, name)
    assert kind_of(read) is Kind(name)
    assert READERS[name](read) == carried


@pytest.mark.parametrize("name", READERS)
def test_a_kind_no_role_knows_is_poison_naming_it(name: str) -> None:
    envelope, _ = SENT[name]
    with pytest.raises(PoisonMessage) as caught:
        READERS[name](Envelope("refund", envelope.headers, envelope.payload))
    assert (caught.value.reason, "'refund'" in caught.value.detail) == ("unknown_kind", True)


def test_a_known_kind_is_poison_to_a_reader_that_does_not_take_it() -> None:
    envelope, _ = SENT["manifest"]
    with pytest.raises(PoisonMessage) as caught:
        parse_results(envelope)
    assert caught.value.reason == "unexpected_kind"
    assert "manifest" in caught.value.detail


def test_a_results_message_carries_each_items_partials_as_a_stream_of_its_own_and_reads_those_from_before() -> None:
    sent = [
        result("b1:0", partial(transactions=2), partial("acct-2", net=10**30)),
        result("b2:0", batch_id="b2", rejects=[{"row": 3, "reason": "bad_amount", "raw": "{}"}]),
        result("b1:1", partial(day="2026-03-03")),
    ]
    envelope = results_envelope(sent)
    read = parse_results(_as_read(envelope))
    assert read == sent
    streams = [r.encoded_partials for r in read]
    assert b"".join(s or b"" for s in streams) == envelope.payload[: envelope.headers["tables"]["partials"]]
    assert all(s is not None and decode_table(s).equals(r.partials) for s, r in zip(streams, sent, strict=True))
    assert envelope.payload[len(b"".join(s or b"" for s in streams)) :][:4] == b"PAR1"  # the rejects: Parquet
    partials = encode_table(pa.concat_tables([r.partials for r in sent]))  # as processors wrote them before
    items = [{k: v for k, v in item.items() if k != "partials_bytes"} for item in envelope.headers["items"]]
    sizes = envelope.headers["tables"]
    before = Envelope(
        envelope.kind,
        {"items": items, "tables": {**sizes, "partials": len(partials)}},
        partials + envelope.payload[sizes["partials"] :],
    )
    read = parse_results(_as_read(before))
    assert read == sent
    assert [r.encoded_partials for r in read] == [None] * 3  # nothing the store can keep as it came


@pytest.mark.parametrize("field", ["partials_bytes", "groups"])
def test_a_results_message_whose_partials_and_headers_disagree_is_poison(field: str) -> None:
    envelope = results_envelope([result("b1:0", partial(), partial("acct-2")), result("b1:1", partial())])
    items = [dict(item) for item in envelope.headers["items"]]
    items[0][field] += 1
    with pytest.raises(PoisonMessage) as caught:
        parse_results(_as_read(Envelope(envelope.kind, {**envelope.headers, "items": items}, envelope.payload)))
    assert caught.value.reason in ("bad_results", "bad_payload")


def test_a_results_message_with_damaged_partials_is_poison() -> None:
    envelope = results_envelope([result("b1:0", partial())])
    damaged = Envelope(envelope.kind, envelope.headers, envelope.payload[:4] + b"\x00" * 64 + envelope.payload[68:])
    with pytest.raises(PoisonMessage) as caught:
        parse_results(_as_read(damaged))
    assert caught.value.reason == "bad_payload"
