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
assignments (DescribeGroups), after every step. A node alone's high watermark is its
durable end (the flusher syncs an acks=0/1 batch soon after it is answered): a check
that reads it first waits, with a deadline, until it reaches the model's (``settle``). The same machine runs under both
processing models.

The CI profile is small (10 examples x 15 steps per model); the thorough profile
(``HYPOTHESIS_PROFILE=thorough``) runs 200 x 40. The crashing variant runs the broker as
a ``trio-broker serve`` subprocess and adds kill -9 and restart; it is slower (2 x 10 in
CI, 50 x 40 thorough). The model allows a crash to lose an acks=1 tail, never an
acks=all batch nor a cut inside a batch.

The power-cut variant puts the subprocess broker's data directory on a ``tests/faultfs``
mount (one per example) and adds power cuts (L7): kill -9 (the broker is a process, so
nothing is flushed or closed: the kernel drops its descriptors), cut the power (only what
was fsynced survives; the cut's mode, seed and directory-entry survival are drawn), start
again on the same directory. Sometimes the broker gets a request it never answers just
before the kill (a produce, an offset commit or a topic creation), which may or may not
survive. After a cut the machine reads back every partition and checks the survivors byte
for byte against what was sent, then adopts the surviving tail; topics (ids, partitions,
configs), committed offsets and the cluster id must all be as answered. The broker runs
with acks=0/1 data fsynced lazily or at once (drawn at each cut), and some topics get
small segments so that cuts land on segment rolls. Without FUSE the test fails with
``FUSE unavailable: ...``. CI runs 10 x 20 per processing model and does not shrink a
failure (each step may restart the broker); thorough runs 50 x 40 and shrinks.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import Phase, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from spec.broker_model import EARLIEST, LATEST, BrokerModel
from tests.broker_fork import start_broker
from tests.faultfs import MODES, FaultFS, fuse_available
from tests.waits import wait_until
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.compression import Compression
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch, iter_batches
from trio_broker.server.broker import Broker
from trio_broker.services.topics import RESERVED_TOPICS as INTERNAL_TOPICS
from trio_broker.state.group import JoinResult, SyncResult

THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
#: pytest-timeout's guard against a hang, not a budget: every answer the machine waits
#: for already has its own 20 s socket timeout. At 300 s it stopped healthy runs on the
#: loaded machine (the power-cut machine took 241 s of it at seed 1 beside a CPU hog, and
#: the eleventh round's scoring counted two such stops as catches).
pytestmark = pytest.mark.timeout(7200 if THOROUGH else 1200)
EXAMPLES, STEPS = (200, 40) if THOROUGH else (10, 15)
#: How long a check waits for the high watermarks to reach the model's (``settle``).
SETTLE_S = 60.0
#: How long a broker (thread or process) may take to say it listens: at least a minute, as
#: every start in the suite (docs/testing-waits.md); 20 s failed under load.
BROKER_START_S = 60.0

TOPICS = ("alpha", "beta", "gamma")
GROUPS = ("g1", "g2")
_SIZE = struct.Struct(">i")
V_PRODUCE, V_FETCH, V_LIST, V_CREATE, V_INIT, V_COMMIT, V_OFFSET_FETCH = 9, 12, 7, 7, 4, 8, 7
V_JOIN, V_SYNC, V_HEARTBEAT, V_LEAVE, V_DESCRIBE_GROUPS = 9, 5, 4, 5, 5
V_METADATA, V_DESCRIBE_CONFIGS, V_CREATE_PARTITIONS = 12, 4, 3
DYNAMIC_TOPIC_CONFIG = 1  # DescribeConfigs config_source of a topic's own override
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

    def __init__(
        self, data_dir: Path, processing_model: str, queued_max_request_bytes: int | None = None
    ) -> None:
        budget: dict[str, Any] = (
            {}
            if queued_max_request_bytes is None
            else {"queued_max_request_bytes": queued_max_request_bytes}
        )
        self.config = BrokerConfig(
            port=0,
            data_dir=data_dir,
            processing_model=processing_model,
            auto_create_topics=False,
            group_initial_rebalance_delay_ms=0,
            **budget,
        )
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="broker", daemon=True)
        self._thread.start()
        if not self._ready.wait(BROKER_START_S):
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

    def __init__(
        self,
        data_dir: Path,
        processing_model: str,
        aux_dir: Path | None = None,
        extra_config: str = "",
    ) -> None:
        """``aux_dir`` (default: the data directory's parent) holds the log and the config."""
        exe = Path(sys.executable).with_name("trio-broker")
        aux_dir = data_dir.parent if aux_dir is None else aux_dir
        self.log = (aux_dir / f"{data_dir.name}.log").open("ab")
        config = aux_dir / f"{data_dir.name}.toml"
        config.write_text(GROUP_CONFIG + extra_config)
        # Forked from a parent that imported the broker already (tests/broker_fork.py).
        self.proc = start_broker(
            [str(exe), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir),
             "--processing-model", processing_model, "--config", str(config)],
        )  # fmt: skip
        assert self.proc.stderr is not None
        deadline = time.monotonic() + BROKER_START_S
        try:
            while time.monotonic() < deadline:
                line = self.proc.stderr.readline()
                if not line:
                    break
                self.log.write(line)
                found = self.LISTENING.search(line)
                if found:
                    self.port = int(found.group(2))
                    # keep draining the output so the broker never blocks on a full pipe
                    threading.Thread(target=self._drain, daemon=True).start()
                    return
            raise RuntimeError("broker subprocess did not start")
        except BaseException:  # that too, or an interrupted read: no broker left behind
            self.kill()
            raise

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.write(line)

    def stop(self) -> None:
        if self.proc.poll() is not None:  # already stopped (a rule failed half-way)
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(30)
        finally:  # a hang (TimeoutExpired), or an interrupted wait
            self.kill()
        assert code == 0, "broker did not exit cleanly on SIGTERM"

    def kill(self) -> None:
        if self.proc.poll() is None:
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
        # every batch the broker accepted, as sent: (topic, partition, base offset) -> bytes
        self.raw: dict[tuple[str, int, int], bytes] = {}
        self.topic_ids: dict[str, uuid.UUID] = {}
        self.data_dir = self.make_data_dir()
        try:
            self.server = self.start()
            self.client = Client(self.server.port)
            self.cluster_id = self.metadata().cluster_id
        except BaseException:
            self.remove_files()
            raise
        # producer id -> current epoch; every idempotent batch sent, for retries
        self.producers: dict[int, int] = {}
        self.next_seq: dict[tuple[int, int, str, int], int] = {}
        self.sent: list[tuple[int, int, str, int, int, tuple[bytes, ...]]] = []
        self.serial = 0
        # group -> what our consumer believes: (member id, generation, protocol name)
        self.members: dict[str, tuple[str, int, str | None]] = {}

    def make_data_dir(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="broker-machine-"))

    def start(self) -> ProcessBroker | BrokerThread:
        return BrokerThread(self.data_dir, self.processing_model)

    def teardown(self) -> None:
        try:
            self.client.close()
            self.server.stop()
        finally:
            self.remove_files()

    def remove_files(self) -> None:
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
        if expected.error == ErrorCode.NONE:  # a duplicate keeps the original's bytes
            self.raw.setdefault((topic, index, expected.base_offset), batch)
        actual = self.send_batch(topic, index, batch, acks)
        note(f"produce {topic}[{index}] {producer} x{len(values)} acks={acks} -> {actual}")
        if acks == 0:
            return int(expected.error)
        assert actual == (expected.error, expected.base_offset), (
            f"Produce {topic}[{index}] producer={producer} n={len(values)} acks={acks} "
            f"{codec.name}: expected {expected}, got {actual}"
        )
        if (
            acks == -1
            and expected.error == ErrorCode.NONE
            and isinstance(self.server, BrokerThread)
        ):
            # A node alone acknowledges acks=all only once the write is synced (its HW is
            # its durable end, docs/reliability.md): every record of it, the last too.
            log_ = self.server.broker.topics.log(topic, index)
            last = expected.base_offset + len(values) - 1
            assert log_ is not None and log_.durable_end_offset > last, (
                f"acks=all Produce {topic}[{index}] answered with offsets up to {last} while "
                f"the log is durable below {log_ and log_.durable_end_offset}"
            )
        return int(expected.error)

    # ---------------------------------------------------------------- rules

    @initialize()
    def first_topic(self) -> None:
        self.create_topic(TOPICS[0], 2)

    @rule(name=st.sampled_from(TOPICS), partitions=st.integers(0, 2))
    def create_topic(self, name: str, partitions: int) -> None:
        self.check_create(name, partitions, {})

    @rule(name=st.sampled_from(TOPICS), more=st.integers(-1, 2))
    def create_partitions(self, name: str, more: int) -> None:
        # T3: grow by ``more`` (0 or -1: not an increase); the new partitions are then in
        # reach of every rule that draws a partition index.
        count = len(self.model.topics.get(name, ())) + more
        CP = m.CreatePartitionsRequest
        body = CP(
            topics=[CP.CreatePartitionsTopic(name=name, count=count, assignments=None)],
            timeout_ms=5000, validate_only=False,
        )  # fmt: skip
        (result,) = self.client.call(m.ApiKey.CREATE_PARTITIONS, V_CREATE_PARTITIONS, body).results
        expected = self.model.create_partitions(name, count)
        assert result.error_code == expected, (name, count, result)

    def create_request(self, name: str, partitions: int, configs: dict[str, str]) -> Any:
        Req = m.CreateTopicsRequest
        C = Req.CreatableTopic.CreatableTopicConfig
        topic = Req.CreatableTopic(
            name=name,
            num_partitions=partitions,
            replication_factor=1,
            assignments=[],
            configs=[C(name=k, value=v) for k, v in sorted(configs.items())],
        )
        return Req(topics=[topic], timeout_ms=5000, validate_only=False)

    def check_create(self, name: str, partitions: int, configs: dict[str, str]) -> None:
        body = self.create_request(name, partitions, configs)
        answer = self.client.call(m.ApiKey.CREATE_TOPICS, V_CREATE, body)
        expected = self.model.create_topic(name, partitions, configs)
        assert answer.topics[0].error_code == expected, (name, partitions, answer.topics[0])
        if expected == ErrorCode.NONE:
            self.topic_ids[name] = answer.topics[0].topic_id

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

    def settle(self) -> None:
        """Wait until every partition's high watermark has reached the model's, the log
        end: a node alone's is its durable end (docs/reliability.md), so an acks=0/1
        batch is read once the flusher has synced it, at once but not in the same step.
        A high watermark past the model's is not waited out: the comparisons after
        catch it. Deadline: 60 s."""
        parts = [(t, i) for t, ps in sorted(self.model.topics.items()) for i in range(len(ps))]
        deadline = time.monotonic() + SETTLE_S
        while parts:
            answers = self.list_offsets_of(parts, LATEST)
            behind = [
                (t, i, a.offset)
                for (t, i), a in zip(parts, answers, strict=True)
                if a.error_code == ErrorCode.NONE
                and a.offset < self.model.topics[t][i].high_watermark
            ]
            if not behind:
                return
            assert time.monotonic() < deadline, f"not synced within {SETTLE_S} s: {behind}"
            time.sleep(0.002)

    @rule(topic=st.sampled_from(TOPICS), index=st.integers(0, 2), where=st.integers(-1, 3))
    def fetch(self, topic: str, index: int, where: int) -> None:
        self.settle()
        part = self.model.partition(topic, index)
        hw = part.high_watermark if part else 0
        offset = {-1: hw + 1, 0: 0, 1: hw, 2: max(0, hw - 1), 3: hw // 2}[where]
        expected = self.model.fetch(topic, index, offset, 1 << 20)
        part_answer = self.fetch_at(topic, index, offset)
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

    def fetch_at(self, topic: str, index: int, offset: int) -> Any:
        """One partition's Fetch answer from ``offset`` (up to 1 MiB, no waiting)."""
        body = self.fetch_request(topic, index, offset)
        answer = self.client.call(m.ApiKey.FETCH, V_FETCH, body)
        return answer.responses[0].partitions[0]

    @staticmethod
    def fetch_request(
        topic: str, index: int, offset: int, max_wait_ms: int = 0, min_bytes: int = 0
    ) -> Any:
        Req = m.FetchRequest
        return Req(
            replica_id=-1,
            max_wait_ms=max_wait_ms,
            min_bytes=min_bytes,
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

    @rule(
        topic=st.sampled_from(TOPICS),
        index=st.integers(0, 2),
        timestamp=st.sampled_from([LATEST, EARLIEST]),
    )
    def list_offsets(self, topic: str, index: int, timestamp: int) -> None:
        self.settle()
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
        self.check_catalogue()
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
        names = sorted(self.model.topics)
        got = self.committed_offsets(group)
        want = {
            (t, i): self.model.fetch_committed(group, t, i)
            for t in names
            for i in range(len(self.model.topics[t]))
        }
        assert got == want, f"OffsetFetch {group}: expected {want}, got {got}"

    def committed_offsets(self, group: str) -> dict[tuple[str, int], int]:
        """OffsetFetch of every partition the model knows."""
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
        return {
            (t.name, p.partition_index): p.committed_offset
            for t in answer.topics
            for p in t.partitions
        }

    def metadata(self) -> Any:
        body = m.MetadataRequest(topics=None, allow_auto_topic_creation=False)
        return self.client.call(m.ApiKey.METADATA, V_METADATA, body)

    def topic_configs(self, names: list[str]) -> dict[str, dict[str, str]]:
        """Each topic's own config overrides, by DescribeConfigs."""
        Req = m.DescribeConfigsRequest
        body = Req(
            resources=[
                Req.DescribeConfigsResource(
                    resource_type=2, resource_name=name, configuration_keys=None
                )
                for name in names
            ],
            include_synonyms=False,
            include_documentation=False,
        )
        answer = self.client.call(m.ApiKey.DESCRIBE_CONFIGS, V_DESCRIBE_CONFIGS, body)
        out = {}
        for result in answer.results:
            assert result.error_code == ErrorCode.NONE, result
            out[result.resource_name] = {
                c.name: c.value for c in result.configs if c.config_source == DYNAMIC_TOPIC_CONFIG
            }
        return out

    def check_catalogue(self) -> None:
        """After a restart: the same cluster id (meta.properties), and every topic with its
        id, partitions and config overrides (T1)."""
        answer = self.metadata()
        assert answer.cluster_id == self.cluster_id, (
            f"cluster id was {self.cluster_id}, now {answer.cluster_id}"
        )
        # The coordinators' own topics are listed (is_internal) once they hold a record,
        # as Kafka lists them; the model keeps the clients' topics.
        internal = {t.name for t in answer.topics if t.is_internal}
        assert internal <= INTERNAL_TOPICS, f"listed as internal: {internal}"
        got = {t.name: (t.topic_id, len(t.partitions)) for t in answer.topics if not t.is_internal}
        want = {name: (self.topic_ids[name], len(ps)) for name, ps in self.model.topics.items()}
        assert got == want, f"topics (id, partitions): expected {want}, got {got}"
        names = sorted(self.model.topics)
        configs = self.topic_configs(names)
        want_configs = {name: self.model.configs[name] for name in names}
        assert configs == want_configs, f"topic configs: expected {want_configs}, got {configs}"

    def check_log(self, topic: str, index: int) -> None:
        """The whole partition, read back: the model's batches, each one byte for byte the
        batch that was sent (but for the base offset and partition leader epoch the broker
        assigns), with a valid CRC."""
        self.settle()
        part = self.model.topics[topic][index]
        views = []
        offset = part.log_start_offset
        while offset < part.high_watermark:
            answer = self.fetch_at(topic, index, offset)
            assert answer.error_code == ErrorCode.NONE, (topic, index, offset, answer)
            assert answer.high_watermark == part.high_watermark, (topic, index, answer)
            got = list(iter_batches(bytearray(bytes(answer.records or b""))))
            assert got, f"{topic}[{index}]: nothing fetched at {offset} < {part.high_watermark}"
            views += got
            offset = got[-1].last_offset + 1
        got_shape = [
            (v.base_offset, tuple(bytes(r.value or b"") for r in v.records())) for v in views
        ]
        want_shape = [(b.base_offset, b.values) for b in part.batches]
        assert got_shape == want_shape, (
            f"{topic}[{index}] read back: expected {want_shape}, got {got_shape}"
        )
        for view, batch in zip(views, part.batches, strict=True):
            sent = self.raw[(topic, index, batch.base_offset)]
            stored = bytes(view.buf)
            assert view.crc_is_valid(), f"{topic}[{index}]@{batch.base_offset}: bad CRC"
            assert (stored[8:12], stored[16:]) == (sent[8:12], sent[16:]), (
                f"{topic}[{index}]@{batch.base_offset}: the stored batch differs from the one "
                f"sent:\n  sent   {sent.hex()}\n  stored {stored.hex()}"
            )

    def forget_lost_batches(self) -> None:
        """Drop the sent bytes of batches a crash or cut took (their offsets are reused)."""
        for topic, index, base in list(self.raw):
            part = self.model.partition(topic, index)
            if part is None or base >= part.high_watermark:
                del self.raw[(topic, index, base)]

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
        self.settle()
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
        self.forget_lost_batches()
        self.check_catalogue()
        for group in GROUPS:
            self.check_committed(group)


#: acks=0/1 data is fsynced only when something else syncs its log (an acks=all batch, a
#: clean shutdown), so that a cut can take a whole acks=1 tail.
LAZY_FLUSH = "log.flush.interval.messages = 1000000000\n"
#: segment.bytes of topics made with configs: 200 rolls a segment every two or three
#: batches, so that cuts land around segment creation.
SEGMENT_BYTES = ("200", "1000", "1048576")
#: A cut: faultfs mode for un-synced data, its seed, the chance that un-synced directory
#: entries survive anyway.
CUTS = st.tuples(st.sampled_from(MODES), st.integers(0, 2**16), st.sampled_from([0.0, 0.0, 0.5]))


class PowerCutBrokerMachine(CrashingBrokerMachine):
    """The crashing machine with the data directory on a fault filesystem (a mount per
    example), plus power cuts (L7).

    The broker must be a process: a cut needs every file of the mount closed, and only
    kill -9 closes them without the broker flushing or writing anything first. An
    in-process broker could only be abandoned, its thread still running (and maybe
    syncing) and its descriptors open on a mount the cut aborts.
    """

    def make_data_dir(self) -> Path:
        ok, why = fuse_available()
        assert ok, f"FUSE unavailable: {why}"
        self.root = Path(tempfile.mkdtemp(prefix="broker-powercut-"))
        self.lazy_flush = True
        (self.root / "backing").mkdir()
        self.fs = FaultFS(self.root / "backing", self.root / "mnt", self.root / "state")
        try:
            self.fs.mount()
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        return self.root / "mnt" / "data"  # the broker makes it (and syncs the mount root)

    def start(self) -> ProcessBroker | BrokerThread:
        extra = LAZY_FLUSH if self.lazy_flush else ""
        return ProcessBroker(self.data_dir, self.processing_model, self.root, extra)

    def remove_files(self) -> None:
        server = getattr(self, "server", None)
        try:
            if isinstance(server, ProcessBroker):
                server.kill()  # no-op if it stopped; a failed stop must not hold the mount
            self.fs.unmount()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def topic_config(segment_bytes: str, retention: bool) -> dict[str, str]:
        return {"segment.bytes": segment_bytes} | ({"retention.ms": "-1"} if retention else {})

    @rule(
        name=st.sampled_from(TOPICS),
        partitions=st.integers(1, 2),
        segment_bytes=st.sampled_from(SEGMENT_BYTES),
        retention=st.booleans(),
    )
    def create_topic_with_configs(
        self, name: str, partitions: int, segment_bytes: str, retention: bool
    ) -> None:
        self.check_create(name, partitions, self.topic_config(segment_bytes, retention))

    @rule()
    def burst(self) -> None:
        """acks=1, 0, 1 to one partition: an un-synced tail for a cut to take (with lazy
        flush). No arguments and first by name: Hypothesis's first example is this rule
        again and again, which is cheap, rather than kill -9 again and again."""
        parts = [(t, i) for t, ps in sorted(self.model.topics.items()) for i in range(len(ps))]
        topic, index = parts[self.serial % len(parts)]
        for acks in (1, 0, 1):
            self.check_produce(topic, index, self.values(2), acks, Compression.NONE)

    @rule(
        topic=st.sampled_from(TOPICS),
        index=st.integers(0, 1),
        acks=st.lists(st.sampled_from([0, 1, 1, -1]), min_size=2, max_size=6),
        codec=st.sampled_from(Compression),
    )
    def produce_burst(self, topic: str, index: int, acks: list[int], codec: Compression) -> None:
        """Several batches in a row to one partition, each with its own acks."""
        if self.model.partition(topic, index) is None:
            acks = [1 if a == 0 else a for a in acks]  # L6, as in produce
        for a in acks:
            self.check_produce(topic, index, self.values(3), a, codec)

    @rule(cut=CUTS, lazy_flush=st.booleans())
    def power_cut(self, cut: tuple[str, int, float], lazy_flush: bool) -> None:
        """kill -9 with every request answered, cut the power, start again (L7)."""
        self.cut_power(cut, lazy_flush, None)

    @rule(
        cut=CUTS,
        lazy_flush=st.booleans(),
        data=st.data(),
        kind=st.sampled_from(["produce", "produce", "commit", "create"]),
        delay=st.sampled_from([0.0, 0.0005, 0.002, 0.01]),
    )
    def power_cut_in_flight(
        self,
        cut: tuple[str, int, float],
        lazy_flush: bool,
        data: st.DataObject,
        kind: str,
        delay: float,
    ) -> None:
        """The same with one request sent but never answered, the kill ``delay`` s later."""
        resolve = self.send_unanswered(data, kind)
        time.sleep(delay)
        self.cut_power(cut, lazy_flush, resolve)

    def send_unanswered(self, data: st.DataObject, kind: str) -> Callable[[], None]:
        """Send one request whose answer is never read (a produce if ``kind`` is "create"
        but every topic exists); return what, after the cut and restart, adopts its effect
        into the model if the broker shows it (L7)."""
        parts = [(t, i) for t, ps in sorted(self.model.topics.items()) for i in range(len(ps))]
        free = [t for t in TOPICS if t not in self.model.topics]
        if kind == "create" and free:
            name = data.draw(st.sampled_from(free), label="topic")
            partitions = data.draw(st.integers(1, 2), label="partitions")
            segment_bytes = data.draw(st.sampled_from(SEGMENT_BYTES), label="segment.bytes")
            configs = self.topic_config(segment_bytes, False)
            body = self.create_request(name, partitions, configs)
            self.client.send(m.ApiKey.CREATE_TOPICS, V_CREATE, body)
            note(f"in flight: create {name} x{partitions} {configs}")

            def created() -> None:
                found = {t.name: t for t in self.metadata().topics}
                note(f"in flight: {name} {'created' if name in found else 'not created'}")
                if name in found:
                    assert self.model.create_topic(name, partitions, configs) == ErrorCode.NONE
                    self.topic_ids[name] = found[name].topic_id

            return created
        topic, index = data.draw(st.sampled_from(parts), label="partition")
        if kind == "commit":
            group = data.draw(st.sampled_from(GROUPS), label="group")
            offset = data.draw(st.integers(0, 50), label="offset")
            Commit = m.OffsetCommitRequest
            Part = Commit.OffsetCommitRequestTopic.OffsetCommitRequestPartition
            body = Commit(
                group_id=group,
                generation_id_or_member_epoch=-1,
                member_id="",
                group_instance_id=None,
                retention_time_ms=-1,
                topics=[
                    Commit.OffsetCommitRequestTopic(
                        name=topic,
                        partitions=[
                            Part(
                                partition_index=index,
                                committed_offset=offset,
                                committed_metadata="m",
                            )
                        ],
                    )
                ],
            )
            self.client.send(m.ApiKey.OFFSET_COMMIT, V_COMMIT, body)
            note(f"in flight: commit {group} {topic}[{index}]={offset}")

            def committed() -> None:
                got = self.committed_offsets(group)[(topic, index)]
                before = self.model.fetch_committed(group, topic, index)
                note(f"in flight: {group} {topic}[{index}] committed {got} (before: {before})")
                if got != before:  # the commit took effect: the model must have accepted it
                    error = self.model.commit(group, topic, index, offset, "m")
                    assert (error, got) == (ErrorCode.NONE, offset), (
                        f"after a cut, {group} {topic}[{index}] has committed offset {got}: "
                        f"neither the one before ({before}) nor the commit in flight "
                        f"({offset}, which the model answers {error!r})"
                    )

            return committed
        values = self.values(data.draw(st.integers(1, 4), label="records"))
        acks = data.draw(st.sampled_from([1, -1]), label="acks")
        codec = data.draw(st.sampled_from(Compression), label="codec")
        batch = bytes(build_batch([(None, v) for v in values], compression=codec))
        Req = m.ProduceRequest
        part_data = Req.TopicProduceData.PartitionProduceData(index=index, records=batch)
        body = Req(
            transactional_id=None,
            acks=acks,
            timeout_ms=10_000,
            topic_data=[Req.TopicProduceData(name=topic, partition_data=[part_data])],
        )
        self.client.send(m.ApiKey.PRODUCE, V_PRODUCE, body)
        note(f"in flight: produce {topic}[{index}] x{len(values)} acks={acks} {codec.name}")

        def appended() -> None:
            end = self.list_offsets_of([(topic, index)], LATEST)[0].offset
            hw = self.model.topics[topic][index].high_watermark
            note(f"in flight: {topic}[{index}] ends at {end}, {hw} before the batch")
            if end == hw + len(values):  # the batch survived, whole (its bytes: check_log)
                answer = self.model.produce(topic, index, values, len(batch), 0)
                self.raw[(topic, index, answer.base_offset)] = batch

        return appended

    def cut_power(
        self, cut: tuple[str, int, float], lazy_flush: bool, resolve: Callable[[], None] | None
    ) -> None:
        mode, seed, dir_survival = cut
        server = self.server
        assert isinstance(server, ProcessBroker)
        server.kill()  # kill -9 and reap: the kernel closes its files, nothing is flushed
        self.client.close()
        report = self.fs.power_cut(mode=mode, seed=seed, dir_survival=dir_survival)
        note(f"{report.summary()} (dir_survival {dir_survival}); lazy flush next: {lazy_flush}")
        self.lazy_flush = lazy_flush
        self.server = self.start()
        self.client = Client(self.server.port)
        if resolve is not None:
            resolve()
        self.check_catalogue()
        self.model.restarted_after_crash()
        parts = [(t, i) for t, ps in sorted(self.model.topics.items()) for i in range(len(ps))]
        answers = self.list_offsets_of(parts, LATEST)
        for (topic, index), answer in zip(parts, answers, strict=True):
            low, high = self.model.crash_bounds(topic, index)
            note(f"power cut: {topic}[{index}] log end {answer.offset}, allowed [{low}, {high}]")
            assert answer.error_code == ErrorCode.NONE, answer
            assert low <= answer.offset <= high, (
                f"after a power cut, {topic}[{index}] ends at {answer.offset}: acks=all "
                f"batches and durable data end at {low}, everything accepted at {high}"
            )
            ends = {b.last_offset + 1 for b in self.model.topics[topic][index].batches}
            assert answer.offset in ends | {low}, f"{topic}[{index}] cut inside a batch"
            self.model.power_cut(topic, index, answer.offset)
        self.forget_lost_batches()
        for topic, index in parts:
            self.check_log(topic, index)
        for group in GROUPS:
            self.check_committed(group)


SETTINGS = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None)


class PipelinedBrokerMachine(BrokerMachine):
    processing_model = "pipelined"

    @rule(topic=st.sampled_from(TOPICS))
    def client_leaves_with_an_answer_unsent(self, topic: str) -> None:
        """A second client sends a long-poll Fetch and then a Metadata request, and goes
        once the Metadata is handled: its answer waits behind the fetch's (answers go out
        in order) when the connection closes. The memory budget
        (``queued.max.request.bytes``) counts a request's bytes from its read until it
        is handled, or until its connection closes unhandled: once this connection is
        gone, the bytes in use are back to what they were (none: the machine's own
        client has nothing in flight), never below."""
        part = self.model.partition(topic, 0)
        if part is None:
            return
        assert isinstance(self.server, BrokerThread)
        budget = self.server.broker.memory
        self.metadata()  # any acks=0 produce of the machine's client is handled by now
        assert budget.in_use == 0, f"{budget.in_use} bytes in use with nothing in flight"
        fetch = m.encode_request(
            m.ApiKey.FETCH, V_FETCH, 1, "spec",
            self.fetch_request(topic, 0, part.high_watermark, max_wait_ms=30_000, min_bytes=1),
        )  # fmt: skip
        metadata = m.encode_request(
            m.ApiKey.METADATA, V_METADATA, 2, "spec",
            m.MetadataRequest(topics=None, allow_auto_topic_creation=False),
        )  # fmt: skip
        fetch_size = len(fetch) - 4  # the budget counts a frame without its size field
        other = Client(self.server.port)
        try:
            other.sock.sendall(fetch + metadata)
            wait_until(lambda: budget.in_use == fetch_size, "the Metadata request handled")
        finally:
            other.close()
        wait_until(lambda: budget.in_use <= 0, "the closed connection's bytes released")
        assert budget.in_use == 0, f"the budget counts {budget.in_use} bytes after the close"


class SerialBrokerMachine(BrokerMachine):
    processing_model = "serial"


TestPipelinedBroker = PipelinedBrokerMachine.TestCase
TestPipelinedBroker.settings = SETTINGS
TestSerialBroker = SerialBrokerMachine.TestCase
TestSerialBroker.settings = SETTINGS


class TightMemoryBrokerMachine(BrokerMachine):
    """``queued.max.request.bytes`` of 1: every request read exhausts the broker's memory
    budget, so the connection mutes for memory pressure after each one and must be
    unmuted once the handler releases its bytes (the budget tells the connections it
    muted). A connection left muted never reads the client's next request: the machine's
    next answer times out. No other machine runs a budget small enough to mute."""

    processing_model = "pipelined"

    def start(self) -> ProcessBroker | BrokerThread:
        return BrokerThread(self.data_dir, self.processing_model, queued_max_request_bytes=1)


TestTightMemoryBroker = TightMemoryBrokerMachine.TestCase
TestTightMemoryBroker.settings = settings(max_examples=3, stateful_step_count=STEPS, deadline=None)


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


class PipelinedPowerCutMachine(PowerCutBrokerMachine):
    processing_model = "pipelined"


class SerialPowerCutMachine(PowerCutBrokerMachine):
    processing_model = "serial"


# A mount and a subprocess broker per example, and a restart per cut: few examples in CI
# (10 took 275 s of the 300 s timeout on a busy machine; each run draws new examples from
# its seed, so runs add up), and no shrinking there: a shrink step costs seconds, so shrinking a failure would run into
# the 300 s timeout and hide it. A failure reports its first example, with every note.
POWER_CUT_SETTINGS = settings(
    max_examples=50 if THOROUGH else 5, stateful_step_count=STEPS if THOROUGH else 20,
    deadline=None,
    phases=[p for p in Phase if p is not Phase.explain] if THOROUGH  # as conftest.PHASES
    else [Phase.explicit, Phase.reuse, Phase.generate],
)  # fmt: skip


@pytest.mark.parametrize(
    "machine", [PipelinedPowerCutMachine, SerialPowerCutMachine], ids=["pipelined", "serial"]
)
def test_power_cut_broker(machine: type[PowerCutBrokerMachine]) -> None:
    ok, why = fuse_available()
    if not ok:  # in the test itself, so that it counts as failed, not as an error
        pytest.fail(f"FUSE unavailable: {why}", pytrace=False)
    run_state_machine_as_test(machine, settings=POWER_CUT_SETTINGS)
