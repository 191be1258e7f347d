"""A partition's one write path and one read entry (issue 29): every leader write goes
through :mod:`trio_broker.partition.append`, whoever makes it (a producer, the group or
transaction coordinator, the transaction marker writer); Fetch reads a led partition
through :mod:`trio_broker.partition.read`. A led partition (its log, term and producer
state, found by one lookup, the per-partition guard) is a
:class:`~trio_broker.partition.partition.Partition`.

Sans-I/O: no trio here. The waits are awaited on the objects the shell passes in (the
flusher's ``wait_durable``, the replica manager's ``wait_committed``).
"""
