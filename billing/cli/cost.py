"""``billing cost``: monthly cost projected from measured requests, and the whitepaper's idle example."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console

from .. import cost


@click.command("cost")
@click.option(
    "--from-bench",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Rates from `billing bench` JSON (or idle rate from `billing bench-listener` JSON).",
)
@click.option(
    "--design",
    type=click.Choice(list(cost.BENCH_KEYS)),
    default="optimised",
    show_default=True,
    help="Which design's rates to take from --from-bench.",
)
@click.option(
    "--window",
    type=float,
    help="Instead: measure the running roles this many seconds (two refreshes of their state at least); "
    "project that rate all day.",
)
@click.option("--requests-per-1000", type=float, help="Storage requests per 1,000 transactions.")
@click.option("--idle-requests-per-hour", type=float, help="Storage requests per idle hour per processor.")
@click.option(
    "--servicebus-per-1000", type=float, default=0.0, show_default=True, help="Service Bus operations per 1,000 tx."
)
@click.option("--daily-transactions", type=int, default=10_000_000, show_default=True)
@click.option("--idle-hours", type=click.FloatRange(0, 24), default=22.0, show_default=True, help="Idle hours per day.")
@click.option("--processors", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--whitepaper", is_flag=True, help="Only the whitepaper's example; no rates needed.")
@click.option(
    "--prices",
    "prices_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A prices.toml of your own.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def cost_command(
    ctx: click.Context,
    from_bench: Path | None,
    design: cost.Design,
    window: float | None,
    requests_per_1000: float | None,
    idle_requests_per_hour: float | None,
    servicebus_per_1000: float,
    daily_transactions: int,
    idle_hours: float,
    processors: int,
    whitepaper: bool,
    prices_file: Path | None,
    as_json: bool,
) -> None:
    """Project monthly cost from measured requests, and compute the whitepaper's idle example."""
    _check_modes(ctx, window, whitepaper)
    prices = cost.Prices.load(prices_file or cost.PRICES)
    result: dict[str, object] = {}
    if window is not None:
        result = _measured(window, prices)
    elif not whitepaper:
        rates = cost.from_bench(from_bench, design) if from_bench else {}
        given = {"requests_per_1000": requests_per_1000, "idle_requests_per_hour": idle_requests_per_hour}
        rates.update({k: v for k, v in given.items() if v is not None})
        if missing := sorted(given.keys() - set(rates)):
            raise click.UsageError(
                f"missing {', '.join('--' + m.replace('_', '-') for m in missing)}: give --from-bench, "
                "--window, --whitepaper, or both --requests-per-1000 and --idle-requests-per-hour"
            )
        workload = cost.Workload(
            **rates,
            servicebus_per_1000=servicebus_per_1000,
            daily_transactions=daily_transactions,
            idle_hours=idle_hours,
            processors=processors,
        )
        result = {"projection": cost.project(workload, prices)}
    result["whitepaper_example"] = cost.whitepaper_example(prices)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        cost.print_result(result, Console())


def _check_modes(ctx: click.Context, window: float | None, whitepaper: bool) -> None:
    """Refuse a --window too short to measure, and rate options given with --window or --whitepaper."""
    if window is not None:
        from shared.messaging.service import STATE_INTERVAL  # the roles' runtime: only for this measure

        if window < 2 * STATE_INTERVAL:
            raise click.BadParameter(
                f"{window:g} s is shorter than two refreshes of the roles' state", param_hint="--window"
            )
    if window is None and not whitepaper:
        return
    rate_options = (
        "from_bench",
        "design",
        "requests_per_1000",
        "idle_requests_per_hour",
        "servicebus_per_1000",
        "daily_transactions",
        "idle_hours",
        "processors",
        "whitepaper" if window is not None else "window",
    )
    given = [name for name in rate_options if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
    if given:
        mode = "--window" if window is not None else "--whitepaper"
        raise click.UsageError(f"{mode} takes no {', '.join('--' + n.replace('_', '-') for n in given)}")


def _measured(window: float, prices: cost.Prices) -> dict[str, object]:
    """The requests the local roles make through ``window`` seconds, and their monthly projection."""
    from shared.settings import Settings

    settings = Settings()
    measured = cost.measure_window(settings, window)
    if not measured["roles"]:
        raise click.ClickException(f"no role ran under BILLING_HOME={settings.home} through the {window:g} s window")
    return {"measured": measured, "projection": cost.project(cost.window_workload(measured), prices)}


COMMANDS: tuple[click.Command, ...] = (cost_command,)
