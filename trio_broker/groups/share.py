"""Share groups (KIP-932): the groups, their share partitions and share sessions.

Holds one :class:`~trio_broker.state.share_group.ShareGroup` per share group, one
:class:`~trio_broker.state.share_partition.SharePartition` per (group, topic id,
partition) it has been assigned, and one share session per (group, member) that
fetches. Share partitions are keyed by topic id, as Kafka keys them: a topic deleted
and created again under its name is another topic, with no share state yet. Membership and sessions are in memory; the share partitions' state is written
to their share coordinator by the handlers (``handlers/share_persist.py``) and read back
here when a share partition is first served (:meth:`ShareGroups.restore`; see
docs/share-groups.md). Time is passed in by the handlers (ms), and locks and sessions
run out lazily, when the group or partition is next used: nothing here waits.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import TypedDict

import attrs

from trio_broker.groups.share_records import StoredShareGroup
from trio_broker.groups.share_state import ShareKey, ShareSnapshot, restore
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.share_group import (
    Assignable,
    ShareGroup,
    ShareHeartbeat,
    ShareHeartbeatResult,
)
from trio_broker.state.share_partition import SharePartition
from trio_broker.storage.group_configs import (
    SHARE_AUTO_OFFSET_RESET,
    AutoOffsetReset,
    GroupConfigStore,
    parse_auto_offset_reset,
)

#: A share group's protocol type and group type in ListGroups (Kafka's).
SHARE_PROTOCOL_TYPE = "share"
#: ShareFetch/ShareAcknowledge session epochs: open, close; the next after INT32 max is 1.
OPEN_SESSION = 0
CLOSE_SESSION = -1
INT32_MAX = 2**31 - 1


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= INT32_MAX else epoch + 1


@attrs.define
class ShareSession:
    #: The epoch the member's next request must carry.
    epoch: int
    #: (topic id, partition) the member fetches from, across requests.
    partitions: set[tuple[uuid.UUID, int]] = attrs.field(factory=set)
    #: The connection that opened it: its close ends the session (Kafka's
    #: ShareSessionCache ties a session to the connection that created it).
    connection_id: int | None = None


@attrs.define
class ShareGroupsConfig:
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    record_lock_duration_ms: int = 30_000
    delivery_count_limit: int = 5
    partition_max_record_locks: int = 2_000
    #: How long a share partition recorded as initializing is left to the initialization
    #: under way before a heartbeat tries it again (Kafka's
    #: group.share.initialize.retry.interval.ms): what makes a coordinator that restarted
    #: mid-initialization, or whose failure could not be recorded, initialize it.
    initialize_retry_interval_ms: int = 30_000


class PartitionSettings(TypedDict):
    """A share partition's settings from its group's configs (or the broker's)."""

    lock_duration_ms: int
    delivery_count_limit: int
    max_in_flight: int


class ShareGroups:
    def __init__(
        self, config: ShareGroupsConfig, group_configs: GroupConfigStore | None = None
    ) -> None:
        self.config = config
        #: Per-group overrides of the broker's share.* settings (the GROUP config resource).
        self.group_configs = GroupConfigStore(None) if group_configs is None else group_configs
        self.groups: dict[str, ShareGroup] = {}
        #: (group, topic id, partition) -> its share partition.
        self.partitions: dict[tuple[str, uuid.UUID, int], SharePartition] = {}
        self.sessions: dict[tuple[str, str], ShareSession] = {}
        #: The leader epoch in which each share partition led here was read from its
        #: share coordinator, and the last snapshot it holds of it
        #: (handlers/share_persist.py).
        self.loaded: dict[ShareKey, int] = {}
        self.written: dict[ShareKey, ShareSnapshot] = {}
        #: When this broker, as the group's coordinator, began initializing each share
        #: partition its records call initializing (or first saw it so, after a load).
        self.initializing_since: dict[ShareKey, int] = {}

    def initializing_fresh(self, key: ShareKey, now_ms: int) -> bool:
        """Whether the share partition, recorded as initializing, is still left to the
        initialization under way (else a heartbeat initializes it again)."""
        since = self.initializing_since.setdefault(key, now_ms)
        return now_ms - since < self.config.initialize_retry_interval_ms

    def recall_groups(self, group_ids: Iterable[str], epochs: Mapping[str, int] = {}) -> None:
        """Groups with stored share state, or stored by their group coordinator: those
        not known come back empty (their stored members, if any, are brought back by
        :meth:`restore_members`), as ShareGroupDescribe and ListGroups
        show them, at their stored group epoch (``epochs``) if not below the known one,
        so a member's next join raises the epoch past any it was given before."""
        for group_id in group_ids:
            if group_id not in self.groups:
                self.groups[group_id] = self._new_group(group_id)
            group = self.groups[group_id]
            if not group.members:
                group.group_epoch = max(group.group_epoch, epochs.get(group_id, 0))

    def restore_members(
        self,
        stored: Mapping[str, StoredShareGroup],
        now_ms: int,
        topic_ids: Mapping[str, uuid.UUID] | None = None,
    ) -> None:
        """The groups' members as their coordinator's records say, in the groups that
        have none here (this broker just took the groups over, or restarted): at their
        stored epochs and assignments, the group at its stored epoch, target and
        metadata, so that a member heartbeating with the epoch it holds goes on without
        rejoining. Their sessions start afresh (Kafka's rule at a load). Partitions of a
        topic whose id is not the stored one (``topic_ids``: each existing topic's id)
        are left out of both: that topic was deleted, perhaps created again."""
        for group_id, group_stored in stored.items():
            group = self.groups.get(group_id)
            if group is None or group.members or not group_stored.members:
                continue
            group.group_epoch = group_stored.epoch
            group.metadata = dict(group_stored.metadata)
            deadline_ms = now_ms + group.session_timeout_ms
            group.members = {
                member_id: member.restored(member_id, deadline_ms, topic_ids)
                for member_id, member in group_stored.members.items()
            }
            group.target = {
                member_id: member.same_topics(member.target, topic_ids)
                for member_id, member in group_stored.members.items()
            }

    def restore(self, snapshots: Mapping[ShareKey, ShareSnapshot]) -> None:
        """Share partitions as stored, by (group, topic id, partition): nothing acquired.
        Their groups come back empty (the group coordinator brings back their members),
        as ShareGroupDescribe shows them."""
        for key, snapshot in snapshots.items():
            group_id = key.group_id
            self.partitions[group_id, key.topic_id, key.partition] = restore(
                snapshot, **self._partition_settings(group_id)
            )
            if group_id not in self.groups:
                self.groups[group_id] = self._new_group(group_id)

    # -- group configs (storage/group_configs.py): a group's own value, else the broker's
    def _setting(self, group_id: str, key: str, broker_value: int) -> int:
        value = self.group_configs.groups.get(group_id, {}).get(key)
        return broker_value if value is None else int(value)

    def _partition_settings(self, group_id: str) -> PartitionSettings:
        return PartitionSettings(
            lock_duration_ms=self._setting(
                group_id, "share.record.lock.duration.ms", self.config.record_lock_duration_ms
            ),
            delivery_count_limit=self._setting(
                group_id, "share.delivery.count.limit", self.config.delivery_count_limit
            ),
            max_in_flight=self._setting(
                group_id, "share.partition.max.record.locks", self.config.partition_max_record_locks
            ),
        )

    def _new_group(self, group_id: str) -> ShareGroup:
        return ShareGroup(
            group_id,
            session_timeout_ms=self._setting(
                group_id, "share.session.timeout.ms", self.config.session_timeout_ms
            ),
            heartbeat_interval_ms=self._setting(
                group_id, "share.heartbeat.interval.ms", self.config.heartbeat_interval_ms
            ),
        )

    def lock_duration_ms(self, group_id: str) -> int:
        """The group's acquisition lock duration: its share.record.lock.duration.ms, else
        the broker's group.share.record.lock.duration.ms (what ShareFetch reports as
        AcquisitionLockTimeoutMs, as Kafka's does)."""
        return self._partition_settings(group_id)["lock_duration_ms"]

    def auto_offset_reset(self, group_id: str) -> AutoOffsetReset:
        """Where the group's new share partitions start (share.auto.offset.reset; Kafka's
        default is latest)."""
        value = self.group_configs.groups.get(group_id, {}).get(SHARE_AUTO_OFFSET_RESET)
        return AutoOffsetReset("latest") if value is None else parse_auto_offset_reset(value)

    def read_committed(self, group_id: str) -> bool:
        """share.isolation.level: read_committed members get records below the last
        stable offset only, and never those of aborted transactions."""
        value = self.group_configs.groups.get(group_id, {}).get("share.isolation.level")
        return value == "read_committed"

    def set_group_configs(self, group_id: str, configs: Mapping[str, str]) -> None:
        """Store the group's overrides (checked by the caller) and apply them at once, as
        Kafka reads them on each use: the lock of the next acquisition, the session timeout
        of the next heartbeat. The start of a share partition already made stays."""
        self.group_configs.set(group_id, configs)
        for (gid, _, _), share_partition in self.partitions.items():
            if gid == group_id:
                for name, value in self._partition_settings(group_id).items():
                    setattr(share_partition, name, value)
        group = self.groups.get(group_id)
        if group is not None:
            fresh = self._new_group(group_id)
            group.session_timeout_ms = fresh.session_timeout_ms
            group.heartbeat_interval_ms = fresh.heartbeat_interval_ms

    def partitions_of(self, group_id: str) -> list[tuple[uuid.UUID, int, SharePartition]]:
        """(topic id, partition, share partition) of each of the group's share partitions."""
        return [(t, p, sp) for (g, t, p), sp in self.partitions.items() if g == group_id]

    # -- admin (AlterShareGroupOffsets, DeleteShareGroupOffsets, DeleteGroups)
    def is_empty(self, group_id: str, now_ms: int) -> bool | None:
        """None: no such share group; else whether it has no members."""
        group = self.group(group_id, now_ms)
        return None if group is None else not group.members

    def unload(self, key: ShareKey) -> None:
        """The share partition's state here may be stale (a reset at the share
        coordinator): its next use reads it from there again, and takes what is stored."""
        self.loaded.pop(key, None)
        self.written.pop(key, None)

    def forget(self, key: ShareKey) -> None:
        """This broker no longer holds the share partition (its state was deleted): made
        again, it starts afresh."""
        self.partitions.pop((key.group_id, key.topic_id, key.partition), None)
        self.unload(key)

    def forget_partitions(self, group_id: str, topic_id: uuid.UUID) -> list[int]:
        """Drop the group's share partitions of the topic; the partitions dropped."""
        gone = sorted(p for (g, t, p) in self.partitions if g == group_id and t == topic_id)
        for partition in gone:
            del self.partitions[group_id, topic_id, partition]
        return gone

    def forget_topic(self, topic_id: uuid.UUID) -> list[ShareKey]:
        """The topic is deleted: every group's share partitions of it go (their members
        hold nothing there any more). The keys dropped."""
        gone = [ShareKey(g, t, p) for (g, t, p) in self.partitions if t == topic_id]
        for key in gone:
            del self.partitions[key.group_id, topic_id, key.partition]
        return gone

    def delete_group(self, group_id: str) -> list[tuple[uuid.UUID, int]]:
        """Remove the group and its share partitions; the (topic id, partition)s dropped."""
        gone = [(t, p) for (g, t, p) in self.partitions if g == group_id]
        for topic_id, partition in gone:
            del self.partitions[group_id, topic_id, partition]
        for key in [k for k in self.sessions if k[0] == group_id]:
            del self.sessions[key]
        for share_key in [k for k in self.initializing_since if k.group_id == group_id]:
            del self.initializing_since[share_key]
        self.groups.pop(group_id, None)
        return gone

    def unload_groups(self, coordinated_elsewhere: Callable[[str], bool]) -> list[str]:
        """This broker no longer coordinates the groups ``coordinated_elsewhere`` names
        (it stopped leading their ``__consumer_offsets`` partition): their membership
        goes, as the classic groups', so that none of it survives to a later load of
        the partition here (which brings them back from their records, empty). Their
        share partitions and sessions stay: they are this broker's as a leader of data
        partitions, whichever broker coordinates the group. The groups dropped."""
        gone = [group_id for group_id in self.groups if coordinated_elsewhere(group_id)]
        for group_id in gone:
            del self.groups[group_id]
        return gone

    # -- membership
    def group(self, group_id: str, now_ms: int) -> ShareGroup | None:
        group = self.groups.get(group_id)
        if group is not None:
            for member_id in group.expire(now_ms):
                self._member_gone(group_id, member_id)
        return group

    def expire_members(self, now_ms: int) -> list[str]:
        """Remove every group's members whose session ran out (what the group's next
        use does lazily); the groups that lost one."""
        expired = []
        for group_id, group in list(self.groups.items()):
            count = len(group.members)
            self.group(group_id, now_ms)
            if len(group.members) != count:
                expired.append(group_id)
        return expired

    def heartbeat(
        self,
        group_id: str,
        hb: ShareHeartbeat,
        metadata: Mapping[str, tuple[uuid.UUID, int]],
        start_offset: Callable[[str, int, AutoOffsetReset], int],
        now_ms: int,
        assignable: Assignable = None,
    ) -> ShareHeartbeatResult:
        """``metadata``: id and partition count of each existing topic, by name;
        ``start_offset(topic, partition, reset)``: where a newly assigned share partition
        starts, by the group's ``share.auto.offset.reset`` (the log end by default);
        ``assignable``: the partitions whose share state is initialized, by topic name
        (None: every partition, for callers that keep no records)."""
        group = self.group(group_id, now_ms)
        if group is None:
            group = self.groups[group_id] = self._new_group(group_id)
        # Only the subscribed topics' metadata counts: another topic's creation is no
        # reason for a new group epoch.
        wanted = group.subscribed_topics() | set(hb.subscribed or ())
        relevant = {t: n for t, (_, n) in metadata.items() if t in wanted}
        # A member leaving keeps its share session, as in Kafka (membership and share
        # sessions are apart): a client sends its leave and its session's last
        # acknowledgements at once (librdkafka on two connections), and those must
        # still land. The session ends with its epoch -1 request or its connection.
        if assignable is not None:
            assignable = {t: ps for t, ps in assignable.items() if t in wanted}
        result = group.heartbeat(hb, relevant, now_ms, assignable)
        self._make_assigned(group_id, result, metadata, start_offset)
        if not group.members and not any(k[0] == group_id for k in self.partitions):
            del self.groups[group_id]
        return result

    def catch_up(
        self,
        group_id: str,
        member_id: str,
        metadata: Mapping[str, tuple[uuid.UUID, int]],
        start_offset: Callable[[str, int, AutoOffsetReset], int],
        assignable: Mapping[str, frozenset[int]],
    ) -> ShareHeartbeatResult | None:
        """The member's answer again, after partitions became assignable during its
        heartbeat (their share state was initialized): the group's target takes them and
        the member moves to it. None: the group or the member is gone."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        wanted = group.subscribed_topics()
        relevant = {t: n for t, (_, n) in metadata.items() if t in wanted}
        result = group.catch_up(
            member_id, relevant, {t: ps for t, ps in assignable.items() if t in wanted}
        )
        if result is not None:
            self._make_assigned(group_id, result, metadata, start_offset)
        return result

    def _make_assigned(
        self,
        group_id: str,
        result: ShareHeartbeatResult,
        metadata: Mapping[str, tuple[uuid.UUID, int]],
        start_offset: Callable[[str, int, AutoOffsetReset], int],
    ) -> None:
        for topic, partition in result.assignment or ():
            known = metadata.get(topic)
            if known is not None and (group_id, known[0], partition) not in self.partitions:
                start = start_offset(topic, partition, self.auto_offset_reset(group_id))
                self.ensure_partition(group_id, known[0], partition, start)

    def partition(
        self, group_id: str, topic_id: uuid.UUID, partition: int
    ) -> SharePartition | None:
        return self.partitions.get((group_id, topic_id, partition))

    def ensure_partition(
        self, group_id: str, topic_id: uuid.UUID, partition: int, start_offset: int
    ) -> SharePartition:
        """The group's share partition, made at ``start_offset`` (by the group's
        share.auto.offset.reset) if it has none: on assignment (the coordinator), or on
        the first ShareFetch (a leader that is not the group's coordinator, in a cluster)."""
        key = (group_id, topic_id, partition)
        found = self.partitions.get(key)
        if found is None:
            found = self.partitions[key] = SharePartition(
                start_offset, **self._partition_settings(group_id)
            )
        return found

    def _member_gone(self, group_id: str, member_id: str) -> None:
        self.close_session(group_id, member_id)

    # -- share sessions
    def session_error(self, group_id: str, member_id: str, epoch: int) -> ErrorCode:
        """Whether a ShareFetch/ShareAcknowledge with ``epoch`` fits the member's session
        (epoch 0, which opens one, is checked by the caller)."""
        session = self.sessions.get((group_id, member_id))
        if session is None:
            return ErrorCode.SHARE_SESSION_NOT_FOUND
        if epoch != CLOSE_SESSION and epoch != session.epoch:
            return ErrorCode.INVALID_SHARE_SESSION_EPOCH
        return ErrorCode.NONE

    def open_session(
        self, group_id: str, member_id: str, connection_id: int | None = None
    ) -> ShareSession:
        # A member reopening its session gives back what it held in the old one.
        self.close_session(group_id, member_id)
        session = ShareSession(next_epoch(OPEN_SESSION), connection_id=connection_id)
        self.sessions[(group_id, member_id)] = session
        return session

    def connection_closed(self, connection_id: int) -> None:
        """The sessions that connection opened end, giving back what they held (what a
        member that left without its session's last request still held, at once)."""
        for group_id, member_id in [
            k for k, s in self.sessions.items() if s.connection_id == connection_id
        ]:
            self.close_session(group_id, member_id)

    def other_sessions(self, group_id: str, member_id: str) -> bool:
        """Whether a member of the group other than ``member_id`` has a session here."""
        return any(g == group_id and m != member_id for g, m in self.sessions)

    def session(self, group_id: str, member_id: str) -> ShareSession | None:
        return self.sessions.get((group_id, member_id))

    def close_session(self, group_id: str, member_id: str) -> None:
        """The member's acquired records go back, in every partition of the group."""
        self.sessions.pop((group_id, member_id), None)
        for (gid, _, _), share_partition in self.partitions.items():
            if gid == group_id:
                share_partition.release_member(member_id)
