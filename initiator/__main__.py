"""``python -m initiator``: run the initiator (the options of ``billing initiator``; see :mod:`shared.roles`)."""

from shared.roles import main

if __name__ == "__main__":
    main("initiator")
