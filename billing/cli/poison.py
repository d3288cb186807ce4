"""``billing poison``: list, show, replay and purge the messages that could not be processed."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from typing import TYPE_CHECKING

import click
from rich.console import Console

from shared.localstack import resolve

if TYPE_CHECKING:
    from shared.messaging.poison import Action as PoisonAction
    from shared.settings import Settings


@click.group("poison")
def poison_group() -> None:
    """Inspect, replay and purge messages that could not be processed."""


def _poison_targets(
    ids: tuple[str, ...], queue: str | None, every: bool
) -> tuple[Settings, list[str], list[str] | None]:
    settings = resolve()
    if not ids and not every:
        raise click.UsageError("name entry or message ids, or pass --all")
    return settings, [queue] if queue else settings.all_queues, list(ids) or None


@poison_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def poison_list(as_json: bool) -> None:
    """Per queue: how many messages were poisoned, and the first ones with their reasons."""
    from .. import poison

    found = asyncio.run(poison.overview(resolve()))
    if as_json:
        click.echo(
            json.dumps(
                [{"queue": q, "count": n, "entries": [asdict(e) for e in entries]} for q, n, entries in found], indent=2
            )
        )
    else:
        poison.print_overview(found, Console())


def _poison_action(action: PoisonAction, verb: str) -> click.Command:
    @click.argument("ids", nargs=-1)
    @click.option("--queue", help="Only this pipeline queue (default: all of them).")
    @click.option("--all", "every", is_flag=True, help="Every entry of the chosen queues.")
    def command(ids: tuple[str, ...], queue: str | None, every: bool) -> None:
        from .. import poison

        settings, queues, chosen = _poison_targets(ids, queue, every)
        entries = asyncio.run(poison.act(settings, action, queues=queues, ids=chosen))
        if action == "show":
            click.echo(json.dumps([asdict(e) for e in entries], indent=2))
        else:
            click.echo(f"{verb} {len(entries)} poisoned message(s)")
            for entry in entries:
                click.echo(f"  {entry.queue} {entry.message_id}: {entry.reason}")
        if ids and not entries:
            raise click.ClickException("no poisoned message has those ids")

    command.__doc__ = {
        "show": "Print entries (by entry id or original message id) in full, as JSON.",
        "replay": "Send entries back to the queue they came from (after fixing the cause), then remove them.",
        "purge": "Remove entries for good.",
    }[action]
    return poison_group.command(action)(command)


_POISON_ACTIONS: tuple[tuple[PoisonAction, str], ...] = (
    ("show", "showed"),
    ("replay", "replayed"),
    ("purge", "purged"),
)
for _action, _verb in _POISON_ACTIONS:
    _poison_action(_action, _verb)


COMMANDS: tuple[click.Command, ...] = (poison_group,)
