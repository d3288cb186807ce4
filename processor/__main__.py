"""``python -m processor``: run the processor (same options as ``billing processor``)."""

import sys

from billing.cli import main

main(["processor", *sys.argv[1:]])
