"""The prices ``billing cost`` ships with (``billing/prices.toml``), read as ``Prices``; the command
itself is exercised in ``system/test_cost.py``."""

from __future__ import annotations

import pytest

from billing.cost import Prices


def test_the_shipped_prices_are_todays_defaults() -> None:
    prices = Prices.load()
    assert prices.storage_per_10k == {"GPv2 today": 0.004, "whitepaper 2012": 0.01}
    assert prices.servicebus_base_monthly == pytest.approx(0.0135 * 730)
    assert prices.servicebus_tiers == [(13e6, 0.0), (100e6, 0.80), (2_500e6, 0.50), (1e18, 0.20)]
