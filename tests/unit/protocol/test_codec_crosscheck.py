"""Cross-check our codec against kafka-python's independent implementation.

kafka-python 3.x builds its own message classes from the same Kafka JSON
schemas (``kafka.protocol.*``: ``Cls[version](**fields).encode()`` and
``Cls.decode(data, version=v)``) with an unrelated code generator. For every API
both implement and every version in our range, random messages must

* encode to the *same bytes* in both implementations,
* decode in kafka-python (from our bytes) to the values we encoded, and
* decode in our codec (from kafka-python's bytes) to the values it encoded,

and whole frames with request/response headers must agree too.

kafka-python's conventions differ in three places, normalised below: it reads
an all-zero UUID as None, it gives tagged struct fields a default of None
(Kafka's Java classes and we use a struct with default fields), and it patches
``*AuthorizedOperations`` int32 fields into sets of bit numbers ("bitfield").
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_broker.protocol import messages
from trio_broker.protocol.codec import decode_body
from trio_broker.protocol.schema import REQUESTS, RESPONSES, Field, Message, MessageSchema


def _sibling(name: str) -> ModuleType:
    """The strategies live in test_codec_roundtrip.py; load it whatever pytest's import mode."""
    path = str(Path(__file__).with_name(f"{name}.py"))
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) == path:
            return module
    spec = importlib.util.spec_from_file_location(f"_trio_broker_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


rt = _sibling("test_codec_roundtrip")

ZERO_UUID = uuid.UUID(int=0)
BITFIELD_NULL = -(2**31)  # Kafka's "not requested" marker; kafka-python's None


def _import_kafka_python() -> tuple[Any, Any]:
    """kafka-python's message base class and bitfield codec.

    Importing its protocol modules registers every ApiMessage subclass; they
    load their JSON with a deprecated importlib.resources call, hence the filter.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import kafka.protocol.admin
        import kafka.protocol.consumer
        import kafka.protocol.metadata
        import kafka.protocol.producer
        import kafka.protocol.sasl  # noqa: F401
        from kafka.protocol.api_message import ApiMessage
        from kafka.protocol.schemas.fields.codecs.types import BitField
    return ApiMessage, BitField


ApiMessage, BitField = _import_kafka_python()


def _kafka_python_classes() -> dict[tuple[int, str], Any]:
    out: dict[tuple[int, str], Any] = {}
    todo = list(ApiMessage.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if getattr(cls, "_class_version", None) is None and getattr(cls, "_json", None):
            out[(cls.API_KEY, cls.type)] = cls
    return out


KP = _kafka_python_classes()

#: The APIs the issue names; they must all be cross-checked (request and response).
REQUIRED = {
    "ApiVersions", "Metadata", "Produce", "Fetch", "ListOffsets", "FindCoordinator",
    "JoinGroup", "SyncGroup", "OffsetCommit", "OffsetFetch", "CreateTopics", "InitProducerId",
}  # fmt: skip

#: APIs kafka-python cannot check, with the reason. Empty today: kafka-python
#: 3.0.12 implements every API in our schema table but the KIP-848 pair and the KIP-932
#: eleven, whose layouts come from Kafka's JSON directly (tools/message_json); the roundtrip
#: tests cover them.
SKIPPED: dict[str, str] = {
    "ConsumerGroupHeartbeat": "not in kafka-python 3.0.12",
    "ConsumerGroupDescribe": "not in kafka-python 3.0.12",
    "ShareGroupHeartbeat": "not in kafka-python 3.0.12",
    "ShareGroupDescribe": "not in kafka-python 3.0.12",
    "ShareFetch": "not in kafka-python 3.0.12",
    "ShareAcknowledge": "not in kafka-python 3.0.12",
    "DescribeShareGroupOffsets": "not in kafka-python 3.0.12",
    "AlterShareGroupOffsets": "not in kafka-python 3.0.12",
    "DeleteShareGroupOffsets": "not in kafka-python 3.0.12",
    "InitializeShareGroupState": "not in kafka-python 3.0.12",
    "ReadShareGroupState": "not in kafka-python 3.0.12",
    "WriteShareGroupState": "not in kafka-python 3.0.12",
    "DeleteShareGroupState": "not in kafka-python 3.0.12",
}


def _cases() -> list[Any]:
    cases = []
    for table in (REQUESTS, RESPONSES):
        for key, schema in sorted(table.items()):
            api = messages.API_NAMES[key]
            kcls = KP.get((key, schema.kind))
            for version in range(schema.min_version, schema.max_version + 1):
                marks = []
                if api in SKIPPED or kcls is None:
                    marks.append(pytest.mark.skip(reason=SKIPPED.get(api, "not in kafka-python")))
                elif version > kcls.max_version:
                    marks.append(pytest.mark.skip(reason="newer than kafka-python's schema"))
                cases.append(
                    pytest.param(schema.name, version, marks=marks, id=f"{schema.name}-v{version}")
                )
    return cases


CASES = _cases()


def test_required_apis_are_cross_checked() -> None:
    checked = {
        messages.API_NAMES[s.api_key]
        for s in REQUESTS.values()
        if (s.api_key, "request") in KP and messages.API_NAMES[s.api_key] not in SKIPPED
    }
    assert checked >= REQUIRED
    for key, schema in REQUESTS.items():
        if messages.API_NAMES[key] in SKIPPED:
            continue
        kcls = KP[(key, "request")]
        assert kcls.max_version == schema.max_version, schema.name
        assert kcls.flexible_version_q(schema.max_version) == schema.is_flexible(schema.max_version)


# --------------------------------------------------------------------------- value mapping


def _is_bitfield(kf: Any) -> bool:
    return kf._json.get("type") == "bitfield"


def _kp_fields(kf_struct: Any, fields: tuple[Field, ...]) -> list[tuple[Field, Any]]:
    """Pair our fields with kafka-python's (same JSON, same order).

    ``.fields`` (not ``._fields``): for an array of structs, only the element
    struct's field objects carry kafka-python's data classes.
    """
    kfields = list(kf_struct.fields.values())
    assert len(kfields) == len(fields)
    pairs = list(zip(fields, kfields))
    for f, kf in pairs:
        assert kf._name == f.name or _is_bitfield(kf), (f.name, kf._name)
    return pairs


def _to_kp_scalar(value: Any, f: Field, kf: Any, version: int) -> Any:
    if value is None:
        return None
    if f.fields is not None:
        if f.tag >= 0 and value == f.default_value():
            return None  # kafka-python's default for tagged structs
        return kf.data_class(**_to_kp_kwargs(value, kf.data_class._struct, f.fields, version))
    if f.type == "uuid":
        return None if value == ZERO_UUID else value
    if _is_bitfield(kf):
        bits = BitField.from_32_bit_field(value & 0xFFFFFFFF)
        return None if bits == {31} else bits
    if f.type in ("bytes", "records"):
        return bytes(value)
    return value


def _to_kp(value: Any, f: Field, kf: Any, version: int) -> Any:
    if f.is_array and value is not None:
        inner = kf.array_of if hasattr(kf, "array_of") else kf
        return [_to_kp_scalar(v, f, inner, version) for v in value]
    return _to_kp_scalar(value, f, kf, version)


def _to_kp_kwargs(
    msg: Message, kstruct: Any, fields: tuple[Field, ...], version: int
) -> dict[str, Any]:
    return {
        kf.name: _to_kp(getattr(msg, f.attr), f, kf, version)
        for f, kf in _kp_fields(kstruct, fields)
        if f.present_in(version)
    }


def _from_kp_scalar(value: Any, f: Field, kf: Any, version: int) -> Any:
    if f.fields is not None:
        if value is None:
            return None if f.nullable_in(version) else f.default_value()
        assert f.struct_class is not None
        return _from_kp_struct(value, f.struct_class, kf.data_class._struct, f.fields, version)
    if f.type == "uuid":
        return ZERO_UUID if value is None else value
    if _is_bitfield(kf):
        if value is None:
            return BITFIELD_NULL
        raw = BitField.to_32_bit_field(value)
        return raw - 2**32 if raw >= 2**31 else raw
    if f.type in ("bytes", "records") and value is not None:
        return bytes(value)
    return value


def _from_kp(value: Any, f: Field, kf: Any, version: int) -> Any:
    if f.is_array and value is not None:
        inner = kf.array_of if hasattr(kf, "array_of") else kf
        return [_from_kp_scalar(v, f, inner, version) for v in value]
    return _from_kp_scalar(value, f, kf, version)


def _from_kp_struct(
    obj: Any, cls: type[Message], kstruct: Any, fields: tuple[Field, ...], version: int
) -> Message:
    kwargs = {
        f.attr: _from_kp(getattr(obj, kf.name), f, kf, version)
        for f, kf in _kp_fields(kstruct, fields)
        if f.present_in(version)
    }
    return cls(**kwargs)


def to_kafka_python(schema: MessageSchema, version: int, msg: Message) -> Any:
    kcls = KP[(schema.api_key, schema.kind)]
    return kcls[version](**_to_kp_kwargs(msg, kcls._struct, schema.fields, version))


def from_kafka_python(schema: MessageSchema, version: int, obj: Any) -> Message:
    kcls = KP[(schema.api_key, schema.kind)]
    return _from_kp_struct(obj, schema.cls, kcls._struct, schema.fields, version)


def kp_decode(schema: MessageSchema, version: int, data: bytes, header: bool = False) -> Any:
    kcls = KP[(schema.api_key, schema.kind)]
    # kafka-python's ApiVersionsResponse.decode re-reads the body as v0 whenever
    # the error code is non-zero (what a broker does for UNSUPPORTED_VERSION);
    # the generic decoder checks the plain layout of every version.
    generic_decode: Any = ApiMessage.decode.__func__
    return generic_decode(kcls, data, version=version, header=header)


# --------------------------------------------------------------------------- the property

SETTINGS = settings(
    max_examples=8, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


@pytest.mark.parametrize(("name", "version"), CASES)
def test_cross_check(name: str, version: int) -> None:
    schema = next(s for s in (*REQUESTS.values(), *RESPONSES.values()) if s.name == name)

    @SETTINGS
    @given(msg=rt.message_strategy(schema, version), corr=st.integers(-(2**31), 2**31 - 1))
    def check(msg: Message, corr: int) -> None:
        expected = rt.expected_roundtrip(msg, version)
        ours = rt.body_bytes(schema, version, msg)

        # Our bytes, read by kafka-python.
        assert from_kafka_python(schema, version, kp_decode(schema, version, ours)) == expected

        # kafka-python's bytes, read by us: the same bytes, the same values.
        kobj = to_kafka_python(schema, version, msg)
        theirs = bytes(kobj.encode())
        assert theirs == ours
        assert decode_body(schema, version, memoryview(theirs)) == expected

        # Whole frames, headers included.
        if schema.kind == "request":
            kobj.with_header(correlation_id=corr, client_id="xcheck")
            header, decoded = messages.decode_request(
                bytes(kobj.encode(header=True, framed=True))[4:]
            )
            assert header == messages.RequestHeader(schema.api_key, version, corr, "xcheck")
            assert decoded == expected
            frame = messages.encode_request(schema.api_key, version, corr, "ours", msg)
            kdecoded = kp_decode(schema, version, frame[4:], header=True)
            assert kdecoded.header.request_api_key == schema.api_key
            assert kdecoded.header.request_api_version == version
            assert kdecoded.header.correlation_id == corr
            assert kdecoded.header.client_id == "ours"
            assert from_kafka_python(schema, version, kdecoded) == expected
        else:
            parts = messages.encode_response(schema.api_key, version, corr, msg)
            frame = b"".join(bytes(p) for p in parts)
            kdecoded = kp_decode(schema, version, frame[4:], header=True)
            assert kdecoded.header.correlation_id == corr
            assert from_kafka_python(schema, version, kdecoded) == expected
            kobj.with_header(correlation_id=corr)
            kframe = bytes(kobj.encode(header=True, framed=True))
            assert kframe == frame
            assert messages.decode_response(schema.api_key, version, kframe[4:]) == (corr, expected)

    check()


def test_api_versions_response_header_is_v0_in_both() -> None:
    C: Any = RESPONSES[messages.ApiKey.API_VERSIONS].cls
    msg = C(error_code=0, api_keys=[C.ApiVersion(api_key=18, max_version=4)])
    frame = b"".join(bytes(p) for p in messages.encode_response(18, 3, 7, msg))
    # Correlation id, then straight into the body: no tagged-field byte in the header.
    assert frame[4:8] == (7).to_bytes(4, "big") and frame[8:10] == b"\x00\x00"
    kcls = KP[(18, "response")]
    decoded = kcls.decode(frame[4:], version=3, header=True)
    assert decoded.header.correlation_id == 7
    assert decoded.api_keys[0].max_version == 4
