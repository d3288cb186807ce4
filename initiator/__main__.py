"""``python -m initiator``: run the initiator (same options as ``billing initiator``)."""

import sys

from billing.cli import main

main(["initiator", *sys.argv[1:]])
