"""A batch left ``processing`` shows as stalled once it has not changed for a while, with the reason the store can
tell: its manifest not come, work items not recorded, an earlier merge's manifest awaited, an earlier batch that
shares its ids still running. A batch that moved lately, or settled, shows none."""

from __future__ import annotations

from datetime import timedelta

from benchmarks.ledger import Cut, InProcess
from store import Store
from support.ledger import csv_of, rows_of


def test_a_batch_that_stopped_moving_says_why(migrated_url: str) -> None:
    roles = InProcess(bits=1 << 16, work_item_size=200)

    def cut(batch_id: str, ids: list[str]) -> Cut:
        return roles.cut(batch_id, csv_of(rows_of(ids)))

    running = cut("running", [f"r{i}" for i in range(500)])
    late = cut("late", [f"l{i}" for i in range(50)])
    waiting = cut("waiting", [f"r{i}" for i in range(10)])  # shares ids with "running"
    unnumbered = cut("unnumbered", [f"u{i}" for i in range(10)])
    unmanifested = cut("unmanifested", [f"m{i}" for i in range(10)])
    with Store(migrated_url) as writer:
        writer.apply([running.manifest], running.results[:1])  # the rest of its work items missing
        writer.apply([], late.results)  # its manifest delayed: the later merges wait for it
        writer.apply([waiting.manifest, unnumbered.manifest], waiting.results + unnumbered.results)
        writer.apply([], unmanifested.results)
        writer.apply([late.manifest], [])  # numbered now: "waiting" waits for "running" instead
        writer.apply([unnumbered.manifest], [])
        with Store(migrated_url, stalled_after=timedelta(hours=1)) as hourly:
            fresh = {s.batch_id: s.stalled for s in hourly.batches()}
        assert set(fresh.values()) == {None}, "nothing unchanged for an hour"

    with Store(migrated_url, stalled_after=timedelta(0)) as reader:
        reasons = {s.batch_id: s.stalled for s in reader.batches()}
        waits = reader.batch("waiting")
    assert reasons["late"] is None and reasons["unnumbered"] is None, "complete: nothing to say"
    items = len(running.results)
    assert (
        items > 1
        and reasons["running"] == f"{items - 1} of its {items} work items not recorded: still rated, or on their way"
    )
    assert waits is not None and waits.waiting_for == "running" and waits.seq is not None
    assert reasons["waiting"] == (
        "every work item recorded: it waits for batch running, which shares ids with it or has ids parts on their way"
    )
    assert (reasons["unmanifested"] or "").startswith("no manifest yet")


def test_a_batch_waiting_for_an_earlier_merge_names_it(migrated_url: str) -> None:
    roles = InProcess(bits=1 << 16)
    zero, first, second = (
        roles.cut(b, csv_of(rows_of([f"{b}{i}" for i in range(10)]))) for b in ("zero", "first", "second")
    )
    with Store(migrated_url) as writer:
        writer.apply([zero.manifest], zero.results)  # the store counts merges from its first
        writer.apply([second.manifest], second.results)
    with Store(migrated_url, stalled_after=timedelta(0)) as reader:
        stalled = reader.batch("second")
    assert stalled is not None and stalled.seq is None
    assert stalled.stalled == (
        f"every work item recorded, not numbered: it waits for the manifest of merge {first.manifest.id_serial}, "
        "an earlier batch's"
    )
