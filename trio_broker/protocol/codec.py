"""Compile the schema table into fast per-version encoders and decoders.

For every (message, version) pair we generate the Python source of a decoder
and an encoder from the :mod:`~trio_broker.protocol.schema` fields and
``exec`` it once, on first use — the same trick attrs and dataclasses use. The
generated code is straight-line ``struct`` calls with no per-field dispatch, and
there is no hand-written per-version class anywhere.

Zero-copy rules: a ``records`` field decodes to a ``memoryview`` slice of the
request buffer; when encoding, a ``records`` value that is large (or is a
:class:`RecordsChunks` of file regions) is appended to the output *parts* list
instead of being copied into the header bytes.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

from trio_broker.protocol.errors import InvalidValueError, ProtocolError, TruncatedError
from trio_broker.protocol.primitives import read_uvarint, write_uvarint
from trio_broker.protocol.schema import Field, Message, MessageSchema

Decoder = Callable[[memoryview, int], tuple[Message, int]]
Encoder = Callable[[Message, bytearray, list[Any]], bytearray]

#: Records smaller than this are copied into the surrounding bytes; larger
#: ones travel as their own buffer so the payload is never copied.
INLINE_RECORDS_LIMIT = 4096


class RecordsChunks:
    """Records whose bytes live elsewhere: a list of parts sent one after another.

    A part is any bytes-like object or an object with a ``length`` attribute
    (a file region the network layer sends with ``os.sendfile``).
    """

    __slots__ = ("nbytes", "parts")

    def __init__(self, parts: Sequence[Any]) -> None:
        self.parts = parts
        self.nbytes = sum(part_length(p) for p in parts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordsChunks):
            return self.parts == other.parts
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RecordsChunks({len(self.parts)} parts, {self.nbytes} bytes)"


#: A records field as the codec decodes it (a memoryview slice of the frame) and as
#: clients build it (bytes).
RecordBytes: TypeAlias = bytes | bytearray | memoryview
#: A records field the broker answers with: its bytes, or file regions to send.
Records: TypeAlias = RecordBytes | RecordsChunks


def part_length(part: Any) -> int:
    """Length of an output part: a buffer's nbytes or a region's ``length``."""
    if isinstance(part, bytes | bytearray):
        return len(part)
    if isinstance(part, memoryview):
        return part.nbytes
    return int(part.length)


_I8, _I16, _U16 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">H")
_I32, _U32, _I64 = struct.Struct(">i"), struct.Struct(">I"), struct.Struct(">q")
_F64 = struct.Struct(">d")
_FIXED = {
    "int8": (_I8, 1), "int16": (_I16, 2), "uint16": (_U16, 2), "int32": (_I32, 4),
    "uint32": (_U32, 4), "int64": (_I64, 8), "float64": (_F64, 8),
}  # fmt: skip
_ARRAY_FORMAT = {"int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint16": "H"}


def _need(buf: memoryview, pos: int, size: int) -> None:
    if size < 0:
        raise InvalidValueError(f"negative length {size}")
    if pos + size > len(buf):
        raise TruncatedError(f"{size} bytes needed at {pos}, {len(buf) - pos} left")


def _text(buf: memoryview, pos: int, size: int) -> str:
    _need(buf, pos, size)
    return str(buf[pos : pos + size], "utf-8")


def _put_records(parts: list[Any], out: bytearray, value: Any, flexible: bool) -> bytearray:
    """Write a records field; big payloads become their own part (no copy)."""
    if value is None:
        if flexible:
            out.append(0)
        else:
            out += b"\xff\xff\xff\xff"
        return out
    if isinstance(value, RecordsChunks):
        size, chunks = value.nbytes, value.parts
    else:
        size, chunks = part_length(value), [value]
    out += write_uvarint(size + 1) if flexible else _I32.pack(size)
    if size <= INLINE_RECORDS_LIMIT and not isinstance(value, RecordsChunks):
        out += value
        return out
    parts.append(out)
    parts.extend(chunks)
    return bytearray()


class _Emitter:
    """Accumulates generated source lines with indentation."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.namespace: dict[str, Any] = {
            "_need": _need, "_text": _text, "_uvarint": read_uvarint, "_wuv": write_uvarint,
            "_put_records": _put_records, "_UUID": uuid.UUID, "_InvalidValue": InvalidValueError,
            "_Truncated": TruncatedError, "_I32": _I32, "_I16": _I16, "struct": struct,
        }  # fmt: skip
        self.counter = 0

    def name(self, prefix: str, value: Any) -> str:
        self.counter += 1
        key = f"{prefix}{self.counter}"
        self.namespace[key] = value
        return key

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)


# --------------------------------------------------------------------------- decoding


def _decode_value(em: _Emitter, ind: int, f: Field, target: str, version: int, flex: bool) -> None:
    """Emit code that reads one value of field ``f`` at ``pos`` into ``target``."""
    nullable = f.nullable_in(version)
    if f.is_array:
        if flex:
            em.emit(ind, "n, pos = _uvarint(buf, pos); n -= 1")
        else:
            em.emit(ind, "n = _I32.unpack_from(buf, pos)[0]; pos += 4")
        em.emit(ind, "if n < 0:")
        if nullable:
            em.emit(ind + 1, f"{target} = None")
        else:
            em.emit(ind + 1, f"raise _InvalidValue('null array for {f.name}')")
        em.emit(ind, "else:")
        # Check the count against the bytes actually present before looping or
        # allocating: a huge count in a tiny frame must fail fast.
        if f.fields is None and f.type in _ARRAY_FORMAT:
            size = _FIXED[f.type][1]
            em.emit(ind + 1, f"_need(buf, pos, n * {size})")
            fmt = f"'>%d{_ARRAY_FORMAT[f.type]}' % n"
            em.emit(ind + 1, f"{target} = list(struct.unpack_from({fmt}, buf, pos))")
            em.emit(ind + 1, f"pos += n * {size}")
            return
        em.emit(ind + 1, "if n > len(buf) - pos: raise _Truncated('array longer than frame')")
        em.emit(ind + 1, "items = []")
        em.emit(ind + 1, "for _ in range(n):")
        _decode_scalar(em, ind + 2, f, "item", version, flex, nullable=False)
        em.emit(ind + 2, "items.append(item)")
        em.emit(ind + 1, f"{target} = items")
        return
    _decode_scalar(em, ind, f, target, version, flex, nullable)


def _decode_scalar(
    em: _Emitter, ind: int, f: Field, target: str, version: int, flex: bool, nullable: bool
) -> None:
    t = f.type
    if f.fields is not None:
        assert f.struct_class is not None
        dec = em.name("dec", compile_decoder(f.struct_class, f.fields, version, flex))
        if nullable:  # nullable structs carry an int8 presence marker
            em.emit(ind, "if buf[pos] == 255:")  # -1 as a byte
            em.emit(ind + 1, f"pos += 1; {target} = None")
            em.emit(ind, "else:")
            em.emit(ind + 1, f"pos += 1; {target}, pos = {dec}(buf, pos)")
        else:
            em.emit(ind, f"{target}, pos = {dec}(buf, pos)")
    elif t in _FIXED:
        st, size = _FIXED[t]
        em.emit(ind, f"{target} = {em.name('st', st)}.unpack_from(buf, pos)[0]; pos += {size}")
    elif t == "bool":
        em.emit(ind, f"{target} = buf[pos] != 0; pos += 1")
    elif t == "uuid":
        em.emit(ind, "_need(buf, pos, 16)")
        em.emit(ind, f"{target} = _UUID(bytes=bytes(buf[pos:pos + 16])); pos += 16")
    elif t in ("string", "bytes", "records"):
        if flex:
            em.emit(ind, "size, pos = _uvarint(buf, pos); size -= 1")
        elif t == "string":
            em.emit(ind, "size = _I16.unpack_from(buf, pos)[0]; pos += 2")
        else:
            em.emit(ind, "size = _I32.unpack_from(buf, pos)[0]; pos += 4")
        em.emit(ind, "if size < 0:")
        if nullable:
            em.emit(ind + 1, f"{target} = None")
        else:
            em.emit(ind + 1, f"raise _InvalidValue('null {t} for {f.name}')")
        em.emit(ind, "else:")
        if t == "string":
            em.emit(ind + 1, f"{target} = _text(buf, pos, size); pos += size")
        elif t == "bytes":
            em.emit(ind + 1, f"_need(buf, pos, size); {target} = bytes(buf[pos:pos + size])")
            em.emit(ind + 1, "pos += size")
        else:  # records stay a view into the request buffer
            em.emit(ind + 1, f"_need(buf, pos, size); {target} = buf[pos:pos + size]")
            em.emit(ind + 1, "pos += size")
    else:  # pragma: no cover - schema.py rejects unknown types
        raise AssertionError(t)


def compile_decoder(
    cls: type[Message], fields: tuple[Field, ...], version: int, flex: bool
) -> Decoder:
    em = _Emitter()
    em.namespace["_cls"] = cls
    em.namespace["_fields"] = fields
    em.emit(0, "def decode(buf, pos):")
    em.emit(1, "o = _cls.__new__(_cls)")
    tagged: list[tuple[int, Field]] = []
    for i, f in enumerate(fields):
        if not f.present_in(version) or (flex and f.tagged_in(version)):
            if f.default_is_shared:
                em.emit(1, f"o.{f.attr} = {em.name('default', f.default_value())}")
            else:
                em.emit(1, f"o.{f.attr} = _fields[{i}].default_value()")
            if f.present_in(version):
                tagged.append((i, f))
            continue
        _decode_value(em, 1, f, f"o.{f.attr}", version, flex)
    if flex:
        em.emit(1, "ntags, pos = _uvarint(buf, pos)")
        em.emit(1, "for _ in range(ntags):")
        em.emit(2, "tag, pos = _uvarint(buf, pos)")
        em.emit(2, "size, pos = _uvarint(buf, pos)")
        em.emit(2, "_need(buf, pos, size)")
        em.emit(2, "tag_end = pos + size")
        for _, f in tagged:
            em.emit(2, f"if tag == {f.tag}:")
            em.emit(3, "whole = buf; buf = buf[:tag_end]")
            _decode_value(em, 3, f, f"o.{f.attr}", version, flex)
            em.emit(3, "buf = whole")
        em.emit(2, "pos = tag_end")  # unknown tags are skipped, as Kafka does
    em.emit(1, "return o, pos")
    exec("\n".join(em.lines), em.namespace)  # source generated from the schema table
    decode: Decoder = em.namespace["decode"]
    return decode


# --------------------------------------------------------------------------- encoding


def _encode_value(em: _Emitter, ind: int, f: Field, value: str, version: int, flex: bool) -> None:
    """Emit code that appends ``value`` (an expression) for field ``f`` to ``out``."""
    nullable = f.nullable_in(version)
    if f.is_array:
        em.emit(ind, f"arr = {value}")
        em.emit(ind, "if arr is None:")
        em.emit(ind + 1, "out.append(0)" if flex else "out += b'\\xff\\xff\\xff\\xff'")
        em.emit(ind, "else:")
        em.emit(ind + 1, "out += _wuv(len(arr) + 1)" if flex else "out += _I32.pack(len(arr))")
        if f.fields is None and f.type in _ARRAY_FORMAT:
            em.emit(ind + 1, f"out += struct.pack('>%d{_ARRAY_FORMAT[f.type]}' % len(arr), *arr)")
            return
        em.emit(ind + 1, "for item in arr:")
        _encode_scalar(em, ind + 2, f, "item", version, flex, nullable=False)
        return
    _encode_scalar(em, ind, f, value, version, flex, nullable)


def _encode_scalar(
    em: _Emitter, ind: int, f: Field, value: str, version: int, flex: bool, nullable: bool
) -> None:
    t = f.type
    if f.fields is not None:
        assert f.struct_class is not None
        enc = em.name("enc", compile_encoder(f.fields, version, flex))
        if nullable:
            em.emit(ind, f"if {value} is None: out.append(255)")
            em.emit(ind, f"else: out.append(1); out = {enc}({value}, out, parts)")
        else:
            em.emit(ind, f"out = {enc}({value}, out, parts)")
    elif t in _FIXED:
        em.emit(ind, f"out += {em.name('pk', _FIXED[t][0].pack)}({value})")
    elif t == "bool":
        em.emit(ind, f"out.append(1 if {value} else 0)")
    elif t == "uuid":
        em.emit(ind, f"out += {value}.bytes")
    elif t == "records":
        em.emit(ind, f"out = _put_records(parts, out, {value}, {flex})")
    elif t in ("string", "bytes"):
        em.emit(ind, f"sv = {value}")
        em.emit(ind, "if sv is None:")
        if flex:
            em.emit(ind + 1, "out.append(0)")
        else:
            em.emit(
                ind + 1,
                "out += " + ("b'\\xff\\xff'" if t == "string" else "b'\\xff\\xff\\xff\\xff'"),
            )
        em.emit(ind, "else:")
        if t == "string":
            em.emit(ind + 1, "sv = sv.encode()")
        if flex:
            em.emit(ind + 1, "out += _wuv(len(sv) + 1); out += sv")
        else:
            length = "_I16" if t == "string" else "_I32"
            em.emit(ind + 1, f"out += {length}.pack(len(sv)); out += sv")
    else:  # pragma: no cover
        raise AssertionError(t)


def compile_encoder(fields: tuple[Field, ...], version: int, flex: bool) -> Encoder:
    em = _Emitter()
    em.namespace["_fields"] = fields
    em.emit(0, "def encode(o, out, parts):")
    tagged: list[Field] = []
    for f in fields:
        if not f.present_in(version):
            continue
        if flex and f.tagged_in(version):
            tagged.append(f)
            continue
        _encode_value(em, 1, f, f"o.{f.attr}", version, flex)
    if flex:
        if not tagged:
            em.emit(1, "out.append(0)")
        else:
            # Tagged fields holding their default are left out: old librdkafka
            # (kcat) cannot parse some of them (see KAFKA-FACTS.md).
            em.emit(1, "tags = []")
            for f in sorted(tagged, key=lambda t: t.tag):
                default = em.name("default", f.default_value())
                em.emit(1, f"if o.{f.attr} != {default}:")
                em.emit(2, "outer = out; out = bytearray()")
                _encode_value(em, 2, f, f"o.{f.attr}", version, flex)
                em.emit(2, f"tags.append(({f.tag}, out)); out = outer")
            em.emit(1, "out += _wuv(len(tags))")
            em.emit(1, "for tag, data in tags:")
            em.emit(2, "out += _wuv(tag); out += _wuv(len(data)); out += data")
    em.emit(1, "return out")
    exec("\n".join(em.lines), em.namespace)  # source generated from the schema table
    encode: Encoder = em.namespace["encode"]
    return encode


# --------------------------------------------------------------------------- per-version cache

_decoders: dict[tuple[str, int], Decoder] = {}
_encoders: dict[tuple[str, int], Encoder] = {}


def decoder_for(schema: MessageSchema, version: int) -> Decoder:
    key = (schema.name, version)
    dec = _decoders.get(key)
    if dec is None:
        dec = compile_decoder(schema.cls, schema.fields, version, schema.is_flexible(version))
        _decoders[key] = dec
    return dec


def encoder_for(schema: MessageSchema, version: int) -> Encoder:
    key = (schema.name, version)
    enc = _encoders.get(key)
    if enc is None:
        enc = compile_encoder(schema.fields, version, schema.is_flexible(version))
        _encoders[key] = enc
    return enc


def decode_body(
    schema: MessageSchema,
    version: int,
    buf: memoryview,
    pos: int = 0,
    *,
    allow_trailing: bool = False,
) -> Message:
    """Decode a whole message body; trailing bytes are an error unless ``allow_trailing``.

    Requests are decoded with ``allow_trailing=True``, as Kafka's parser does:
    librdkafka sends some flexible-version requests with bytes left after the body
    (a 4-byte count placeholder never shrunk to its compact form, e.g. the
    all-topics Metadata v13 of ``AdminClient.list_topics()``).

    Raises only :class:`ProtocolError` subclasses, whatever the bytes.
    """
    try:
        message, end = decoder_for(schema, version)(buf, pos)
    except ProtocolError:
        raise
    except (struct.error, IndexError) as exc:
        raise TruncatedError(f"{schema.name} v{version}: {exc}") from None
    except UnicodeDecodeError:
        raise InvalidValueError(f"{schema.name} v{version}: string is not UTF-8") from None
    except (ValueError, OverflowError, MemoryError) as exc:
        raise InvalidValueError(f"{schema.name} v{version}: {exc}") from None
    if end != len(buf) and not allow_trailing:
        raise InvalidValueError(f"{schema.name} v{version}: {len(buf) - end} trailing bytes")
    return message


def encode_body(schema: MessageSchema, version: int, message: Message) -> list[Any]:
    """Encode a message body as a list of parts (bytes-likes and file regions)."""
    parts: list[Any] = []
    out = encoder_for(schema, version)(message, bytearray(), parts)
    if out:
        parts.append(out)
    return parts
