"""Deterministic whole-cluster simulation (docs/cluster.md, "Deterministic simulation").

Three real brokers, an in-memory ZooKeeper and an in-memory network in one Trio run on a
mock clock; seeded fault schedules; invariants over the brokers' state. Replay a seed
with ``python -m sim --seed N``.
"""
