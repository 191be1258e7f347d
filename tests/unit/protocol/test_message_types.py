"""trio_broker/protocol/message_types.py: the classes mypy sees are the runtime's, truthfully.

* The checked-in module is exactly what tools/gen_message_types.py writes from the
  schema table (so it cannot drift when the table grows).
* Every declared name, nested ones included, is at run time the class schema.py
  built, and declares exactly that class's fields.
* The declared field types are true: messages the codec decodes (every message,
  every version; defaults and random ones) hold values of the declared types.
* Every registered handler is annotated with its API's request class and answers
  with its response class (or the effects of ``base.Response``).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
import typing
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_broker.handlers import load_handlers
from trio_broker.handlers.base import HANDLERS
from trio_broker.protocol import message_types, messages
from trio_broker.protocol.codec import RecordsChunks, decode_body, encode_body
from trio_broker.protocol.schema import REQUESTS, RESPONSES, SCHEMAS, Message, MessageSchema

ROOT = Path(__file__).resolve().parents[3]
MODULE_PATH = ROOT / "trio_broker" / "protocol" / "message_types.py"


def _load(name: str, path: Path) -> ModuleType:
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) == str(path):
            return module
    spec = importlib.util.spec_from_file_location(f"_trio_broker_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ the declarations


Check = Callable[[Any], bool]


def _declared_classes() -> dict[str, tuple[type[Message], dict[str, ast.expr]]]:
    """Kafka name ("ProduceRequest.TopicProduceData") -> (runtime class, {attr: annotation})."""
    tree = ast.parse(MODULE_PATH.read_text())
    guarded = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    out: dict[str, tuple[type[Message], dict[str, ast.expr]]] = {}

    def walk(node: ast.ClassDef, path: str, runtime: Any) -> None:
        fields = {
            stmt.target.id: stmt.annotation
            for stmt in node.body
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
        }
        out[path] = (runtime, fields)
        for stmt in node.body:
            if isinstance(stmt, ast.ClassDef):
                walk(stmt, f"{path}.{stmt.name}", getattr(runtime, stmt.name))

    for node in guarded.body:
        if isinstance(node, ast.ClassDef):
            walk(node, node.name, getattr(message_types, node.name))
    return out


DECLARED = _declared_classes()
_SIMPLE = {"int": int, "str": str, "bytes": bytes, "bool": bool, "float": float}
_RECORD_BYTES = (bytes, bytearray, memoryview)


def _checker(annotation: ast.expr, owner: type[Message]) -> Check:
    """isinstance-style check for an annotation of the generated module."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        left, right = _checker(annotation.left, owner), _checker(annotation.right, owner)
        return lambda value: left(value) or right(value)
    if isinstance(annotation, ast.Subscript):
        assert ast.unparse(annotation.value) == "list", ast.unparse(annotation)
        item = _checker(annotation.slice, owner)
        return lambda value: isinstance(value, list) and all(item(v) for v in value)
    if isinstance(annotation, ast.Constant) and annotation.value is None:
        return lambda value: value is None
    text = ast.unparse(annotation)
    if text == "uuid.UUID":
        return lambda value: isinstance(value, uuid.UUID)
    if text == "RecordBytes":
        return lambda value: isinstance(value, _RECORD_BYTES)
    if text == "Records":
        return lambda value: isinstance(value, (*_RECORD_BYTES, RecordsChunks))
    if text in _SIMPLE:
        kind = _SIMPLE[text]
        if kind is int:  # bool is an int subclass; an int field never holds one
            return lambda value: isinstance(value, int) and not isinstance(value, bool)
        return lambda value: isinstance(value, kind)
    nested = getattr(owner, text)  # a nested struct, in scope in its owner's body
    assert isinstance(nested, type) and issubclass(nested, Message), text
    return lambda value: type(value) is nested


CHECKS: dict[type[Message], dict[str, Check]] = {
    runtime: {attr: _checker(annotation, runtime) for attr, annotation in fields.items()}
    for runtime, fields in DECLARED.values()
}


def _conforms(message: Message, where: str = "") -> None:
    checks = CHECKS[type(message)]
    for f in message._fields:
        value = getattr(message, f.attr)
        assert checks[f.attr](value), f"{where}{type(message).kafka_name}.{f.attr} = {value!r}"
        items = value if f.is_array and value is not None else [value]
        for item in items:
            if isinstance(item, Message):
                _conforms(item, where)


# ------------------------------------------------------------------ the tests


def test_the_module_is_what_the_generator_writes() -> None:
    generator = _load("gen_message_types", ROOT / "tools" / "gen_message_types.py")
    assert MODULE_PATH.read_text() == generator.render(SCHEMAS), (
        f"trio_broker/protocol/message_types.py is out of date: run {generator.COMMAND}"
    )


def test_every_declared_class_is_the_schema_class() -> None:
    assert sorted(message_types.__all__) == sorted(SCHEMAS)
    for name, schema in SCHEMAS.items():
        assert getattr(message_types, name) is schema.cls
        assert getattr(messages, name) is schema.cls  # as handlers reach them: m.ProduceRequest
    expected: dict[str, type[Message]] = {}

    def collect(cls: type[Message]) -> None:
        expected[cls.kafka_name] = cls
        for f in cls._fields:
            if f.struct_class is not None:
                collect(f.struct_class)

    for schema in SCHEMAS.values():
        collect(schema.cls)
    assert sorted(DECLARED) == sorted(expected)
    for kafka_name, (runtime, fields) in DECLARED.items():
        # The nested class reached by attribute is the one the codec builds and decodes.
        assert runtime is expected[kafka_name], kafka_name
        assert list(fields) == [f.attr for f in runtime._fields], kafka_name


def _cases(schemas: dict[int, MessageSchema]) -> list[tuple[str, int]]:
    return [(s.name, v) for s in schemas.values() for v in range(s.min_version, s.max_version + 1)]


CASES = _cases(REQUESTS) + _cases(RESPONSES)


def _roundtrip(schema: MessageSchema, version: int, message: Message) -> Message:
    wire = b"".join(bytes(p) for p in encode_body(schema, version, message))
    return decode_body(schema, version, memoryview(wire))


def test_decoded_defaults_have_the_declared_types() -> None:
    for name, version in CASES:
        schema = SCHEMAS[name]
        _conforms(schema.cls(), "built ")
        _conforms(_roundtrip(schema, version, schema.cls()), f"v{version} ")


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), case=st.sampled_from(CASES))
def test_decoded_messages_have_the_declared_types(
    data: st.DataObject, case: tuple[str, int]
) -> None:
    strategies = _load("test_codec_roundtrip", Path(__file__).with_name("test_codec_roundtrip.py"))
    name, version = case
    schema = SCHEMAS[name]
    message = data.draw(strategies.message_strategy(schema, version))
    message = strategies.expected_roundtrip(message, version)  # absent fields at defaults
    _conforms(message, "built ")
    _conforms(_roundtrip(schema, version, message), f"v{version} ")


def _union_members(hint: Any) -> set[Any]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return set(typing.get_args(hint))
    return {hint}


def test_handlers_take_their_request_class_and_answer_their_response_class() -> None:
    load_handlers()
    assert HANDLERS
    for api_key, spec in HANDLERS.items():
        hints = typing.get_type_hints(spec.fn)
        request = _union_members(hints["request"]) - {type(None)}
        assert request == {REQUESTS[api_key].cls}, spec.fn.__qualname__
        answers = _union_members(hints["return"])
        assert RESPONSES[api_key].cls in answers or Message in answers, spec.fn.__qualname__


def test_records_are_typed_by_direction() -> None:
    """Requests carry bytes-likes (decoded: memoryviews); responses may carry file regions."""
    request = DECLARED["ProduceRequest.TopicProduceData.PartitionProduceData"][1]["records"]
    response = DECLARED["FetchResponse.FetchableTopicResponse.PartitionData"][1]["records"]
    assert ast.unparse(request) == "RecordBytes | None"
    assert ast.unparse(response) == "Records | None"
