"""``billing serve``: a read-only HTTP API over the store and the queues, and a console of HTML pages on the
same server (poison replay and purge only with ``BILLING_CONSOLE_TOKEN``). ``billing report --format html``
renders with the same templates (``render``)."""
