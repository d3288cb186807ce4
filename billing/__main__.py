"""``python -m billing``: the ``billing`` command line."""

from .cli import main

main()
