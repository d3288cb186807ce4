"""``billing up``, ``down``, the roles (``initiator``, ``processor``, ``controller``, ``syphon``), ``autoscale``,
``serve`` and ``demo``: the commands that run the pipeline's processes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from shared.localstack import AzuriteStack, resolve
from shared.logs import redact
from shared.roles import ROLES

from .output import console


@click.command()
def up() -> None:
    """Start the local stack (Azurite) under BILLING_HOME; idempotent."""
    from shared.settings import Settings

    settings = Settings()
    connection = AzuriteStack(home=settings.home).start()
    click.echo(f"BILLING_HOME={settings.home}")
    click.echo(f"BILLING_STORAGE_CONNECTION_STRING={redact(connection)}")
    click.echo(f"BILLING_SQL_URL={redact(settings.sql_url_value)}")
    click.echo("Other billing commands with the same BILLING_HOME use this stack.")


@click.command()
def down() -> None:
    """Stop the local stack; idempotent."""
    from shared.settings import Settings

    AzuriteStack(home=Settings().home).stop()
    click.echo("local stack stopped")


def _role_command(role: str) -> click.Command:
    @click.option("--burst", is_flag=True, help="Drain what is queued, then exit.")
    @click.option("--partitions", type=int, help="Number of input queues (BILLING_PARTITIONS).")
    def command(burst: bool, partitions: int | None) -> None:
        from shared.roles import start  # the role's own entry: imports the role only now

        start(role, burst=burst, partitions=partitions)

    command.__doc__ = f"Run the {role} until SIGINT/SIGTERM (or drained, with --burst)."
    return click.command(role)(command)


ROLE_COMMANDS = tuple(_role_command(role) for role in (*ROLES, "syphon"))


@click.command()
@click.option(
    "--manifests",
    type=click.Path(exists=True, path_type=Path),
    required=True,
    help="KEDA ScaledObjects and the roles' Deployments: a file, a folder, or a kustomization (e.g. "
    "deploy/kubernetes/overlays/local).",
)
@click.option("--polling-interval", type=float, help="Seconds between polls, for every ScaledObject.")
@click.option("--cooldown-period", type=float, help="Seconds idle before scaling to zero, for every ScaledObject.")
@click.option("--events", type=click.Path(dir_okay=False, path_type=Path), help="Append each decision as JSON.")
def autoscale(
    manifests: Path, polling_interval: float | None, cooldown_period: float | None, events: Path | None
) -> None:
    """Scale local role processes on queue depth as KEDA scales the manifests' Deployments, until SIGINT/SIGTERM."""
    from .. import autoscale as scaler

    settings = resolve()
    rules = scaler.retimed(
        scaler.scale_rules(scaler.read_manifests(manifests)), polling=polling_interval, cooldown=cooldown_period
    )
    asyncio.run(scaler.run(rules, settings, log_dir=settings.home / "logs", events=events))


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback only by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
def serve(host: str, port: int) -> None:
    """Serve the read-only JSON API (/api, OpenAPI at /openapi.json) and the console (/batches, /invoices,
    /roles, /poison). Money in the API is exact integers in minor units. Poison replay and purge in the
    console need BILLING_CONSOLE_TOKEN; without it the console is read-only."""
    from ..console.app import serve as run_server  # FastAPI and uvicorn: only for this command

    run_server(resolve(), host=host, port=port)


@click.command("demo")
@click.option("--rows", type=int, default=200_000, show_default=True)
@click.option("--seed", type=int, default=1)
def demo_command(rows: int, seed: int) -> None:
    """Run the whole pipeline locally on a sample batch and print the results."""
    from .. import demo  # the reports it prints load pandas

    demo.run(rows=rows, seed=seed, console=console)


COMMANDS: tuple[click.Command, ...] = (up, down, *ROLE_COMMANDS, autoscale, serve, demo_command)
