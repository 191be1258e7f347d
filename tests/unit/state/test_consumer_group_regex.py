"""KIP-848 regex subscriptions in the group state (state/consumer_group.py).

A member's regex is matched at its own heartbeats against the topics as they are then
(a new matching topic joins at its next one), keeps only the topics its principal may
describe, and is not matched again while the topics stay the same (a heartbeat of a
group on a broker with thousands of topics must not scan them all every time).
"""

from __future__ import annotations

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state import consumer_group
from trio_broker.state.consumer_group import ConsumerGroup, Heartbeat


def join(group: ConsumerGroup, member: str, regex: str, topics: dict[str, int],
         describable: object = None) -> None:  # fmt: skip
    result = group.heartbeat(
        Heartbeat(member_id=member, member_epoch=0, regex=regex, subscribed=(),
                  rebalance_timeout_ms=1000, owned=frozenset()),
        0, topics, member, describable,  # type: ignore[arg-type]
    )  # fmt: skip
    assert result.error is ErrorCode.NONE, result


def beat(group: ConsumerGroup, member: str, topics: dict[str, int],
         describable: object = None) -> None:  # fmt: skip
    epoch = group.members[member].epoch
    result = group.heartbeat(
        Heartbeat(member_id=member, member_epoch=epoch), 0, topics, member,
        describable,  # type: ignore[arg-type]
    )  # fmt: skip
    assert result.error is ErrorCode.NONE, result


def test_matches_are_filtered_by_the_members_describe_rights() -> None:
    group = ConsumerGroup("g")
    topics = {"orders-eu": 2, "orders-us": 2, "shipments": 1}
    join(group, "m1", "orders-.*", topics, describable=lambda t: t != "orders-us")
    assert group.members["m1"].resolved == ("orders-eu",)
    join(group, "m2", "orders-.*", topics)  # no authorizer: everything it matches
    assert group.members["m2"].resolved == ("orders-eu", "orders-us")
    # m2's heartbeat does not re-filter m1's matches with m2's rights, nor m1's m2's.
    beat(group, "m2", topics)
    beat(group, "m1", topics, describable=lambda t: t != "orders-us")
    assert group.members["m1"].resolved == ("orders-eu",)
    assert group.members["m2"].resolved == ("orders-eu", "orders-us")


def test_a_new_topic_joins_at_the_members_next_heartbeat() -> None:
    group = ConsumerGroup("g")
    join(group, "m1", "t-.*", {"t-1": 1})
    epoch = group.group_epoch
    beat(group, "m1", {"t-1": 1, "t-2": 1})
    assert group.members["m1"].resolved == ("t-1", "t-2")
    assert group.group_epoch == epoch + 1


def test_the_same_topics_are_not_matched_again(monkeypatch: object) -> None:
    group = ConsumerGroup("g")
    topics = {f"t-{i}": 1 for i in range(100)}
    compiled: list[str] = []
    real = consumer_group._pattern

    def counting(regex: str) -> object:
        compiled.append(regex)
        return real(regex)

    monkeypatch.setattr(consumer_group, "_pattern", counting)  # type: ignore[attr-defined]
    join(group, "m1", "t-1.*", topics)
    for _ in range(5):
        beat(group, "m1", topics)
    assert compiled == ["t-1.*"]  # matched once for five heartbeats
    beat(group, "m1", {**topics, "t-100": 1})
    assert compiled == ["t-1.*", "t-1.*"]  # the topics changed: matched again
    assert "t-100" in group.members["m1"].resolved
