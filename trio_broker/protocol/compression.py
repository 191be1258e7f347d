"""Record batch compression codecs (sans-I/O).

Decompression is always bounded: a batch of a few kilobytes can expand to
gigabytes (CVE-2023-34455 was a snappy bomb against Kafka itself), so every
codec path checks the output size before, or while, producing it and raises
:class:`DecompressionLimitError` instead of allocating past the bound. Any
other failure on peer bytes raises :class:`CorruptRecordError`.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Callable

import cramjam

from trio_broker.protocol.errors import (
    CorruptRecordError,
    DecompressionLimitError,
    UnsupportedCompressionError,
)

__all__ = [
    "XERIAL_MAGIC",
    "Compression",
    "compress",
    "decompress",
]


class Compression(enum.IntEnum):
    """Codec ids as stored in the low three bits of a batch's attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


Buffer = bytes | bytearray | memoryview

#: Start of a xerial-framed snappy stream (Java's snappy-java, kafka-python, aiokafka).
XERIAL_MAGIC = b"\x82SNAPPY\x00"
# magic + int32 version + int32 minimum compatible version
_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_HEADER_SIZE = 16
_XERIAL_BLOCK = 32 * 1024  # snappy-java's default block size

_LZ4_MAGIC = b"\x04\x22\x4d\x18"
# FLG 0x60 = version 01 + independent blocks, no checksums, no content size;
# BD 0x40 = 64 KiB max block; 0x82 = second byte of xxh32(FLG, BD). Kafka's own
# LZ4 stream writes this header and rejects dependent (linked) blocks.
_LZ4_HEADER = _LZ4_MAGIC + b"\x60\x40\x82"
_LZ4_BLOCK = 64 * 1024
_LZ4_UNCOMPRESSED_BIT = 0x80000000

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_DEFAULT_LEVEL = 3  # Kafka's default zstd level
_GZIP_DEFAULT_LEVEL = 6  # zlib's default, as Java's Deflater uses

# First output buffer when a stream does not declare its size; grown 4x at a time.
_MIN_GUESS = 64 * 1024
# The message Rust's io::copy gives when our fixed output buffer is full.
_BUFFER_FULL = "whole buffer"

_U32 = struct.Struct(">I")
_U32LE = struct.Struct("<I")


def _codec(codec: int) -> Compression:
    try:
        return Compression(codec)
    except ValueError:
        raise UnsupportedCompressionError(f"unknown compression codec {codec}") from None


# --------------------------------------------------------------------------- compress


def compress(
    codec: Compression,
    data: Buffer,
    *,
    level: int | None = None,
    snappy_xerial: bool = False,
) -> bytes:
    """Compress *data* the way Kafka clients do for *codec*.

    Snappy is raw (as librdkafka writes it) unless *snappy_xerial* asks for the
    xerial framing that the Java and Python clients write. LZ4 uses the frame
    format with independent 64 KiB blocks, which every client can read.
    """
    codec = _codec(codec)
    if codec is Compression.NONE:
        return bytes(data)
    if codec is Compression.GZIP:
        c = zlib.compressobj(_GZIP_DEFAULT_LEVEL if level is None else level, zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()
    if codec is Compression.SNAPPY:
        if snappy_xerial:
            return _xerial_compress(data)
        return bytes(cramjam.snappy.compress_raw(data))
    if codec is Compression.LZ4:
        return _lz4_frame_compress(data)
    return bytes(cramjam.zstd.compress(data, level=_ZSTD_DEFAULT_LEVEL if level is None else level))


def _xerial_compress(data: Buffer) -> bytes:
    mv = memoryview(data)
    parts = [_XERIAL_HEADER]
    for start in range(0, len(mv), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(mv[start : start + _XERIAL_BLOCK]))
        parts.append(_U32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _lz4_frame_compress(data: Buffer) -> bytes:
    mv = memoryview(data)
    parts = [_LZ4_HEADER]
    for start in range(0, len(mv), _LZ4_BLOCK):
        chunk = mv[start : start + _LZ4_BLOCK]
        block = bytes(cramjam.lz4.compress_block(chunk, store_size=False))
        if len(block) >= len(chunk):
            # Incompressible: the frame format lets a block be stored as is.
            parts.append(_U32LE.pack(len(chunk) | _LZ4_UNCOMPRESSED_BIT))
            parts.append(bytes(chunk))
        else:
            parts.append(_U32LE.pack(len(block)))
            parts.append(block)
    parts.append(b"\x00\x00\x00\x00")  # end mark
    return b"".join(parts)


# ------------------------------------------------------------------------- decompress


def decompress(codec: Compression, data: Buffer, max_output: int) -> bytes:
    """Decompress peer bytes, producing at most *max_output* bytes.

    Raises :class:`DecompressionLimitError` if the output would be larger,
    :class:`CorruptRecordError` if *data* is not a valid stream, and
    :class:`UnsupportedCompressionError` for an unknown codec id.
    """
    codec = _codec(codec)
    if codec is Compression.NONE:
        if len(data) > max_output:
            raise DecompressionLimitError(f"{len(data)} bytes exceed the limit {max_output}")
        return bytes(data)
    if codec is Compression.GZIP:
        return _gzip_decompress(data, max_output)
    if codec is Compression.SNAPPY:
        if len(data) >= _XERIAL_HEADER_SIZE and data[:8] == XERIAL_MAGIC:
            return _xerial_decompress(memoryview(data), max_output)
        return _snappy_raw_decompress(data, max_output)
    if codec is Compression.LZ4:
        return _bounded_into(cramjam.lz4.decompress_into, data, _lz4_content_size(data), max_output)
    return _bounded_into(cramjam.zstd.decompress_into, data, _zstd_content_size(data), max_output)


def _over(max_output: int) -> DecompressionLimitError:
    return DecompressionLimitError(f"decompressed size exceeds the limit of {max_output} bytes")


def _gzip_decompress(data: Buffer, max_output: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    rest: Buffer = data
    try:
        # Loop because a gzip stream may be several concatenated members.
        while True:
            d = zlib.decompressobj(31)
            # max_length bounds the output; unconsumed input waits in unconsumed_tail.
            out = d.decompress(rest, max_output - total + 1)
            total += len(out)
            if total > max_output:
                raise _over(max_output)
            parts.append(out)
            if not d.eof:
                raise CorruptRecordError("truncated gzip stream")
            rest = d.unused_data
            if not rest:
                break
    except zlib.error as e:
        raise CorruptRecordError(f"invalid gzip data: {e}") from None
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _snappy_raw_len(block: Buffer) -> int:
    try:
        return int(cramjam.snappy.decompress_raw_len(block))
    except Exception as e:  # cramjam raises several types for bad input
        raise CorruptRecordError(f"invalid snappy data: {e}") from None


def _snappy_raw_decompress(data: Buffer, max_output: int) -> bytes:
    # A raw snappy block starts with its uncompressed length: check it before allocating.
    n = _snappy_raw_len(data)
    if n > max_output:
        raise _over(max_output)
    out = bytearray(n)
    try:
        written = cramjam.snappy.decompress_raw_into(data, out)
    except Exception as e:
        raise CorruptRecordError(f"invalid snappy data: {e}") from None
    if written != n:
        raise CorruptRecordError("snappy block shorter than its declared length")
    return bytes(out)


def _xerial_decompress(mv: memoryview, max_output: int) -> bytes:
    # First pass: locate blocks and sum their declared sizes, so the limit is
    # enforced before any output is produced.
    blocks: list[tuple[memoryview, int]] = []
    total = 0
    pos = _XERIAL_HEADER_SIZE
    end = len(mv)
    while pos < end:
        if end - pos < 4:
            raise CorruptRecordError("truncated xerial snappy block length")
        size = _U32.unpack_from(mv, pos)[0]
        pos += 4
        if size > end - pos:
            raise CorruptRecordError("xerial snappy block runs past the end of the data")
        block = mv[pos : pos + size]
        pos += size
        n = _snappy_raw_len(block)
        total += n
        if total > max_output:
            raise _over(max_output)
        blocks.append((block, n))
    out = bytearray(total)
    view = memoryview(out)
    at = 0
    try:
        for block, n in blocks:
            if cramjam.snappy.decompress_raw_into(block, view[at : at + n]) != n:
                raise CorruptRecordError("snappy block shorter than its declared length")
            at += n
    except CorruptRecordError:
        raise
    except Exception as e:
        raise CorruptRecordError(f"invalid snappy data: {e}") from None
    finally:
        view.release()
    return bytes(out)


def _lz4_content_size(data: Buffer) -> int | None:
    """The optional content size from an LZ4 frame descriptor (a hint only)."""
    if len(data) >= 14 and data[:4] == _LZ4_MAGIC and data[4] & 0x08:
        return int.from_bytes(data[6:14], "little")
    return None


def _zstd_content_size(data: Buffer) -> int | None:
    """The frame content size from a zstd frame header, if present (a hint only)."""
    if len(data) < 6 or data[:4] != _ZSTD_MAGIC:
        return None
    fhd = data[4]
    fcs_code = fhd >> 6
    single_segment = (fhd >> 5) & 1
    pos = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[fhd & 3]
    width = (single_segment, 2, 4, 8)[fcs_code]
    if width == 0 or len(data) < pos + width:
        return None
    size = int.from_bytes(data[pos : pos + width], "little")
    return size + 256 if width == 2 else size


def _bounded_into(
    decompress_into: Callable[[Buffer, bytearray], int],
    data: Buffer,
    hint: int | None,
    max_output: int,
) -> bytes:
    """Decompress into a fixed buffer, growing it up to ``max_output + 1`` bytes.

    cramjam stops as soon as the buffer is full, so memory use is bounded by
    the buffer whatever the stream claims. A declared size above the limit is
    rejected at once; a declared size is otherwise only the first guess.
    """
    cap = max_output + 1
    if hint is not None and hint > max_output:
        raise _over(max_output)
    size = min(cap, hint if hint is not None else max(_MIN_GUESS, 8 * len(data)))
    while True:
        out = bytearray(size)
        try:
            n = decompress_into(data, out)
        except Exception as e:
            if _BUFFER_FULL not in str(e):
                raise CorruptRecordError(f"invalid compressed data: {e}") from None
            if size >= cap:
                raise _over(max_output) from None
            size = min(cap, max(_MIN_GUESS, size * 4))
            continue
        if n > max_output:
            raise _over(max_output)
        return bytes(memoryview(out)[:n])
