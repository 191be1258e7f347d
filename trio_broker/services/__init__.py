"""Services the handlers use through ``RequestContext.services`` (see handlers/base.py).

Plain objects, no trio: the topic manager (topics, their logs and the catalogue),
the client quotas, the broker's counters and the idempotent producers' registry (with
the producer id allocator). The Broker owns one of each as a field and hands them in;
nothing reaches into the Broker for them.
"""
