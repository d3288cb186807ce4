"""``python -m controller``: run the controller (same options as ``billing controller``)."""

import sys

from billing.cli import main

main(["controller", *sys.argv[1:]])
