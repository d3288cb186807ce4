"""Money as pages and HTML reports show it: the currency's own units (ISO 4217 exponent), thousands separators
and the code, computed from exact minor units with integers only."""

from __future__ import annotations

import pytest

from shared.rules.reference import money


@pytest.mark.parametrize(
    ("minor", "currency", "shown"),
    [
        (123456, "USD", "1,234.56 USD"),
        (5, "EUR", "0.05 EUR"),
        (0, "GBP", "0.00 GBP"),
        (1234, "JPY", "1,234 JPY"),
        (1000000, "KRW", "1,000,000 KRW"),
        (1, "KWD", "0.001 KWD"),
        (1234567, "BHD", "1,234.567 BHD"),
        (-250, "CHF", "-2.50 CHF"),
        (18 * 10**18 + 58, "USD", "180,000,000,000,000,000.58 USD"),  # past 2^63, exact
        (10**40 + 1, "KWD", "10,000,000,000,000,000,000,000,000,000,000,000,000.001 KWD"),
    ],
)
def test_money_in_currency_units(minor: int, currency: str, shown: str) -> None:
    assert money(minor, currency) == shown
