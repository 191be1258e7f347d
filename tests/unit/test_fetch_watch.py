"""The fetch purgatory's registry (state/fetch_watch.py) against a model.

Property: a touch of a partition wakes exactly the waiters watching it (each once, and
then no longer registered); a waiter is never woken by a partition it does not watch,
and never lost: until woken or forgotten it stays registered on all its partitions.
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
        st.tuples(st.just("forget"), WAITERS),
        st.tuples(st.just("touch_all")),
    ),
    max_size=60,
)


@given(OPS)
def test_a_touch_wakes_exactly_the_waiters_of_its_partition(ops: list[tuple]) -> None:
    watch: PartitionWatch[tuple[str, int], int] = PartitionWatch()
    model: dict[int, frozenset[tuple[str, int]]] = {}
    woken_total = 0
    for op in ops:
        if op[0] == "watch":
            _, waiter, keys = op
            watch.watch(waiter, keys)
            model[waiter] = keys
        elif op[0] == "touch":
            key = op[1]
            expected = {w for w, keys in model.items() if key in keys}
            woken = watch.touch(key)
            assert len(woken) == len(set(woken))  # each once
            assert set(woken) == expected
            for waiter in expected:
                del model[waiter]
            woken_total += len(expected)
        elif op[0] == "forget":
            watch.forget(op[1])
            model.pop(op[1], None)
        else:
            assert set(watch.touch_all()) == set(model)
            woken_total += len(model)
            model.clear()
        # No waiter lost, none left behind: the registry is the model.
        assert len(watch) == len(model)
        for waiter, keys in model.items():
            assert watch.watching(waiter) == keys
        stats = watch.statistics()
        assert stats.waiters == len(model)
        assert stats.partitions == len(set().union(*model.values()))
        assert stats.woken == woken_total


def test_watching_again_replaces_the_partitions() -> None:
    watch: PartitionWatch[str, str] = PartitionWatch()
    watch.watch("fetch", ["A", "B"])
    watch.watch("fetch", ["B"])
    assert watch.touch("A") == []
    assert watch.touch("B") == ["fetch"]
    assert watch.touch("B") == []  # woken once: gone until it registers again
    assert watch.statistics().partitions == 0
