"""The fetch purgatory's registry (state/fetch_watch.py) against a model.

Property: a touch of a partition concerns exactly the waiters watching it: it is noted
for each of them, and wakes those that had nothing pending (the others are awake
already); a waiter is never woken by, nor told about, a partition it does not watch;
and none is lost: a registered waiter stays registered on all its partitions until it
is forgotten, and a change noted for it stays until it takes it.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trio_broker.state.fetch_watch import PartitionWatch

KEYS = st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 2))
WAITERS = st.integers(0, 5)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("watch"), WAITERS, st.frozensets(KEYS, max_size=4)),
        st.tuples(st.just("touch"), KEYS),
        st.tuples(st.just("take"), WAITERS),
        st.tuples(st.just("forget"), WAITERS),
        st.tuples(st.just("touch_all")),
    ),
    max_size=60,
)


@given(OPS)
def test_a_touch_concerns_exactly_the_waiters_of_its_partition(ops: list[tuple]) -> None:
    watch: PartitionWatch[tuple[str, int], int] = PartitionWatch()
    keys_of: dict[int, frozenset[tuple[str, int]]] = {}
    pending: dict[int, set[tuple[str, int]]] = {}
    wakeups = seen = 0
    looks: dict[int, int] = {}  # looks by partitions changed, in power-of-two buckets
    for op in ops:
        if op[0] == "watch":
            _, waiter, keys = op
            watch.watch(waiter, keys)
            keys_of[waiter], pending[waiter] = keys, set()
        elif op[0] == "touch":
            key = op[1]
            watching = {w for w, keys in keys_of.items() if key in keys}
            woken = watch.touch(key)
            assert len(woken) == len(set(woken))  # each once
            assert set(woken) == {w for w in watching if not pending[w]}
            wakeups += len(woken)
            for waiter in watching:
                pending[waiter].add(key)
        elif op[0] == "take":
            assert watch.take(op[1]) == frozenset(pending.get(op[1], ()))
            if pending.get(op[1]):
                changed = len(pending[op[1]])
                bucket = next(b for b in (1, 2, 4, 8, 16) if changed <= b)
                looks[bucket] = looks.get(bucket, 0) + 1
                seen += changed
            if op[1] in pending:
                pending[op[1]] = set()
        elif op[0] == "forget":
            watch.forget(op[1])
            keys_of.pop(op[1], None)
            pending.pop(op[1], None)
        else:
            assert set(watch.touch_all()) == {w for w in keys_of if not pending[w]}
            wakeups += sum(1 for w in keys_of if not pending[w])
            for waiter, keys in keys_of.items():
                pending[waiter] |= keys
        # No waiter lost, none left behind: the registry is the model.
        assert len(watch) == len(keys_of)
        for waiter, keys in keys_of.items():
            assert watch.watching(waiter) == keys
        stats = watch.statistics()
        assert stats.waiters == len(keys_of)
        assert stats.partitions == len(set().union(*keys_of.values()))
        assert stats.woken == wakeups
        assert stats.changed_per_look == looks and stats.changed_seen == seen


def test_a_change_while_the_waiter_looks_is_kept_for_its_next_look() -> None:
    watch: PartitionWatch[str, str] = PartitionWatch()
    watch.watch("fetch", ["A", "B"])
    assert watch.touch("A") == ["fetch"]
    assert watch.touch("B") == []  # awake already: noted, no second wake-up
    assert watch.take("fetch") == {"A", "B"}
    assert watch.take("fetch") == frozenset()
    assert watch.touch("C") == []  # not its partition
    assert watch.touch("B") == ["fetch"]
    watch.forget("fetch")
    assert watch.touch("B") == [] and watch.statistics().partitions == 0
