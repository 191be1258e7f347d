"""trio_broker/protocol/_message_code.py: the message classes' methods, written out.

* The checked-in module is exactly what tools/gen_message_code.py writes from the
  schema table.
* Every class takes its methods from it (none compiled at import), and they behave as
  the compiled ones: keyword defaults, fresh lists and structs per instance, equality.
* A class the module does not record the same fields for gets its methods compiled.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from trio_broker.protocol import _message_code, schema
from trio_broker.protocol.schema import SCHEMAS, Message, methods_source

ROOT = Path(__file__).resolve().parents[3]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "_gen_message_code", ROOT / "tools" / "gen_message_code.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_module_is_what_the_generator_writes() -> None:
    generator = _generator()
    written = (ROOT / "trio_broker" / "protocol" / "_message_code.py").read_text()
    assert written == generator.render(), f"stale: run {generator.COMMAND}"


def _all_classes() -> list[type[Message]]:
    found: dict[str, type[Message]] = {}
    todo = [s.cls for s in SCHEMAS.values()]
    while todo:
        cls = todo.pop()
        if cls.kafka_name not in found:
            found[cls.kafka_name] = cls
            todo.extend(f.struct_class for f in cls._fields if f.struct_class is not None)
    return list(found.values())


def test_every_class_uses_the_written_methods() -> None:
    classes = _all_classes()
    assert len(classes) > 300
    for cls in classes:
        prefix = schema.code_prefix(cls.kafka_name)
        assert cls.__init__ is getattr(_message_code, f"{prefix}__init__"), cls.kafka_name
        assert cls.__eq__ is getattr(_message_code, f"{prefix}__eq__"), cls.kafka_name
        assert _message_code.ATTRS[cls.kafka_name] == tuple(f.attr for f in cls._fields)


def test_written_methods_keep_defaults_fresh_and_compare_fields() -> None:
    fetch = SCHEMAS["FetchResponse"].cls
    a, b = fetch(), fetch()
    assert a == b and a.responses == [] and a.responses is not b.responses
    b.responses.append(fetch.FetchableTopicResponse(topic="t"))
    assert a != b
    part = fetch.FetchableTopicResponse.PartitionData()
    # A struct field's default is a fresh instance of its class (bound by schema.py).
    assert isinstance(
        part.current_leader, fetch.FetchableTopicResponse.PartitionData.LeaderIdAndEpoch
    )
    assert part.current_leader is not fetch.FetchableTopicResponse.PartitionData().current_leader
    assert fetch(throttle_time_ms=5).throttle_time_ms == 5
    assert fetch.__init__.__qualname__ == "FetchResponse.__init__"


def test_a_class_the_module_does_not_match_is_compiled() -> None:
    cls = SCHEMAS["ProduceRequest"].cls
    changed = cls._fields[:-1]  # as if the table had grown or shrunk since generation
    init, eq = schema._methods(cls.kafka_name, changed)
    prefix = schema.code_prefix(cls.kafka_name)
    assert init is not getattr(_message_code, f"{prefix}__init__")
    source, _ = methods_source(cls.kafka_name, changed)
    assert f"def {prefix}__init__" in source
    made = cls.__new__(cls)
    init(made, acks=-1)
    assert made.acks == -1 and made.transactional_id is None
    assert eq(made, made) is True
