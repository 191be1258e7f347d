"""Ids that differ between clusters, mapped from the capture's to the replay target's.

Sans-I/O (no trio, no sockets, no files; an import-linter contract says so): the
Trio driver (:mod:`trio_broker.replay.driver`) hands in the frames it sends and
receives, and sends what :meth:`IdMap.frame_for_target` returns.

* Topic ids (Produce v13, Fetch v13+): by name, from the capture's Metadata responses
  to the target's (learnt from the replayed Metadata responses).
* Producer ids and epochs: from the capture's InitProducerId responses to the target's;
  a replayed record batch carries the id and epoch the target handed out for it (its
  CRC recomputed), so idempotent traffic is appended, not taken for a duplicate of
  earlier traffic under the same id.
* Group member ids and generations: from the capture's JoinGroup responses to the
  target's, rewritten in the group requests that carry them (JoinGroup, SyncGroup with
  its assignments, Heartbeat, OffsetCommit, LeaveGroup).
* Fetch session ids (KIP-227): from the capture's Fetch responses that opened a session
  to the target's answers to the same requests, rewritten in the Fetch requests that
  name a session. The epochs need no mapping: the replay sends the same requests.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any, Protocol

import attrs

from trio_broker.protocol.messages import decode_request, decode_response, encode_request
from trio_broker.protocol.records import split_batches
from trio_broker.protocol.schema import uses_topic_ids

__all__ = [
    "FETCH",
    "INIT_PRODUCER_ID",
    "JOIN_GROUP",
    "MEMBER_REQUESTS",
    "METADATA",
    "PRODUCE",
    "IdMap",
    "fetch_session_handed_out",
    "member_handed_out",
    "named_topic_ids",
    "producer_handed_out",
]

PRODUCE, FETCH, METADATA, INIT_PRODUCER_ID = 0, 1, 3, 22
JOIN_GROUP = 11
#: Requests that name a group member (and most a generation): OffsetCommit,
#: JoinGroup, Heartbeat, LeaveGroup, SyncGroup.
MEMBER_REQUESTS = frozenset({8, 11, 12, 13, 14})


class CapturedRequest(Protocol):
    """What the mapping reads of a replayed request (:class:`~trio_broker.replay.plan.Request`)."""

    api_key: int
    api_version: int
    frame: bytes


def _response_body(api_key: int, version: int, frame: bytes) -> Any:
    """A response frame's decoded body, or None if it does not decode."""
    try:
        return decode_response(api_key, version, frame)[1]
    except Exception:
        return None


def named_topic_ids(version: int, frame: bytes) -> dict[str, uuid.UUID]:
    """Topic name -> topic id, from a Metadata response frame."""
    body = _response_body(METADATA, version, frame)
    if body is None:
        return {}
    return {
        topic.name: topic.topic_id
        for topic in body.topics
        if topic.name and topic.topic_id is not None and topic.topic_id.int
    }


def producer_handed_out(version: int, frame: bytes) -> tuple[int, int] | None:
    """The (producer id, epoch) of a successful InitProducerId response frame."""
    body = _response_body(INIT_PRODUCER_ID, version, frame)
    if body is None or body.error_code != 0 or body.producer_id < 0:
        return None
    return int(body.producer_id), int(body.producer_epoch)


def member_handed_out(version: int, frame: bytes) -> tuple[str, int] | None:
    """The (member id, generation) of a JoinGroup response frame: the generation is
    -1 when the join failed (such as MEMBER_ID_REQUIRED, which still names the id)."""
    body = _response_body(JOIN_GROUP, version, frame)
    if body is None or not body.member_id:
        return None
    return str(body.member_id), int(body.generation_id) if body.error_code == 0 else -1


def fetch_session_handed_out(version: int, frame: bytes) -> int | None:
    """The session id a Fetch response frame hands out (v7+, no error), else None.

    Read from the fixed head of the body, so that a capture holding only a prefix of a
    large Fetch response still tells: correlation id, the flexible header's empty tag
    section (v12+), throttle time, error code, session id.
    """
    if version < 7:
        return None
    pos = 4
    if version >= 12:
        if len(frame) <= pos or frame[pos] != 0:
            return None  # tagged fields in a response header: none is defined
        pos += 1
    if len(frame) < pos + 10:
        return None
    error_code, session_id = _ERROR_AND_SESSION.unpack_from(frame, pos + 4)
    return session_id if error_code == 0 and session_id != 0 else None


_ERROR_AND_SESSION = struct.Struct(">hi")


@attrs.define
class IdMap:
    """The capture's ids -> the target's, learnt from the target's responses as they come."""

    #: The capture's topic id (as a string) -> topic name, from its Metadata responses.
    source_names: dict[str, str]
    #: The target's topic ids by name, from the Metadata responses it sends us.
    target_ids: dict[str, uuid.UUID] = attrs.Factory(dict)
    #: Captured (producer id, epoch) -> the target's, from InitProducerId responses.
    #: Not per run: a producer keeps its id across broker restarts.
    producer_ids: dict[tuple[int, int], tuple[int, int]] = attrs.Factory(dict)
    #: Captured member id -> the target's, and (group, captured generation) -> the
    #: target's, from JoinGroup responses.
    member_ids: dict[str, str] = attrs.Factory(dict)
    generations: dict[tuple[str, int], int] = attrs.Factory(dict)
    #: Captured fetch session id -> the target's, from Fetch responses.
    session_ids: dict[int, int] = attrs.Factory(dict)

    # ---------------------------------------------------------------- rewriting

    def frame_for_target(self, request: CapturedRequest) -> bytes:
        """The request as sent: topic ids, producer ids and epochs, member ids and
        generations mapped from the capture's cluster to the target's."""
        # Produce and Fetch are the requests whose topic ids are rewritten here.
        uses_ids = request.api_key in (PRODUCE, FETCH) and uses_topic_ids(
            request.api_key, request.api_version
        )
        map_ids = uses_ids and bool(self.target_ids)
        map_producers = request.api_key == PRODUCE and bool(self.producer_ids)
        map_members = request.api_key in MEMBER_REQUESTS and bool(self.member_ids)
        map_session = request.api_key == FETCH and bool(self.session_ids)
        if not map_ids and not map_producers and not map_members and not map_session:
            return request.frame
        body: Any
        header, body = decode_request(request.frame)
        if map_session:
            body.session_id = self.session_ids.get(body.session_id, body.session_id)
        if map_members:
            self._map_members(body)
        if map_ids:
            topics = body.topic_data if request.api_key == PRODUCE else body.topics
            extra = getattr(body, "forgotten_topics_data", None) or []
            for topic in [*topics, *extra]:
                name = self.source_names.get(str(topic.topic_id))
                if name is not None and name in self.target_ids:
                    topic.topic_id = self.target_ids[name]
        if map_producers:
            for topic in body.topic_data:
                for part in topic.partition_data:
                    if part.records is not None:
                        part.records = self._map_producers(part.records)
        return encode_request(
            header.api_key, header.api_version, header.correlation_id, header.client_id, body
        )[4:]

    def _map_producers(self, records: Any) -> bytes:
        """Records whose batches carry the target's producer id and epoch."""
        buffer = bytearray(records)
        batches, _tail = split_batches(buffer)
        for batch in batches:
            captured = (batch.producer_id, batch.producer_epoch)
            target = self.producer_ids.get(captured)
            if target is not None and target != captured:
                batch.set_producer(*target)
        return bytes(buffer)

    def _map_members(self, body: Any) -> None:
        """Member ids (the request's, a SyncGroup's assignments', a LeaveGroup's members')
        and the generation, the target's in place of the capture's."""
        for holder in [body, *(getattr(body, "assignments", None) or [])]:
            holder.member_id = self.member_ids.get(holder.member_id, holder.member_id)
        for member in getattr(body, "members", None) or []:  # LeaveGroup v3+
            member.member_id = self.member_ids.get(member.member_id, member.member_id)
        for field in ("generation_id", "generation_id_or_member_epoch"):
            generation = getattr(body, field, None)
            if generation is not None:
                target = self.generations.get((body.group_id, generation), generation)
                setattr(body, field, target)

    # ---------------------------------------------------------------- learning

    def learn(
        self,
        request: CapturedRequest,
        frame: bytes,
        *,
        producer: tuple[int, int] | None = None,
        join: tuple[str, int] | None = None,
        fetch_session: int | None = None,
    ) -> None:
        """Learn from the target's response ``frame`` to ``request``; ``producer``,
        ``join`` and ``fetch_session`` are what the capture's response to it handed out
        (see :class:`~trio_broker.replay.plan.Plan`), if anything."""
        if request.api_key == METADATA:
            self.learn_topic_ids(request.api_version, frame)
        if fetch_session is not None:
            target = fetch_session_handed_out(request.api_version, frame)
            if target is not None:
                self.session_ids[fetch_session] = target
        if producer is not None:
            self.learn_producer(producer, request.api_version, frame)
        if join is not None:
            self.learn_member(join, request, frame)

    def learn_member(
        self, captured: tuple[str, int], request: CapturedRequest, frame: bytes
    ) -> None:
        target = member_handed_out(request.api_version, frame)
        if target is None:
            return
        self.member_ids[captured[0]] = target[0]
        if captured[1] >= 0 and target[1] >= 0:
            group = decode_request(request.frame)[1].group_id  # type: ignore[attr-defined]
            self.generations[(group, captured[1])] = target[1]

    def learn_producer(self, captured: tuple[int, int], version: int, frame: bytes) -> None:
        target = producer_handed_out(version, frame)
        if target is not None:
            self.producer_ids[captured] = target

    def learn_topic_ids(self, version: int, frame: bytes) -> None:
        self.target_ids.update(named_topic_ids(version, frame))
