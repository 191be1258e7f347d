"""The transaction coordinator (exactly-once, docs/transactions.md).

``state`` holds the pure rules of one transactional id, ``log_format`` the
records of ``__transaction_state``, ``coordinator`` the table of one partition, its
durable log and the commit/abort path, ``partitioned`` the broker's coordinator, a table
per led partition (alone, the one of a cluster of one). No trio here, not even indirectly: the timer that
aborts timed-out transactions is a shell task (server/transaction_timers.py).
"""
