"""``python -m controller``: run the controller (the options of ``billing controller``; see :mod:`shared.roles`)."""

from shared.roles import main

if __name__ == "__main__":
    main("controller")
