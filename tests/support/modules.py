"""Which packages a process had loaded: what the import-weight tests compare with what a command or a process needs."""

from __future__ import annotations

from collections.abc import Iterable


def loaded_of(modules: Iterable[str], packages: Iterable[str]) -> list[str]:
    """The ``packages`` (or modules) among ``modules``, a process's ``sys.modules`` names, submodules included."""
    names = list(modules)
    return sorted({p for p in packages for m in names if m == p or m.startswith(f"{p}.")})
