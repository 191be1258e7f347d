"""Deterministic whole-cluster simulation (docs/cluster.md, "Deterministic simulation").

Three real brokers, an in-memory ZooKeeper and an in-memory network in one Trio run on a
mock clock; seeded fault schedules; invariants over the brokers' state. Replay a seed
with ``python -m sim --seed N``.
"""


def set_process_gc_policy() -> None:
    """Give a process that runs simulations the brokers' collector policy
    (trio_broker/server/gc_policy.py; ``trio-broker serve`` sets it): three brokers'
    tasks and connections live in this process, and with Python's thresholds full
    collections walk them again and again (docs/cluster.md: 9% of a schedule's CPU in
    collections, 3% with the policy). Garbage collection does not schedule tasks: the
    runs stay the same (bench/sim_fingerprint.py). ``TRIO_BROKER_GC_GEN0_THRESHOLD`` chooses as it does for
    ``serve`` (``python``: Python's own). Call once, after the imports, before the first
    seed."""
    import os

    from trio_broker.server.gc_policy import apply_gc_policy, gen0_threshold

    apply_gc_policy(gen0_threshold(os.environ))
