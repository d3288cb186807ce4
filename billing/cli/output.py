"""What every ``billing`` command prints besides its result: the console on stderr, and an error on one line."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

console = Console(stderr=True)


def print_error(message: str) -> None:
    """``error: MESSAGE`` on stderr, the message as written (no markup, no wrapping)."""
    console.print("[red]error:[/red]", escape(message), soft_wrap=True)
