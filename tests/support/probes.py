"""What an orchestrator asks of a role's health server (``BILLING_HEALTH_PORT``): a probe's status
and text, and the samples of a ``/metrics`` scrape, parsed with prometheus-client's own parser."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

PROBE_TIMEOUT = 30.0  # seconds: generous for a loaded machine; /readyz itself gives up after 5 s


def probe(base: str, path: str) -> tuple[int, str]:
    """``GET base + path``: the status code and body (an error status is an answer too)."""
    try:
        with urllib.request.urlopen(base + path, timeout=PROBE_TIMEOUT) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrape(base: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``/metrics`` as sample name → labels → value (fails unless it answers 200)."""
    status, text = probe(base, "/metrics")
    assert status == 200, text
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def by_label(samples: dict[tuple[tuple[str, str], ...], float], label: str) -> dict[str, float]:
    """One sample's values keyed by one of its labels."""
    return {dict(labels)[label]: value for labels, value in samples.items()}


def total(samples: dict[tuple[tuple[str, str], ...], float], queues: Iterable[str]) -> float:
    """The sum of a per-queue sample over ``queues``."""
    values = by_label(samples, "queue")
    return sum(values.get(queue, 0.0) for queue in queues)
