"""Reference data for tests that submit: the sample price book and tax table as files, and the
``billing submit`` flags that name them (a batch submitted without them needs a registered set)."""

from __future__ import annotations

from pathlib import Path

from billing.sample import write_price_book, write_tax_table


def sample_files(directory: Path) -> tuple[Path, Path]:
    """The sample price book and tax table written under ``directory`` (``pricebook.csv``, ``taxes.csv``)."""
    directory.mkdir(parents=True, exist_ok=True)
    pricebook, taxes = directory / "pricebook.csv", directory / "taxes.csv"
    write_price_book(pricebook)
    write_tax_table(taxes)
    return pricebook, taxes


def sample_flags(directory: Path) -> list[str]:
    """``--pricebook P --taxes T`` naming the sample's files (written under ``directory``)."""
    pricebook, taxes = sample_files(directory)
    return ["--pricebook", str(pricebook), "--taxes", str(taxes)]


def sample_options(directory: Path) -> dict[str, Path]:
    """``billing.client.submit``'s ``pricebook`` and ``taxes`` naming the sample's files."""
    pricebook, taxes = sample_files(directory)
    return {"pricebook": pricebook, "taxes": taxes}
