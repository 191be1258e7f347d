"""The transaction coordinator (exactly-once, docs/transactions.md).

``state`` holds the pure rules of one transactional id, ``log_format`` the
records of ``__transaction_state``, ``coordinator`` the table, its durable log
and the commit/abort path, ``partitioned`` a cluster broker's table per led partition,
and ``lookup`` either one as the handlers see it. No trio here, not even indirectly: the timer that
aborts timed-out transactions is a shell task (server/transaction_timers.py).
"""
