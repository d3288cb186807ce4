"""Trigger events and trigger-bus construction, with no infrastructure (the buses at work are in
``integration/test_triggers.py``)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from shared.errors import ConfigurationError
from shared.messaging.triggers import ServiceBusTriggerBus, TriggerEvent


def test_event_json_round_trip() -> None:
    event = TriggerEvent(account="devstoreaccount1", queue="billing-input-0", messages=3, transactions=3000)
    assert TriggerEvent.from_json(event.to_json()) == event
    with pytest.raises(ValueError):
        TriggerEvent.from_json(b'{"queue": "q"}')


def test_servicebus_bus_needs_exactly_one_endpoint() -> None:
    with pytest.raises(ConfigurationError):
        ServiceBusTriggerBus()
    with pytest.raises(ConfigurationError):
        ServiceBusTriggerBus(
            connection_string="Endpoint=sb://x/",
            namespace="x.servicebus.windows.net",
            auto_delete_on_idle=timedelta(minutes=5),
        )
