"""The whole broker against ``spec.broker_model``, over real sockets.

Each Hypothesis example starts a real broker (the production ``Broker`` class, file
storage in a fresh directory) in a background thread with its own ``trio.run``; the
rules are client actions sent through a plain blocking socket with our own codec:
create topics, produce (plain and idempotent, acks 1 and all, every codec), fetch,
list offsets, commit and fetch offsets, InitProducerId (new id and epoch bump),
consumer groups (JoinGroup with the KIP-394 member id round trip, SyncGroup,
Heartbeat, a member's OffsetCommit, LeaveGroup; current, stale and made-up member ids
and generations), and a clean restart on the same data directory.
``spec.broker_model`` (with ``spec.group_model`` for the groups) predicts every answer
(error codes, offsets assigned, high watermarks, the fetched batches and records,
generations, leaders, protocols and assignments), and invariants compare every
partition's high watermark and log start offset, and every group's state, members and
assignments (DescribeGroups), after every step. The same machine runs under both
processing models.

The CI profile is small (10 examples x 15 steps per model); the thorough profile
(``HYPOTHESIS_PROFILE=thorough``) runs 200 x 40. The crashing variant runs the broker as
a ``trio-broker serve`` subprocess and adds kill -9 and restart; it is slower (2 x 10 in
CI, 50 x 40 thorough). The model allows a crash to lose an acks=1 tail, never an
acks=all batch nor a cut inside a batch.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from spec.broker_model import EARLIEST, LATEST, BrokerModel
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.compression import Compression
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch, iter_batches
from trio_broker.server.broker import Broker
from trio_broker.state.group import JoinResult, SyncResult

THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
pytestmark = pytest.mark.timeout(7200 if THOROUGH else 300)
EXAMPLES, STEPS = (200, 40) if THOROUGH else (10, 15)

TOPICS = ("alpha", "beta", "gamma")
GROUPS = ("g1", "g2")
_SIZE = struct.Struct(">i")
V_PRODUCE, V_FETCH, V_LIST, V_CREATE, V_INIT, V_COMMIT, V_OFFSET_FETCH = 9, 12, 7, 7, 4, 8, 7
V_JOIN, V_SYNC, V_HEARTBEAT, V_LEAVE, V_DESCRIBE_GROUPS = 9, 5, 4, 5, 5
#: Far longer than any example: no session or rebalance timer fires during a test (G1).
SESSION_MS = REBALANCE_MS = 300_000
#: What a consumer may offer (name, metadata); changing them makes a rebalance (rule 4).
PROTOCOL_SETS = (
    (("range", b"r1"),),
    (("range", b"r2"), ("roundrobin", b"rr")),
    (("roundrobin", b"rr"),),
)
#: The coordinator config the group model assumes (G1): no initial rebalance delay.
GROUP_CONFIG = "group.initial.rebalance.delay.ms = 0\n"


# ----------------------------------------------------------------------------- broker


class BrokerThread:
    """A real broker in a thread of its own; ``stop()`` shuts it down cleanly."""

    def __init__(self, data_dir: Path, processing_model: str) -> None:
        self.config = BrokerConfig(
            port=0,
            data_dir=data_dir,
            processing_model=processing_model,
            auto_create_topics=False,
            group_initial_rebalance_delay_ms=0,
        )
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="broker", daemon=True)
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("broker did not start")
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # surfaced by __init__ or stop()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self.broker: Broker = await nursery.start(Broker(self.config).run)
            self.port = self.broker.bound[0][1]
            self.token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
            await self.broker.shutdown()

    def stop(self) -> None:
        trio.from_thread.run_sync(self._stop.set, trio_token=self.token)
        self._thread.join(30)
        assert not self._thread.is_alive(), "broker did not stop"
        if self._error is not None:
            raise self._error


class ProcessBroker:
    """``trio-broker serve`` in a subprocess, so that ``kill()`` is a real kill -9."""

    LISTENING = re.compile(rb"listening on (\S+):(\d+)")

    def __init__(self, data_dir: Path, processing_model: str) -> None:
        exe = Path(sys.executable).with_name("trio-broker")
        self.log = (data_dir.parent / f"{data_dir.name}.log").open("ab")
        config = data_dir.parent / f"{data_dir.name}.toml"
        config.write_text(GROUP_CONFIG)
        self.proc = subprocess.Popen(
            [str(exe), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir),
             "--processing-model", processing_model, "--config", str(config)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.log.write(line)
            found = self.LISTENING.search(line)
            if found:
                self.port = int(found.group(2))
                # keep draining the output so the broker never blocks on a full pipe
                threading.Thread(target=self._drain, daemon=True).start()
                return
        self.proc.kill()
        raise RuntimeError("broker subprocess did not start")

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.write(line)

    def stop(self) -> None:
        if self.proc.poll() is not None:  # already stopped (a rule failed half-way)
            return
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0, "broker did not exit cleanly on SIGTERM"
        self.log.close()

    def kill(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.kill()
        self.proc.wait(30)
        self.log.close()


class Client:
    """Blocking request/response over one socket with our codec."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.correlation_id = 0

    def send(self, api_key: int, version: int, body: Any) -> None:
        """A request that gets no response (Produce with acks=0)."""
        self.correlation_id += 1
        self.sock.sendall(m.encode_request(api_key, version, self.correlation_id, "spec", body))

    def call(self, api_key: int, version: int, body: Any) -> Any:
        self.send(api_key, version, body)
        (size,) = _SIZE.unpack(self._exactly(4))
        correlation_id, response = m.decode_response(api_key, version, self._exactly(size))
        assert correlation_id == self.correlation_id
        return response

    def _exactly(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            assert chunk, "broker closed the connection"
            out += chunk
        return bytes(out)

    def close(self) -> None:
        self.sock.close()


# ------------------------------------------------------------------------- machine


class BrokerMachine(RuleBasedStateMachine):
    processing_model = "pipelined"

    def __init__(self) -> None:
        super().__init__()
        self.model = BrokerModel()
        self.data_dir = Path(tempfile.mkdtemp(prefix="broker-machine-"))
        self.server = self.start()
        self.client = Client(self.server.port)
        # producer id -> current epoch; every idempotent batch sent, for retries
        self.producers: dict[int, int] = {}
        self.next_seq: dict[tuple[int, int, str, int], int] = {}
        self.sent: list[tuple[int, int, str, int, int, tuple[bytes, ...]]] = []
        self.serial = 0
        # group -> what our consumer believes: (member id, generation, protocol name)
        self.members: dict[str, tuple[str, int, str | None]] = {}

    def start(self) -> ProcessBroker | BrokerThread:
        return BrokerThread(self.data_dir, self.processing_model)

    def teardown(self) -> None:
        self.client.close()
        self.server.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.data_dir.with_name(f"{self.data_dir.name}.log").unlink(missing_ok=True)
        self.data_dir.with_name(f"{self.data_dir.name}.toml").unlink(missing_ok=True)

    # ---------------------------------------------------------------- helpers

    def values(self, count: int) -> tuple[bytes, ...]:
        self.serial += 1
        return tuple(b"v%d-%d" % (self.serial, i) for i in range(count))

    def send_batch(self, topic: str, index: int, batch: bytes, acks: int) -> tuple[int, int]:
        Req = m.ProduceRequest
        data = Req.TopicProduceData(
            name=topic,
            partition_data=[Req.TopicProduceData.PartitionProduceData(index=index, records=batch)],
        )
        body = Req(transactional_id=None, acks=acks, timeout_ms=10_000, topic_data=[data])
        if acks == 0:  # no answer; the next request on this connection sees the append
            self.client.send(m.ApiKey.PRODUCE, V_PRODUCE, body)
            return ErrorCode.NONE, -1
        answer = self.client.call(m.ApiKey.PRODUCE, V_PRODUCE, body)
        part = answer.responses[0].partition_responses[0]
        return part.error_code, part.base_offset

    def check_produce(
        self,
        topic: str,
        index: int,
        values: tuple[bytes, ...],
        acks: int,
        codec: Compression,
        producer: tuple[int, int, int] = (-1, -1, -1),
    ) -> int:
        pid, epoch, seq = producer
        batch = bytes(
            build_batch(
                [(None, v) for v in values],
                compression=codec,
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=seq,
            )
        )
        expected = self.model.produce(topic, index, values, len(batch), acks, producer)
        actual = self.send_batch(topic, index, batch, acks)
        note(f"produce {topic}[{index}] {producer} x{len(values)} acks={acks} -> {actual}")
        if acks == 0:
            return int(expected.error)
        assert actual == (expected.error, expected.base_offset), (
            f"Produce {topic}[{index}] producer={producer} n={len(values)} acks={acks} "
            f"{codec.name}: expected {expected}, got {actual}"
        )
        return int(expected.error)

    # ---------------------------------------------------------------- rules

    @initialize()
    def first_topic(self) -> None:
        self.create_topic(TOPICS[0], 2)

    @rule(name=st.sampled_from(TOPICS), partitions=st.integers(0, 2))
    def create_topic(self, name: str, partitions: int) -> None:
        Req = m.CreateTopicsRequest
        topic = Req.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=1, assignments=[], configs=[]
        )
        answer = self.client.call(
            m.ApiKey.CREATE_TOPICS,
            V_CREATE,
            Req(topics=[topic], timeout_ms=5000, validate_only=False),
        )
        expected = self.model.create_topic(name, partitions)
        assert answer.topics[0].error_code == expected, (name, partitions, answer.topics[0])

    @rule(
        topic=st.sampled_from(TOPICS),
        index=st.integers(0, 2),
        count=st.integers(1, 4),
        acks=st.sampled_from([0, 1, -1]),
        codec=st.sampled_from(Compression),
    )
    def produce(self, topic: str, index: int, count: int, acks: int, codec: Compression) -> None:
        if acks == 0 and self.model.partition(topic, index) is None:
            acks = 1  # L6: an acks=0 error closes the connection in Kafka; not modelled here
        self.check_produce(topic, index, self.values(count), acks, codec)

    @rule(bump=st.booleans())
    def init_producer_id(self, bump: bool) -> None:
        pid, epoch = (next(iter(self.producers.items()))) if bump and self.producers else (-1, -1)
        body = m.InitProducerIdRequest(
            transactional_id=None,
            transaction_timeout_ms=60_000,
            producer_id=pid,
            producer_epoch=epoch,
        )
        answer = self.client.call(m.ApiKey.INIT_PRODUCER_ID, V_INIT, body)
        assert answer.error_code == ErrorCode.NONE, answer
        if pid == -1:  # P1: a fresh id at epoch 0
            assert self.model.producer_id_granted(answer.producer_id, answer.producer_epoch)
        else:  # KIP-360: same id, epoch + 1, sequences start again at 0
            assert (answer.producer_id, answer.producer_epoch) == (pid, epoch + 1), answer
        self.producers[answer.producer_id] = answer.producer_epoch

    @precondition(lambda self: self.producers)
    @rule(
        data=st.data(),
        topic=st.sampled_from(TOPICS),
        index=st.integers(0, 1),
        count=st.integers(1, 3),
        shift=st.sampled_from([0, 0, 0, 1, -1]),
        acks=st.sampled_from([1, -1]),
        codec=st.sampled_from(Compression),
    )
    def produce_idempotent(
        self,
        data: st.DataObject,
        topic: str,
        index: int,
        count: int,
        shift: int,
        acks: int,
        codec: Compression,
    ) -> None:
        """The next sequence (mostly), or a gap / overlap one off it."""
        pid = data.draw(st.sampled_from(sorted(self.producers)))
        epoch = self.producers[pid]
        key = (pid, epoch, topic, index)
        seq = max(0, self.next_seq.get(key, 0) + shift)
        values = self.values(count)
        if self.check_produce(topic, index, values, acks, codec, (pid, epoch, seq)) == 0:
            self.next_seq[key] = max(self.next_seq.get(key, 0), seq + count)
            self.sent.append((pid, epoch, topic, index, seq, values))

    @precondition(lambda self: self.sent)
    @rule(data=st.data(), acks=st.sampled_from([1, -1]))
    def retry_idempotent(self, data: st.DataObject, acks: int) -> None:
        """A client resends a batch it already sent (its answer was lost): a duplicate
        inside the 5-batch window, OUT_OF_ORDER_SEQUENCE_NUMBER beyond it."""
        pid, epoch, topic, index, seq, values = data.draw(st.sampled_from(self.sent))
        self.check_produce(topic, index, values, acks, Compression.NONE, (pid, epoch, seq))

    @rule(topic=st.sampled_from(TOPICS), index=st.integers(0, 2), where=st.integers(-1, 3))
    def fetch(self, topic: str, index: int, where: int) -> None:
        part = self.model.partition(topic, index)
        hw = part.high_watermark if part else 0
        offset = {-1: hw + 1, 0: 0, 1: hw, 2: max(0, hw - 1), 3: hw // 2}[where]
        expected = self.model.fetch(topic, index, offset, 1 << 20)
        Req = m.FetchRequest
        body = Req(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=1 << 20,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=[
                Req.FetchTopic(
                    topic=topic,
                    partitions=[
                        Req.FetchTopic.FetchPartition(
                            partition=index,
                            current_leader_epoch=-1,
                            fetch_offset=offset,
                            last_fetched_epoch=-1,
                            log_start_offset=-1,
                            partition_max_bytes=1 << 20,
                        )
                    ],
                )
            ],
            forgotten_topics_data=[],
            rack_id="",
        )
        answer = self.client.call(m.ApiKey.FETCH, V_FETCH, body)
        part_answer = answer.responses[0].partitions[0]
        got = [
            (view.base_offset, tuple(bytes(r.value or b"") for r in view.records()))
            for view in iter_batches(bytearray(bytes(part_answer.records or b"")))
        ]
        want = [(b.base_offset, b.values) for b in expected.batches]
        note(f"fetch {topic}[{index}]@{offset} -> {part_answer.error_code} {got}")
        assert part_answer.error_code == expected.error, (topic, index, offset, part_answer)
        if expected.error == ErrorCode.NONE:
            assert part_answer.high_watermark == expected.high_watermark
            assert part_answer.log_start_offset == expected.log_start_offset
            assert got == want, f"Fetch {topic}[{index}]@{offset}: expected {want}, got {got}"

    @rule(
        topic=st.sampled_from(TOPICS),
        index=st.integers(0, 2),
        timestamp=st.sampled_from([LATEST, EARLIEST]),
    )
    def list_offsets(self, topic: str, index: int, timestamp: int) -> None:
        answer = self.list_offsets_of([(topic, index)], timestamp)[0]
        expected = self.model.list_offset(topic, index, timestamp)
        assert (answer.error_code, answer.offset) == expected, (topic, index, timestamp, answer)

    @rule(
        group=st.sampled_from(GROUPS),
        topic=st.sampled_from(TOPICS),
        index=st.integers(0, 2),
        offset=st.integers(0, 50),
    )
    def commit_and_fetch_offsets(self, group: str, topic: str, index: int, offset: int) -> None:
        """A simple consumer (no member id, generation -1): C1, or refused by a live group."""
        self.check_commit(group, topic, index, offset, "", -1)

    def check_commit(
        self, group: str, topic: str, index: int, offset: int, member_id: str, generation: int
    ) -> None:
        Commit = m.OffsetCommitRequest
        Part = Commit.OffsetCommitRequestTopic.OffsetCommitRequestPartition
        body = Commit(
            group_id=group,
            generation_id_or_member_epoch=generation,
            member_id=member_id,
            group_instance_id=None,
            retention_time_ms=-1,
            topics=[
                Commit.OffsetCommitRequestTopic(
                    name=topic,
                    partitions=[
                        Part(partition_index=index, committed_offset=offset, committed_metadata="m")
                    ],
                )
            ],
        )
        answer = self.client.call(m.ApiKey.OFFSET_COMMIT, V_COMMIT, body)
        expected = self.model.commit(group, topic, index, offset, "m", member_id, generation)
        note(
            f"commit {group} {member_id or '-'}@{generation} {topic}[{index}]={offset} -> {expected}"
        )
        assert answer.topics[0].partitions[0].error_code == expected, answer
        self.check_committed(group)

    # ---------------------------------------------------------------- group rules

    @rule(
        group=st.sampled_from(GROUPS),
        protocols=st.sampled_from(PROTOCOL_SETS),
        made_up_id=st.sampled_from([False, False, False, True]),
        session_ms=st.sampled_from([SESSION_MS, SESSION_MS, SESSION_MS, 1000]),
    )
    def join_group(
        self,
        group: str,
        protocols: tuple[tuple[str, bytes], ...],
        made_up_id: bool,
        session_ms: int,
    ) -> None:
        """A consumer (re)joins. Without a member id: MEMBER_ID_REQUIRED and a pending id,
        then the rejoin with it (KIP-394); with its id (rule 4/12); or with an id the
        group never gave (UNKNOWN_MEMBER_ID). A session below the minimum is refused."""
        known = self.members.get(group)
        member_id = "made-up-member" if made_up_id else known[0] if known else ""
        if member_id == "":
            answer = self.send_join(group, "", protocols, session_ms)
            expected = self.model.join_group(
                group, "", answer.member_id, protocols, session_ms, REBALANCE_MS
            )
            self.check_join(group, "", expected, answer)
            if answer.error_code != ErrorCode.MEMBER_ID_REQUIRED:
                return
            member_id = answer.member_id
        expected = self.model.join_group(group, member_id, "", protocols, session_ms, REBALANCE_MS)
        assert expected is not None, "the machine never sends a JoinGroup the model parks"
        answer = self.send_join(group, member_id, protocols, session_ms)
        self.check_join(group, member_id, expected, answer)
        if answer.error_code == ErrorCode.NONE:
            self.members[group] = (answer.member_id, answer.generation_id, answer.protocol_name)
        elif answer.error_code == ErrorCode.UNKNOWN_MEMBER_ID and not made_up_id:
            self.members.pop(group, None)  # a client forgets its id and joins afresh

    @precondition(lambda self: self.members)
    @rule(data=st.data(), shift=st.sampled_from([0, 0, 0, -1, 1]))
    def sync_group(self, data: st.DataObject, shift: int) -> None:
        """The (only, hence leading) member sends the assignment; a stale or future
        generation is ILLEGAL_GENERATION."""
        group = data.draw(st.sampled_from(sorted(self.members)))
        member_id, generation, protocol_name = self.members[group]
        self.serial += 1
        assignment = b"assignment-%d" % self.serial
        expected = self.model.sync_group(
            group, member_id, generation + shift, {member_id: assignment}
        )
        assert expected is not None, "the machine never sends a SyncGroup the model parks"
        Req = m.SyncGroupRequest
        body = Req(
            group_id=group,
            generation_id=generation + shift,
            member_id=member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocol_name=protocol_name,
            assignments=[
                Req.SyncGroupRequestAssignment(member_id=member_id, assignment=assignment)
            ],
        )
        answer = self.client.call(m.ApiKey.SYNC_GROUP, V_SYNC, body)
        got = SyncResult(
            answer.error_code, answer.protocol_type, answer.protocol_name, bytes(answer.assignment)
        )
        note(f"sync {group} {member_id}@{generation + shift} -> {got}")
        assert got == expected, f"SyncGroup {group}: expected {expected}, got {got}"
        self.forget_if_unknown(group, got.error)

    @precondition(lambda self: self.members)
    @rule(data=st.data(), shift=st.sampled_from([0, 0, -1]))
    def heartbeat(self, data: st.DataObject, shift: int) -> None:
        group = data.draw(st.sampled_from(sorted(self.members)))
        member_id, generation, _ = self.members[group]
        body = m.HeartbeatRequest(
            group_id=group,
            generation_id=generation + shift,
            member_id=member_id,
            group_instance_id=None,
        )
        answer = self.client.call(m.ApiKey.HEARTBEAT, V_HEARTBEAT, body)
        expected = self.model.heartbeat(group, member_id, generation + shift)
        note(f"heartbeat {group} {member_id}@{generation + shift} -> {answer.error_code}")
        assert answer.error_code == expected, (
            f"Heartbeat {group}: expected {expected}, got {answer}"
        )
        self.forget_if_unknown(group, answer.error_code)

    @precondition(lambda self: self.members)
    @rule(
        data=st.data(),
        topic=st.sampled_from(TOPICS),
        index=st.integers(0, 2),
        offset=st.integers(0, 50),
        shift=st.sampled_from([0, 0, 0, -1]),
    )
    def commit_as_member(
        self, data: st.DataObject, topic: str, index: int, offset: int, shift: int
    ) -> None:
        """A group member commits with its generation (sentence 13), or a stale one."""
        group = data.draw(st.sampled_from(sorted(self.members)))
        member_id, generation, _ = self.members[group]
        self.check_commit(group, topic, index, offset, member_id, generation + shift)

    @rule(group=st.sampled_from(GROUPS), made_up_id=st.booleans())
    def leave_group(self, group: str, made_up_id: bool) -> None:
        known = self.members.get(group)
        member_id = known[0] if known and not made_up_id else "made-up-member"
        Req = m.LeaveGroupRequest
        body = Req(
            group_id=group,
            member_id="",
            members=[Req.MemberIdentity(member_id=member_id, group_instance_id=None, reason=None)],
        )
        answer = self.client.call(m.ApiKey.LEAVE_GROUP, V_LEAVE, body)
        expected = self.model.leave_group(group, member_id)
        note(f"leave {group} {member_id} -> {answer}")
        assert answer.error_code == ErrorCode.NONE, answer
        assert [(x.member_id, x.error_code) for x in answer.members] == [(member_id, expected)]
        if member_id != "made-up-member":
            self.members.pop(group, None)

    @rule()
    def restart(self) -> None:
        """A clean shutdown and a start on the same data directory (L5, P3, C3)."""
        self.client.close()
        self.server.stop()
        self.model.restart_clean()
        self.server = self.start()
        self.client = Client(self.server.port)
        for group in GROUPS:
            self.check_committed(group)

    # ---------------------------------------------------------------- checks

    def send_join(
        self, group: str, member_id: str, protocols: tuple[tuple[str, bytes], ...], session_ms: int
    ) -> Any:
        Req = m.JoinGroupRequest
        body = Req(
            group_id=group,
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=REBALANCE_MS,
            member_id=member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocols=[Req.JoinGroupRequestProtocol(name=n, metadata=md) for n, md in protocols],
            reason=None,
        )
        return self.client.call(m.ApiKey.JOIN_GROUP, V_JOIN, body)

    def check_join(
        self, group: str, member_id: str, expected: JoinResult | None, answer: Any
    ) -> None:
        got = JoinResult(
            answer.error_code,
            answer.generation_id,
            answer.protocol_type,
            answer.protocol_name,
            answer.leader,
            answer.member_id,
            tuple((x.member_id, x.group_instance_id, bytes(x.metadata)) for x in answer.members),
            answer.skip_assignment,
        )
        note(f"join {group} {member_id or '-'} -> {got}")
        assert got == expected, f"JoinGroup {group} {member_id!r}: expected {expected}, got {got}"

    def forget_if_unknown(self, group: str, error: int) -> None:
        if error == ErrorCode.UNKNOWN_MEMBER_ID:
            self.members.pop(group, None)  # the client's member id is gone: it joins afresh

    def list_offsets_of(self, parts: list[tuple[str, int]], timestamp: int) -> list[Any]:
        Req = m.ListOffsetsRequest
        P = Req.ListOffsetsTopic.ListOffsetsPartition
        topics = [
            Req.ListOffsetsTopic(
                name=t,
                partitions=[P(partition_index=i, current_leader_epoch=-1, timestamp=timestamp)],
            )
            for t, i in parts
        ]
        body = Req(replica_id=-1, isolation_level=0, topics=topics, timeout_ms=5000)
        answer = self.client.call(m.ApiKey.LIST_OFFSETS, V_LIST, body)
        return [t.partitions[0] for t in answer.topics]

    def check_committed(self, group: str) -> None:
        Fetch = m.OffsetFetchRequest
        names = sorted(self.model.topics)
        body = Fetch(
            group_id=group,
            require_stable=False,
            topics=[
                Fetch.OffsetFetchRequestTopic(
                    name=t, partition_indexes=list(range(len(self.model.topics[t])))
                )
                for t in names
            ],
        )
        answer = self.client.call(m.ApiKey.OFFSET_FETCH, V_OFFSET_FETCH, body)
        assert answer.error_code == ErrorCode.NONE, answer
        got = {
            (t.name, p.partition_index): p.committed_offset
            for t in answer.topics
            for p in t.partitions
        }
        want = {
            (t, i): self.model.fetch_committed(group, t, i)
            for t in names
            for i in range(len(self.model.topics[t]))
        }
        assert got == want, f"OffsetFetch {group}: expected {want}, got {got}"

    @invariant()
    def groups_match_the_model(self) -> None:
        body = m.DescribeGroupsRequest(groups=list(GROUPS), include_authorized_operations=False)
        answer = self.client.call(m.ApiKey.DESCRIBE_GROUPS, V_DESCRIBE_GROUPS, body)
        got = {
            g.group_id: (
                g.error_code,
                g.group_state,
                [(x.member_id, bytes(x.member_assignment)) for x in g.members],
            )
            for g in answer.groups
        }
        want = {group: (ErrorCode.NONE, *self.model.describe_group(group)) for group in GROUPS}
        assert got == want, f"DescribeGroups: expected {want}, got {got}"

    @invariant()
    def offsets_match_the_model(self) -> None:
        parts = [(t, i) for t, ps in sorted(self.model.topics.items()) for i in range(len(ps))]
        for timestamp in (LATEST, EARLIEST):
            answers = self.list_offsets_of(parts, timestamp)
            got = [(a.error_code, a.offset) for a in answers]
            want = [self.model.list_offset(t, i, timestamp) for t, i in parts]
            assert got == want, f"ListOffsets {timestamp} of {parts}: expected {want}, got {got}"


class CrashingBrokerMachine(BrokerMachine):
    """The same rules against a subprocess broker, plus kill -9 and restart (L5)."""

    def start(self) -> ProcessBroker | BrokerThread:
        return ProcessBroker(self.data_dir, self.processing_model)

    @rule()
    def kill_and_restart(self) -> None:
        self.client.close()
        server = self.server
        assert isinstance(server, ProcessBroker)
        server.kill()
        self.server = self.start()
        self.client = Client(self.server.port)
        parts = [(t, i) for t, ps in sorted(self.model.topics.items()) for i in range(len(ps))]
        answers = self.list_offsets_of(parts, LATEST)
        self.model.restarted_after_crash()
        for (topic, index), answer in zip(parts, answers, strict=True):
            low, high = self.model.crash_bounds(topic, index)
            note(f"kill -9: {topic}[{index}] log end {answer.offset}, allowed [{low}, {high}]")
            assert answer.error_code == ErrorCode.NONE, answer
            assert low <= answer.offset <= high, (
                f"after kill -9, {topic}[{index}] ends at {answer.offset}: "
                f"acks=all batches end at {low}, everything acknowledged at {high}"
            )
            ends = {b.last_offset + 1 for b in self.model.topics[topic][index].batches}
            assert answer.offset in ends | {low}, f"{topic}[{index}] cut inside a batch"
            self.model.crashed(topic, index, answer.offset)
        for group in GROUPS:
            self.check_committed(group)


SETTINGS = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None)


class PipelinedBrokerMachine(BrokerMachine):
    processing_model = "pipelined"


class SerialBrokerMachine(BrokerMachine):
    processing_model = "serial"


TestPipelinedBroker = PipelinedBrokerMachine.TestCase
TestPipelinedBroker.settings = SETTINGS
TestSerialBroker = SerialBrokerMachine.TestCase
TestSerialBroker.settings = SETTINGS


class PipelinedCrashingMachine(CrashingBrokerMachine):
    processing_model = "pipelined"


class SerialCrashingMachine(CrashingBrokerMachine):
    processing_model = "serial"


# Subprocess brokers start in about a second: fewer, shorter examples in CI.
CRASH_SETTINGS = settings(
    max_examples=50 if THOROUGH else 2, stateful_step_count=STEPS if THOROUGH else 10,
    deadline=None,
)  # fmt: skip
TestPipelinedCrashingBroker = PipelinedCrashingMachine.TestCase
TestPipelinedCrashingBroker.settings = CRASH_SETTINGS
TestSerialCrashingBroker = SerialCrashingMachine.TestCase
TestSerialCrashingBroker.settings = CRASH_SETTINGS
