"""Imported once by the rating workers' fork server (:data:`processor.pool.PRELOAD`): the imports Arrow makes on
first use are made there, for every worker forked from it, not in each worker as its first work item waits."""

from shared.wire import warm_up

warm_up()
