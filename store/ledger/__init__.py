"""The ledger: what the store keeps across batches so that each transaction id is billed once and each month
closes into numbered documents.

- :mod:`store.ledger.ids`: the transaction ids of every batch counted (table ``ledger_ids``) and the checks a
  completing batch runs against them;
- :mod:`store.ledger.numbers`: batch sequence numbers (merge order) and voids;
- :mod:`store.ledger.periods`: closed periods and the late rows counted after a close;
- :mod:`store.ledger.parties`: the seller and the customers, versioned;
- :mod:`store.ledger.documents`: what a document holds, and reading documents;
- :mod:`store.ledger.closing`: closing a period into gap-free numbered documents.
"""
