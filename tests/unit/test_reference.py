"""Loading and refusing reference data."""

from __future__ import annotations

import hashlib

import pytest

from shared.errors import ReferenceDataError
from shared.rules.reference import CURRENCY_DIGITS, ProductPrice, decimal_text, load_price_book, load_tax_table

HEADER = "product,currency,unit_price,offpeak_unit_price,minimum_charge\n"


def test_price_book_values_are_exact_micro_units() -> None:
    data = (
        "\ufeffcurrency, product ,unit_price,offpeak_unit_price,minimum_charge,note\n"
        "USD,cpu,0.000001,,,x\n"
        "\n"
        'JPY,disk ,"1000000",0,12.5,\n'
        "BHD,net\u3000,0.0005,0.0004,0.000001\n"
    ).encode()
    book = load_price_book(data)
    assert book.content_hash == hashlib.sha256(data).hexdigest()
    assert book.products == ("cpu", "disk", "net")
    assert book.get("cpu") == ProductPrice("USD", 2, 1, 1, None, "unit", ("0.000001", "0.000001", ""))
    assert book.get("disk") == ProductPrice(
        "JPY", 0, 1_000_000_000_000, 0, 12_500_000, "unit", ("1000000", "0", "12.5")
    )
    assert book.get("net") == ProductPrice("BHD", 3, 500, 400, 1, "unit", ("0.0005", "0.0004", "0.000001"))
    assert book.get("missing") is None
    assert book.minimum_minor.tolist() == [-1, 13, 0]  # 12.5 JPY -> 13, 0.000001 BHD -> 0
    assert CURRENCY_DIGITS["KWD"] == 3


def test_a_price_book_may_name_each_product_s_unit() -> None:
    header = "product,currency,unit_price,offpeak_unit_price,minimum_charge,unit\n"
    book = load_price_book((header + "cpu,USD,1,,,vCPU-hour\nnet,USD,1,,,\n").encode())
    assert [price.unit for price in book.prices] == ["vCPU-hour", "unit"]
    with pytest.raises(ReferenceDataError, match=r"line 2: unit 'x{33}' is longer than 32"):
        load_price_book((header + f"cpu,USD,1,,,{'x' * 33}\n").encode())


def test_rates_are_normalised_decimal_text() -> None:
    assert [decimal_text(m) for m in (0, 200_000, 190_000, 1_000_000, 123_457, 1)] == [
        "0",
        "0.2",
        "0.19",
        "1",
        "0.123457",
        "0.000001",
    ]


def test_a_region_longer_than_the_store_keeps_is_refused() -> None:
    with pytest.raises(ReferenceDataError, match=r"line 3: region 'r{65}' is longer than 64"):
        load_tax_table(f"region,tax_rate\n*,0\n{'r' * 65},0\n".encode())


def test_tax_table() -> None:
    data = b"region,tax_rate\n*,0.2\nDE,0.190000\nFR ,1\nUS,0\n"
    table = load_tax_table(data)
    assert table.content_hash == hashlib.sha256(data).hexdigest()
    assert table.regions == ("*", "DE", "FR", "US")
    assert table.rates == (200_000, 190_000, 1_000_000, 0)
    assert table.rate("FR") == 1_000_000 and table.rate("de") is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("cpu,XXX,1,,\n", "price book line 2: unknown currency 'XXX'"),
        ("cpu,usd,1,,\n", "price book line 2: unknown currency 'usd'"),
        ("cpu,USD,-1,,\n", "price book line 2: unit_price: '-1' is negative"),
        ("cpu,USD,1000000.000001,,\n", "price book line 2: unit_price: '1000000.000001' is above 1,000,000"),
        (
            "cpu,USD,1,0.0000001,\n",
            "price book line 2: offpeak_unit_price: '0.0000001' has more than 6 fractional digits",
        ),
        ("cpu,USD,1,,1e3\n", "price book line 2: minimum_charge: '1e3' is not a decimal number"),
        ("cpu,USD,,,\n", "price book line 2: unit_price: '' is not a decimal number"),
        ("cpu,USD,1.,,\n", "price book line 2: unit_price: '1.' is not a decimal number"),
        ("cpu,USD,\u0661,,\n", "price book line 2: unit_price: '\u0661' is not a decimal number"),
        ("cpu,USD,1,,\n\ncpu,EUR,1,,\n", "price book line 4: duplicate product 'cpu' (first on line 2)"),
        (",USD,1,,\n", "price book line 2: product is empty"),
        ("cpu,USD,1,,,extra\n", "price book line 2: more cells than columns"),
        ('cpu,USD,"1,,\n', "price book line 2: malformed CSV"),
        ("", "price book has no products"),
    ],
)
def test_price_book_refusals(body: str, message: str) -> None:
    with pytest.raises(ReferenceDataError) as refused:
        load_price_book((HEADER + body).encode())
    assert str(refused.value).startswith(message)


def test_price_book_file_level_refusals() -> None:
    with pytest.raises(ReferenceDataError, match="not UTF-8"):
        load_price_book(HEADER.encode() + b"cpu,EUR,\xff,,\n")
    with pytest.raises(ReferenceDataError, match="line 1: missing column\\(s\\) offpeak_unit_price, minimum_charge"):
        load_price_book(b"product,currency,unit_price\ncpu,EUR,1\n")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("region,tax_rate\nDE,0.19\n", "tax table has no default row"),
        ("region,tax_rate\n*,1.000001\n", "tax table line 2: tax_rate: '1.000001' is above 1"),
        ("region,tax_rate\n*,-0.1\n", "tax table line 2: tax_rate: '-0.1' is negative"),
        ("region,tax_rate\n*,0.1\n* ,0.2\n", "tax table line 3: duplicate region '*' (first on line 2)"),
        ("region,tax_rate\n*,0.1\n ,0.2\n", "tax table line 3: region is empty"),
        ("region,rate\n*,0.1\n", "tax table line 1: missing column(s) tax_rate"),
        ("region,tax_rate\n*,0.19%\n", "tax table line 2: tax_rate: '0.19%' is not a decimal number"),
    ],
)
def test_tax_table_refusals(data: str, message: str) -> None:
    with pytest.raises(ReferenceDataError) as refused:
        load_tax_table(data.encode())
    assert str(refused.value).startswith(message)
