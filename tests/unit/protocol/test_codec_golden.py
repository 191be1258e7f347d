"""Golden bytes from real clients: confluent-kafka (librdkafka), kafka-python, aiokafka.

Two layers:

* ``tests/golden/*.bin`` were captured by ``tools/capture_golden.py`` (run it to
  regenerate). Each must decode to the expected header and fields, and
  re-encoding the decoded request must give back the very same bytes.
* Live tests start a fake broker on 127.0.0.1 (plain sockets, ephemeral port),
  point each client at it and decode what arrives: the first ApiVersions
  request with a silent broker, and, with a broker that answers through our
  codec, the Metadata and Produce requests that follow.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import crc32c
import pytest

from trio_broker.protocol import messages
from trio_broker.protocol.schema import REQUESTS

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "golden"


def _load_tool() -> ModuleType:
    path = ROOT / "tools" / "capture_golden.py"
    name = "_trio_broker_capture_golden"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


cg = _load_tool()

#: What each client is expected to send first (KAFKA-FACTS.md), and its software name.
FIRST_API_VERSIONS = {
    "confluent-kafka": (3, "confluent-kafka-python"),
    "kafka-python": (4, "kafka-python"),
    "aiokafka": (0, None),  # v0 has no ClientSoftwareName
}
#: The golden files, by client: (api, version) of the first request per API.
EXPECTED_FILES = {
    "confluent-kafka": {"apiversions": 3, "metadata": 13, "produce": 10},
    "kafka-python": {"apiversions": 4, "metadata": 13, "produce": 9},
    "aiokafka": {"apiversions": 0, "metadata": 5, "produce": 7},
}
API_BY_NAME = {name.lower(): key for key, name in messages.API_NAMES.items()}


def golden_files() -> list[Path]:
    return sorted(GOLDEN.glob("*.bin"))


def split_name(path: Path) -> tuple[str, str, int]:
    stem = path.stem
    client = next(c for c in cg.CLIENTS if stem.startswith(c + "-"))
    api, version = stem[len(client) + 1 :].rsplit("-v", 1)
    return client, api, int(version)


def reencode(wire: bytes) -> bytes:
    header, body = messages.decode_request(wire[4:])
    return messages.encode_request(
        header.api_key, header.api_version, header.correlation_id, header.client_id, body
    )


def check_record_batch(records: Any) -> None:
    """A magic-2 batch with one uncompressed record: key/value as produced, CRC valid.

    Checked on raw bytes (layout in KAFKA-FACTS.md) so this test stays
    independent of the record-batch module.
    """
    raw = bytes(records)
    base_offset, batch_length, _epoch, magic, crc = struct.unpack_from(">qiibI", raw, 0)
    assert base_offset == 0
    assert batch_length == len(raw) - 12
    assert magic == 2
    assert crc == crc32c.crc32c(raw[21:])
    attributes, _delta, first_ts = struct.unpack_from(">hiq", raw, 21)
    assert attributes & 0x7 == 0  # not compressed
    assert first_ts == cg.TIMESTAMP_MS
    assert struct.unpack_from(">i", raw, 57)[0] == 1  # record count
    assert b"golden-key" in raw and b"golden-value" in raw


def check_request(client: str, wire: bytes) -> tuple[messages.RequestHeader, Any]:
    """Decode a captured frame and check what every client must have put in it."""
    assert struct.unpack(">i", wire[:4])[0] == len(wire) - 4
    header, decoded = messages.decode_request(wire[4:])
    body: Any = decoded
    assert header.client_id == cg.CLIENT_IDS[client]
    if header.api_key == messages.ApiKey.API_VERSIONS:
        version, software = FIRST_API_VERSIONS[client]
        assert header.api_version == version
        if software is None:
            assert body.client_software_name == ""  # absent in v0: the default
        else:
            assert body.client_software_name == software
            assert body.client_software_version  # e.g. "2.16.1-rdkafka-2.16.0", "3.0.12"
    elif header.api_key == messages.ApiKey.METADATA:
        assert body.topics is None or all(t.name in (cg.TOPIC, None) for t in body.topics)
    elif header.api_key == messages.ApiKey.PRODUCE:
        assert body.acks in (-1, 1)
        assert body.transactional_id is None
        [topic] = body.topic_data
        assert topic.name == cg.TOPIC
        [partition] = topic.partition_data
        assert partition.index == 0
        assert isinstance(partition.records, memoryview)  # zero-copy view of the frame
        check_record_batch(partition.records)
    return header, body


# --------------------------------------------------------------------------- golden files


def test_golden_files_are_all_there() -> None:
    names = {p.stem for p in golden_files()}
    expected = {
        f"{client}-{api}-v{version}"
        for client, apis in EXPECTED_FILES.items()
        for api, version in apis.items()
    }
    assert names == expected


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: p.stem)
def test_golden_frame_decodes(path: Path) -> None:
    client, api, version = split_name(path)
    wire = path.read_bytes()
    header, _ = check_request(client, wire)
    assert header.api_key == API_BY_NAME[api]
    assert header.api_version == version
    schema = REQUESTS[header.api_key]
    assert schema.min_version <= version <= schema.max_version


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: p.stem)
def test_golden_frame_reencodes_to_the_same_bytes(path: Path) -> None:
    wire = path.read_bytes()
    assert reencode(wire) == wire


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: p.stem)
def test_golden_frame_is_a_fuzz_seed(path: Path) -> None:
    seed = ROOT / "fuzz" / "corpus" / f"golden-{path.stem}"
    assert seed.read_bytes() == path.read_bytes()[4:]


def test_confluent_api_versions_v3_exact_bytes() -> None:
    wire = (GOLDEN / "confluent-kafka-apiversions-v3.bin").read_bytes()
    client_id = cg.CLIENT_IDS["confluent-kafka"].encode()
    # Header v2: key, version, correlation id, int16-length client id, no tags.
    head = struct.pack(">hhih", 18, 3, 1, len(client_id)) + client_id + b"\x00"
    assert wire[4 : 4 + len(head)] == head
    # Body: two compact strings, then no tags.
    body = wire[4 + len(head) :]
    assert body[0] == len("confluent-kafka-python") + 1
    assert body[1:23] == b"confluent-kafka-python"
    assert body[-1] == 0


# --------------------------------------------------------------------------- live clients


@pytest.fixture
def silent_broker() -> Iterator[Any]:
    """Accepts connections and records request frames; never answers."""
    with cg.FakeBroker(answer=False) as broker:
        yield broker


@pytest.fixture
def answering_broker() -> Iterator[Any]:
    """Answers ApiVersions, Metadata, InitProducerId and Produce with our codec."""
    with cg.FakeBroker(answer=True) as broker:
        yield broker
        assert not broker.errors, broker.errors


CLIENT_MODULES = {
    "confluent-kafka": "confluent_kafka",
    "kafka-python": "kafka",
    "aiokafka": "aiokafka",
}


@pytest.mark.parametrize("client", cg.CLIENTS)
def test_live_first_request_is_api_versions(client: str, silent_broker: Any) -> None:
    pytest.importorskip(CLIENT_MODULES[client])
    with cg.client_process(client, silent_broker.bootstrap, produce=False):
        assert silent_broker.wait_for(bool, 20), f"{client} sent nothing"
    first = silent_broker.frames[0]
    header, _ = check_request(client, first.wire)
    assert header.api_key == 18
    assert header.correlation_id >= 0
    assert reencode(first.wire) == first.wire


@pytest.mark.parametrize("client", cg.CLIENTS)
def test_live_producer_session(client: str, answering_broker: Any) -> None:
    pytest.importorskip(CLIENT_MODULES[client])
    with cg.client_process(client, answering_broker.bootstrap, produce=True) as proc:
        done = answering_broker.wait_for(
            lambda frames: any(f.api_key == messages.ApiKey.PRODUCE for f in frames), 30
        )
        assert done, f"{client} never produced: {answering_broker.frames}"
        proc.wait(15)
        assert proc.returncode == 0, proc.stderr.read().decode(errors="replace")[-2000:]
    frames = answering_broker.frames
    assert frames[0].api_key == messages.ApiKey.API_VERSIONS
    versions = {messages.API_NAMES[f.api_key].lower(): f.api_version for f in frames}
    expected = EXPECTED_FILES[client]
    assert {api: versions.get(api) for api in expected} == expected
    if client == "confluent-kafka":
        assert versions["metadata"] in (12, 13)
    for frame in frames:
        check_request(client, frame.wire)
        assert reencode(frame.wire) == frame.wire
