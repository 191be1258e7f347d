"""Message layouts as Python objects, built from the generated ``_schemas`` table.

``_schemas.py`` is the single source of truth (generated from Kafka's JSON
schemas by ``tools/gen_schemas.py``). This module turns it into :class:`Field`
trees and one Python class per message and per nested struct. A class carries
the union of its fields over all versions; a version's codec reads and writes
the subset that exists in that version and leaves the rest at their defaults.
"""

from __future__ import annotations

import builtins
import keyword
import re
import uuid
from typing import Any

import attrs

from trio_broker.protocol import _message_code
from trio_broker.protocol._schemas import MESSAGES, UNBOUNDED

PRIMITIVES = frozenset(
    {"bool", "int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "string",
     "bytes", "uuid", "records"}
)  # fmt: skip


def snake_case(name: str) -> str:
    """'ThrottleTimeMs' -> 'throttle_time_ms'; 'IsrNodes' -> 'isr_nodes'."""
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", s).lower()
    return s + "_" if keyword.iskeyword(s) else s


@attrs.frozen
class Field:
    """One field of a message or struct, with the versions it exists in."""

    name: str  # Kafka's CamelCase name
    attr: str  # our snake_case attribute
    type: str  # element type for arrays ("int32", "string", or a struct name)
    is_array: bool
    min_version: int
    max_version: int
    nullable_min: int
    nullable_max: int
    tag: int  # -1 unless tagged
    tagged_min: int
    tagged_max: int
    default: str | None
    fields: tuple[Field, ...] | None  # for struct types
    struct_class: builtins.type[Message] | None = attrs.field(default=None, eq=False)

    def present_in(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def nullable_in(self, version: int) -> bool:
        return self.nullable_min <= version <= self.nullable_max

    def tagged_in(self, version: int) -> bool:
        return self.tag >= 0 and self.tagged_min <= version <= self.tagged_max

    @property
    def default_is_shared(self) -> bool:
        """The default is immutable (not a list or a struct): one object serves every
        instance, so generated code can hold it as a constant."""
        return not self.is_array and self.fields is None

    def default_value(self) -> Any:
        """A fresh default (Kafka's rules: arrays empty, strings empty, numbers 0)."""
        d = self.default
        if self.is_array:
            return None if d == "null" else []
        if self.fields is not None:
            assert self.struct_class is not None
            # A nullable struct whose default is null (DescribeTopicPartitions' Cursor)
            # is absent unless set.
            return None if d == "null" else self.struct_class()
        t = self.type
        if d == "null":
            return None
        if t == "bool":
            return d == "true"
        if t in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
            return int(d, 0) if d else 0
        if t == "float64":
            return float(d) if d else 0.0
        if t == "string":
            return d if d is not None else ""
        if t == "uuid":
            return uuid.UUID(int=0)
        if t == "bytes":
            return b""
        return None  # records


class Message:
    """Base of every generated message/struct class.

    Subclasses get ``__slots__`` and an ``__init__`` with keyword defaults
    generated from the schema; equality compares every field.
    """

    __slots__ = ()
    _fields: tuple[Field, ...] = ()
    #: Kafka's name, e.g. "ProduceRequest" or "ProduceRequest.TopicProduceData".
    kafka_name: str = ""

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f.attr) == getattr(other, f.attr) for f in self._fields)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        inner = ", ".join(f"{f.attr}={getattr(self, f.attr)!r}" for f in self._fields)
        return f"{type(self).__name__}({inner})"

    def to_dict(self) -> dict[str, Any]:
        """Plain data (nested dicts and lists), handy for tests and logs."""

        def plain(value: Any) -> Any:
            if isinstance(value, Message):
                return value.to_dict()
            if isinstance(value, list):
                return [plain(v) for v in value]
            if isinstance(value, memoryview):
                return bytes(value)
            return value

        return {f.attr: plain(getattr(self, f.attr)) for f in self._fields}


def _build_fields(raw_fields: tuple[Any, ...], owner: str) -> tuple[Field, ...]:
    fields = []
    #: Two fields of one struct type (a common struct, e.g. ConsumerGroupDescribe's
    #: Assignment and TargetAssignment) share one class, the one ``owner.elem`` names.
    made: dict[str, type[Message]] = {}
    for name, ftype, vmin, vmax, nmin, nmax, tag, tmin, tmax, default, sub in raw_fields:
        is_array = ftype.startswith("[]")
        elem = ftype[2:] if is_array else ftype
        sub_fields = _build_fields(sub, f"{owner}.{elem}") if sub else None
        field = Field(
            name=name, attr=snake_case(name), type=elem, is_array=is_array,
            min_version=vmin, max_version=vmax, nullable_min=nmin, nullable_max=nmax,
            tag=tag, tagged_min=tmin, tagged_max=tmax, default=default, fields=sub_fields,
        )  # fmt: skip
        if sub_fields is not None:
            if elem not in made:
                made[elem] = _make_class(f"{owner}.{elem}", sub_fields)
            elif made[elem]._fields != sub_fields:
                raise ValueError(f"{owner}.{name}: two different structs named {elem}")
            # Its fields too: their nested classes are the shared class's.
            field = attrs.evolve(field, struct_class=made[elem], fields=made[elem]._fields)
        elif elem not in PRIMITIVES:
            raise ValueError(f"{owner}.{name}: unknown type {ftype!r}")
        fields.append(field)
    return tuple(fields)


def code_prefix(kafka_name: str) -> str:
    """The prefix of a class's generated names: 'ProduceRequest.TopicProduceData' ->
    'ProduceRequest__TopicProduceData' (unique: a class's name is its path)."""
    return kafka_name.replace(".", "__")


def _shared_names(prefix: str, fields: tuple[Field, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The values a class's generated methods name: its immutable defaults
    (``<prefix>_d<i>``) and the struct classes of its struct fields created fresh per
    instance (``<prefix>_s<i>``)."""
    defaults: dict[str, Any] = {}
    structs: dict[str, Any] = {}
    for i, f in enumerate(fields):
        if f.default_is_shared:
            defaults[f"{prefix}_d{i}"] = f.default_value()
        elif not f.is_array and f.default != "null":
            structs[f"{prefix}_s{i}"] = f.struct_class
    return defaults, structs


def methods_source(kafka_name: str, fields: tuple[Field, ...]) -> tuple[str, dict[str, Any]]:
    """The source of a class's generated ``__init__`` and ``__eq__`` (named
    ``<prefix>__init__`` and ``<prefix>__eq__``), and the values it names
    (:func:`_shared_names`).

    tools/gen_message_code.py writes every class's source into ``_message_code.py``,
    so a process loads them compiled from its bytecode cache; a class missing there
    (a schema table newer than the generated module) has it compiled here."""
    p = code_prefix(kafka_name)
    defaults, structs = _shared_names(p, fields)
    # Defaults that are immutable are keyword defaults, computed once; lists and
    # structs are created fresh per instance, by a literal or the struct's class
    # (as default_value() would: a fetch makes several per partition per read).
    params, body = [], []
    for i, f in enumerate(fields):
        if f"{p}_d{i}" in defaults:
            params.append(f"{f.attr}={p}_d{i}")
            body.append(f"    self.{f.attr} = {f.attr}")
            continue
        if f"{p}_s{i}" in structs:
            fresh = f"{p}_s{i}()"
        elif f.is_array:
            fresh = "None" if f.default == "null" else "[]"
        else:  # a nullable struct absent unless set (a Cursor)
            fresh = "None"
        params.append(f"{f.attr}=_MISSING")
        body.append(f"    self.{f.attr} = {fresh} if {f.attr} is _MISSING else {f.attr}")
    if params:
        src = f"def {p}__init__(self, *, {', '.join(params)}):\n" + "\n".join(body)
    else:
        src = f"def {p}__init__(self):\n    pass"
    # Equality field by field, unrolled (encoders compare tagged struct fields with
    # their defaults for every partition of a response).
    same = " and ".join(f"self.{f.attr} == other.{f.attr}" for f in fields) or "True"
    src += (
        f"\ndef {p}__eq__(self, other):\n    if type(other) is not type(self):\n"
        f"        return NotImplemented\n    return bool({same})\n"
    )
    return src, {**defaults, **structs}


def _methods(kafka_name: str, fields: tuple[Field, ...]) -> tuple[Any, Any]:
    """A class's ``__init__`` and ``__eq__``: the generated module's if it has them for
    exactly these fields, else compiled from :func:`methods_source`."""
    p = code_prefix(kafka_name)
    namespace: dict[str, Any]
    if _message_code.ATTRS.get(kafka_name) == tuple(f.attr for f in fields):
        namespace = vars(_message_code)
        namespace.update(_shared_names(p, fields)[1])  # its struct classes, built by now
    else:
        src, names = methods_source(kafka_name, fields)
        namespace = {**names, "_MISSING": _MISSING}
        exec(src, namespace)  # generated from the schema table, not from input
    return namespace[f"{p}__init__"], namespace[f"{p}__eq__"]


def _make_class(kafka_name: str, fields: tuple[Field, ...]) -> type[Message]:
    """Create a slotted class with a generated keyword ``__init__``."""
    name = kafka_name.rsplit(".", 1)[-1]
    cls: type[Message] = type(
        name,
        (Message,),
        {"__slots__": tuple(f.attr for f in fields), "_fields": fields, "kafka_name": kafka_name},
    )
    for method, function in zip(("__init__", "__eq__"), _methods(kafka_name, fields), strict=True):
        function.__name__, function.__qualname__ = method, f"{name}.{method}"
        setattr(cls, method, function)
    for f in fields:  # nested struct classes by Kafka's name: ProduceRequest.TopicProduceData
        if f.struct_class is not None:
            setattr(cls, f.type, f.struct_class)
    return cls


_MISSING: Any = _message_code._MISSING


@attrs.frozen
class MessageSchema:
    name: str  # "ProduceRequest"
    api_key: int
    kind: str  # "request" | "response"
    min_version: int
    max_version: int
    first_flexible: int  # -1 if never flexible
    fields: tuple[Field, ...]
    cls: type[Message]

    def is_flexible(self, version: int) -> bool:
        return 0 <= self.first_flexible <= version


def _load() -> dict[str, MessageSchema]:
    out = {}
    for name, (api_key, kind, (vmin, vmax), flexible, raw_fields) in MESSAGES.items():
        fields = _build_fields(raw_fields, name)
        cls = _make_class(name, fields)
        out[name] = MessageSchema(name, api_key, kind, vmin, vmax, flexible, fields, cls)
    return out


SCHEMAS: dict[str, MessageSchema] = _load()
REQUESTS: dict[int, MessageSchema] = {s.api_key: s for s in SCHEMAS.values() if s.kind == "request"}
RESPONSES: dict[int, MessageSchema] = {
    s.api_key: s for s in SCHEMAS.values() if s.kind == "response"
}
API_NAMES: dict[int, str] = {k: s.name.removesuffix("Request") for k, s in REQUESTS.items()}

_TOPIC_NAME_FIELDS = frozenset({"Name", "Topic"})


def _first_version_by_id(fields: tuple[Field, ...]) -> int | None:
    """The first version in which a struct of ``fields`` names its topic only by id."""
    by_id = next((f for f in fields if f.name == "TopicId"), None)
    if by_id is not None:
        names = [f for f in fields if f.name in _TOPIC_NAME_FIELDS]
        # By id from TopicId's first version on, once no name field is left.
        first = max([by_id.min_version, *(f.max_version + 1 for f in names)])
        if first <= by_id.max_version:
            return first
    for field in fields:
        if field.fields:
            found = _first_version_by_id(field.fields)
            if found is not None:
                return found
    return None


#: API key -> the first request version that addresses topics by id only (KIP-516):
#: Produce v13, Fetch v13, OffsetCommit v10, ... Derived from the schema table.
TOPIC_ID_VERSIONS: dict[int, int] = {
    key: version
    for key, schema in REQUESTS.items()
    if (version := _first_version_by_id(schema.fields)) is not None
}


def uses_topic_ids(api_key: int, version: int) -> bool:
    """Does this request version name its topics by id (not by name)?"""
    first = TOPIC_ID_VERSIONS.get(api_key)
    return first is not None and version >= first


__all__ = [
    "API_NAMES",
    "REQUESTS",
    "RESPONSES",
    "SCHEMAS",
    "TOPIC_ID_VERSIONS",
    "UNBOUNDED",
    "Field",
    "Message",
    "uses_topic_ids",
]
