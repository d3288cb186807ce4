"""Trigger buses: "work detected" hints from publishers to listeners.

:class:`ServiceBusTriggerBus` is the production backend (an Azure Service Bus topic);
:class:`LocalTriggerBus` is the local default (loopback UDP, registered in blob storage).
"""

from .base import TriggerBus, TriggerEvent, TriggerHandler
from .local import LocalTriggerBus
from .servicebus import ServiceBusTriggerBus

__all__ = ["LocalTriggerBus", "ServiceBusTriggerBus", "TriggerBus", "TriggerEvent", "TriggerHandler"]
