"""A share group member whose session runs out has its records in ``__consumer_offsets``
tombstoned by its coordinator, with no heartbeat or request of the group to trigger it
(server/broker.py's expiry loop, as Kafka's coordinator's session timer), so that a
coordinator loading the group later does not bring the member back.

In-process broker with a 1 s share session timeout; raw requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_acl_clients import connect
from tests.waits import eventually
from trio_broker.config import BrokerConfig
from trio_broker.groups.offsets_store import SHARE_GROUP_MEMBER_KEY_VERSIONS
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.server.broker import Broker

SESSION_MS = 1_000


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(
        port=0, data_dir=tmp_path / "data", group_share_session_timeout_ms=SESSION_MS
    )


def stored_members(broker: Broker, group: str) -> set[str]:
    """The members the group's records in the offsets log name."""
    store = broker.groups.store_for(group)
    return {
        member
        for version, member in store.share_group_records(group)
        if version in SHARE_GROUP_MEMBER_KEY_VERSIONS
    }


async def test_an_expired_members_records_are_tombstoned(broker: Broker) -> None:
    broker.topics.create("jobs", 1)
    async with connect(broker) as raw:
        joined = await raw.call(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, m.ShareGroupHeartbeatRequest(
            group_id="g", member_id="m1", member_epoch=0, subscribed_topic_names=["jobs"]))  # fmt: skip
        assert joined.error_code == ErrorCode.NONE
    # Answered once its records counted.
    assert stored_members(broker, "g") == {"m1"}
    known = broker.groups.share_group("g")
    assert known is not None and set(known.members) == {"m1"}
    # No request of the group from here on: the member's session runs out.
    await eventually(lambda: not stored_members(broker, "g"), "m1's records tombstoned")
    known = broker.groups.share_group("g")
    assert known is not None and known.members == {}
    group = broker.shares.groups.get("g")
    assert group is not None and group.members == {}
