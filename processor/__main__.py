"""``python -m processor``: run the processor (the options of ``billing processor``; see :mod:`shared.roles`)."""

from shared.roles import main

if __name__ == "__main__":
    main("processor")
