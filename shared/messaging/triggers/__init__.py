"""Trigger buses: "work detected" hints from publishers to listeners.

:class:`ServiceBusTriggerBus` is the production backend (an Azure Service Bus topic);
:class:`LocalTriggerBus` is the local default (loopback UDP, registered in blob storage);
:class:`PairedTriggerBus` pairs two Service Bus namespaces for send availability.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from ...settings import Settings
from ..storage import Storage
from .base import TriggerBus, TriggerEvent, TriggerHandler
from .local import LocalTriggerBus
from .paired import PairedTriggerBus

if TYPE_CHECKING:
    from .servicebus import ServiceBusTriggerBus


def trigger_bus(settings: Settings, storage: Storage) -> TriggerBus | None:
    """The trigger bus the settings ask for (``None`` when triggers are off); not started yet."""
    mode = settings.trigger_mode
    if mode == "none":
        return None
    if mode == "local":
        return LocalTriggerBus(storage=storage, container=settings.trigger_container)
    primary = _servicebus(settings, storage, settings.servicebus_connection_string, settings.servicebus_namespace)
    if settings.secondary_servicebus_connection_string is None and not settings.secondary_servicebus_namespace:
        return primary
    secondary = _servicebus(
        settings, storage, settings.secondary_servicebus_connection_string, settings.secondary_servicebus_namespace
    )
    return PairedTriggerBus(
        primary, secondary, interval=settings.failover_interval, probe_interval=settings.failover_probe_interval
    )


def _servicebus(
    settings: Settings, storage: Storage, connection: SecretStr | None, namespace: str | None
) -> ServiceBusTriggerBus:
    from .servicebus import ServiceBusTriggerBus

    return ServiceBusTriggerBus(
        connection_string=connection.get_secret_value() if connection else None,
        namespace=None if connection else namespace,
        topic=settings.trigger_topic,
        subscription=settings.trigger_subscription,
        create_subscription=settings.trigger_create_subscription,
        auto_delete_on_idle=timedelta(seconds=settings.trigger_auto_delete_on_idle),
        counter=storage.counter,
    )


def __getattr__(name: str) -> Any:
    """``ServiceBusTriggerBus`` on first use: the Service Bus SDK loads only where a bus is used
    (``billing submit`` starts sooner without it)."""
    if name == "ServiceBusTriggerBus":
        from .servicebus import ServiceBusTriggerBus

        return ServiceBusTriggerBus
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "LocalTriggerBus",
    "PairedTriggerBus",
    "ServiceBusTriggerBus",
    "TriggerBus",
    "TriggerEvent",
    "TriggerHandler",
    "trigger_bus",
]
