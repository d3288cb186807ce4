"""Send availability's state machine (``shared.messaging.failover.Route``) with a scripted clock:
failing over only after the interval, probing the primary back, no oscillation."""

from __future__ import annotations

from shared.messaging.failover import Health, Route


def test_fails_over_only_after_the_interval_and_probes_back() -> None:
    route = Route(interval=10, probe_interval=5)
    assert route.use_primary(0)
    route.failed(100)
    assert route.health is Health.FAILING and route.retry_in(100) == 1.0
    route.failed(109.5)
    assert route.health is Health.FAILING and route.retry_in(109.5) == 0.5
    route.failed(110)
    assert route.health is Health.FAILED_OVER and route.failovers == 1
    assert not route.use_primary(114.9) and route.use_primary(115)  # a probe every probe_interval
    route.failed(115)
    assert not route.use_primary(119.9) and route.use_primary(120)
    route.succeeded()
    assert route.health is Health.HEALTHY and route.failing_since is None


def test_zero_interval_fails_over_on_the_first_failure() -> None:
    route = Route(interval=0, probe_interval=5)
    route.failed(1)
    assert route.health is Health.FAILED_OVER


def test_a_flapping_primary_does_not_oscillate() -> None:
    """Failures shorter than the interval never fail over; once failed over, the primary is tried
    again only every probe interval however often sends happen."""
    route = Route(interval=10, probe_interval=5)
    for second in range(0, 60, 2):  # down 1 s, up 1 s, for a minute
        route.failed(second)
        route.succeeded()
    assert route.failovers == 0 and route.health is Health.HEALTHY

    route.failed(100)
    route.failed(111)
    probes = []
    for now in (t / 10 for t in range(1110, 1300)):  # a send every 100 ms for 19 s ...
        if route.use_primary(now):
            probes.append(now)
            route.failed(now)  # ... and every probe of the primary fails
    assert probes == [116.0, 121.0, 126.0] and route.failovers == 1
