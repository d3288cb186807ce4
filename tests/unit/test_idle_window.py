"""``billing bench`` and ``bench-listener`` refuse an idle window shorter than three of pull's capped polls: in a
shorter one a processor stalled by a busy machine may count no request, ranking the back-off below push (the
bench's idle figures are compared as push ≤ pull < naive). Nothing runs: the option is refused as it is read."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from benchmarks.cli import IDLE_POLLS, bench_command, bench_listener_command


@pytest.mark.parametrize("command", [bench_command, bench_listener_command], ids=lambda c: c.name)
@pytest.mark.parametrize(("cap", "seconds", "refused"), [(10, 29, True), (3, 8.9, True), (3, 9, False)])
def test_an_idle_window_spans_three_capped_polls(
    command, cap: int, seconds: float, refused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BILLING_MAX_IDLE_INTERVAL", str(cap))
    ran: list[float] = []
    monkeypatch.setattr(command, "callback", lambda **options: ran.append(options["idle_seconds"]))
    done = CliRunner().invoke(command, ["--idle-seconds", str(seconds)])
    if refused:
        assert done.exit_code == 2 and not ran
        assert f"at least {IDLE_POLLS * cap:g} s" in done.output
    else:
        assert done.exit_code == 0 and ran == [seconds]
