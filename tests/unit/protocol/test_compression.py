"""Tests for trio_broker.protocol.compression: round trips, interop, bounds."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import cramjam
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_broker.protocol.compression import (
    XERIAL_MAGIC,
    Compression,
    compress,
    decompress,
)
from trio_broker.protocol.errors import (
    CorruptRecordError,
    DecompressionLimitError,
    ProtocolError,
    UnsupportedCompressionError,
)

MiB = 1024 * 1024

# (codec, xerial) pairs covering every encoding we write.
VARIANTS = [
    (Compression.NONE, False),
    (Compression.GZIP, False),
    (Compression.SNAPPY, False),
    (Compression.SNAPPY, True),
    (Compression.LZ4, False),
    (Compression.ZSTD, False),
]
VARIANT_IDS = ["none", "gzip", "snappy-raw", "snappy-xerial", "lz4", "zstd"]

SAMPLES = [
    b"",
    b"x",
    b"hello kafka " * 1000,
    os.urandom(100_000),  # incompressible: LZ4 stores blocks as is
    bytes(range(256)) * 600,  # > 64 KiB: several LZ4 and xerial blocks
]


def _pipe(codec: Compression, xerial: bool, data: bytes, limit: int = 16 * MiB) -> bytes:
    return decompress(codec, compress(codec, data, snappy_xerial=xerial), limit)


@pytest.mark.parametrize(("codec", "xerial"), VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("data", SAMPLES, ids=lambda d: f"{len(d)}B")
def test_round_trip(codec: Compression, xerial: bool, data: bytes) -> None:
    assert _pipe(codec, xerial, data) == data


@pytest.mark.parametrize(("codec", "xerial"), VARIANTS, ids=VARIANT_IDS)
@given(data=st.binary(max_size=3000))
def test_round_trip_any_bytes(codec: Compression, xerial: bool, data: bytes) -> None:
    assert _pipe(codec, xerial, data) == data
    # Accepts memoryviews too (batches are decompressed from views of the wire buffer).
    c = compress(codec, memoryview(data), snappy_xerial=xerial)
    assert decompress(codec, memoryview(c), len(data)) == data


@pytest.mark.parametrize(("codec", "xerial"), VARIANTS, ids=VARIANT_IDS)
def test_limit_is_exact(codec: Compression, xerial: bool) -> None:
    data = b"abc" * 50_000
    c = compress(codec, data, snappy_xerial=xerial)
    assert decompress(codec, c, len(data)) == data
    with pytest.raises(DecompressionLimitError):
        decompress(codec, c, len(data) - 1)


def test_wire_formats() -> None:
    data = b"some record bytes " * 100
    # librdkafka-style raw snappy
    assert bytes(cramjam.snappy.decompress_raw(compress(Compression.SNAPPY, data))) == data
    x = compress(Compression.SNAPPY, data, snappy_xerial=True)
    assert x.startswith(XERIAL_MAGIC + b"\x00\x00\x00\x01\x00\x00\x00\x01")
    # LZ4 frame with independent blocks and Kafka's fixed descriptor
    f = compress(Compression.LZ4, data)
    assert f[:7] == b"\x04\x22\x4d\x18\x60\x40\x82"
    assert bytes(cramjam.lz4.decompress(f)) == data
    assert gzip.decompress(compress(Compression.GZIP, data)) == data
    assert bytes(cramjam.zstd.decompress(compress(Compression.ZSTD, data))) == data


def test_lz4_frames_from_other_encoders() -> None:
    lz4frame = pytest.importorskip("lz4.frame")
    data = os.urandom(1000) * 300  # several blocks, matches across block boundaries
    for kwargs in (
        {"block_linked": True, "store_size": True, "content_checksum": True},
        {"block_linked": False, "store_size": False},
        {"block_linked": True, "block_checksum": True, "block_size": lz4frame.BLOCKSIZE_MAX4MB},
    ):
        c = lz4frame.compress(data, **kwargs)
        assert decompress(Compression.LZ4, c, len(data)) == data
        with pytest.raises(DecompressionLimitError):
            decompress(Compression.LZ4, c, len(data) - 1)
    # And python-lz4 reads ours.
    assert lz4frame.decompress(compress(Compression.LZ4, data)) == data


def test_zstd_from_other_encoders() -> None:
    zstandard = pytest.importorskip("zstandard")
    data = b"zstd payload " * 20_000
    # Streaming output carries no content size: exercises the growing-buffer path.
    cobj = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    streamed = cobj.compress(data) + cobj.flush()
    sized = zstandard.ZstdCompressor(write_content_size=True).compress(data)
    for c in (streamed, sized, sized + sized):
        expected = data * (2 if c == sized + sized else 1)
        assert decompress(Compression.ZSTD, c, len(expected)) == expected
        with pytest.raises(DecompressionLimitError):
            decompress(Compression.ZSTD, c, len(expected) - 1)
    assert zstandard.ZstdDecompressor().decompress(compress(Compression.ZSTD, data)) == data


def test_snappy_from_other_encoders() -> None:
    from kafka.codec import has_snappy, snappy_encode

    if not has_snappy():
        pytest.skip("python-snappy not installed")
    data = b"snappy " * 30_000
    xerial = snappy_encode(data, xerial_compatible=True)
    raw = snappy_encode(data, xerial_compatible=False)
    assert xerial.startswith(XERIAL_MAGIC)
    for c in (xerial, raw):
        assert decompress(Compression.SNAPPY, c, len(data)) == data


def test_gzip_members_and_levels() -> None:
    a, b = b"first member " * 100, b"second member " * 100
    assert decompress(Compression.GZIP, gzip.compress(a) + gzip.compress(b), MiB) == a + b
    c = compress(Compression.GZIP, a, level=1)
    assert decompress(Compression.GZIP, c, MiB) == a
    with pytest.raises(DecompressionLimitError):
        decompress(Compression.GZIP, gzip.compress(a) + gzip.compress(b), len(a + b) - 1)


@pytest.mark.parametrize(("codec", "xerial"), VARIANTS[1:], ids=VARIANT_IDS[1:])
def test_corrupt_input(codec: Compression, xerial: bool) -> None:
    good = compress(codec, b"payload " * 500, snappy_xerial=xerial)
    bad_inputs = [
        b"",
        b"definitely not compressed data" * 3,
        good[: len(good) // 2],
        good[:-1],
        good + b"trailing garbage",
    ]
    if codec is not Compression.SNAPPY:
        bad_inputs.append(b"\x00")  # for raw snappy: a valid empty block
    for bad in bad_inputs:
        with pytest.raises(CorruptRecordError):
            decompress(codec, bad, MiB)


def test_xerial_block_lengths_checked() -> None:
    header = XERIAL_MAGIC + b"\x00\x00\x00\x01\x00\x00\x00\x01"
    for body in (b"\x00\x00", b"\x00\x00\x10\x00abc", b"\xff\xff\xff\xff" + b"x" * 10):
        with pytest.raises(CorruptRecordError):
            decompress(Compression.SNAPPY, header + body, MiB)
    assert decompress(Compression.SNAPPY, header, MiB) == b""


def test_declared_sizes_rejected_before_allocating() -> None:
    # Raw snappy declaring 4 GiB; an LZ4 frame declaring 2**60 bytes; zstd declaring 2**40.
    snappy_claim = b"\xff\xff\xff\xff\x0f" + b"\x00" * 10
    lz4_claim = b"\x04\x22\x4d\x18\x68\x40" + (2**60).to_bytes(8, "little") + b"\x00" * 8
    zstd_claim = b"\x28\xb5\x2f\xfd\xe0" + (2**40).to_bytes(8, "little") + b"\x00" * 8
    tracemalloc.start()
    try:
        for codec, claim in (
            (Compression.SNAPPY, snappy_claim),
            (Compression.LZ4, lz4_claim),
            (Compression.ZSTD, zstd_claim),
        ):
            with pytest.raises(DecompressionLimitError):
                decompress(codec, claim, MiB)
        assert tracemalloc.get_traced_memory()[1] < 64 * 1024
    finally:
        tracemalloc.stop()


def test_none_is_bounded_too() -> None:
    assert decompress(Compression.NONE, b"abc", 3) == b"abc"
    with pytest.raises(DecompressionLimitError):
        decompress(Compression.NONE, b"abcd", 3)


def test_unknown_codec() -> None:
    for codec in (5, 6, 7, -1):
        with pytest.raises(UnsupportedCompressionError):
            decompress(codec, b"x", MiB)  # type: ignore[arg-type]
        with pytest.raises(UnsupportedCompressionError):
            compress(codec, b"x")  # type: ignore[arg-type]
    assert issubclass(UnsupportedCompressionError, ProtocolError)


# --------------------------------------------------------------------------- bombs

BOMB_SIZE = 100 * MiB


def _bomb_makers() -> dict[str, Callable[[bytes], bytes]]:
    makers: dict[str, Callable[[bytes], bytes]] = {
        "gzip": lambda d: compress(Compression.GZIP, d, level=1),
        "snappy-raw": lambda d: compress(Compression.SNAPPY, d),
        "snappy-xerial": lambda d: compress(Compression.SNAPPY, d, snappy_xerial=True),
        "lz4": lambda d: compress(Compression.LZ4, d),
        # cramjam's zstd stores the content size: rejected from the header alone.
        "zstd": lambda d: compress(Compression.ZSTD, d),
        # cramjam's LZ4 frame has no content size and linked blocks: must stream.
        "lz4-cramjam": lambda d: bytes(cramjam.lz4.compress(d)),
    }
    try:
        import zstandard

        def zstd_unsized(d: bytes) -> bytes:
            cobj = zstandard.ZstdCompressor(write_content_size=False).compressobj()
            return bytes(cobj.compress(d) + cobj.flush())

        makers["zstd-unsized"] = zstd_unsized
    except ImportError:
        pass
    return makers


_CODEC_OF = {
    "gzip": Compression.GZIP,
    "snappy-raw": Compression.SNAPPY,
    "snappy-xerial": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "lz4-cramjam": Compression.LZ4,
    "zstd": Compression.ZSTD,
    "zstd-unsized": Compression.ZSTD,
}


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    zeros = bytes(BOMB_SIZE)
    return {name: make(zeros) for name, make in _bomb_makers().items()}


def test_bombs_hit_the_limit_without_big_allocations(bombs: dict[str, bytes]) -> None:
    for name, bomb in bombs.items():
        tracemalloc.start()
        try:
            with pytest.raises(DecompressionLimitError):
                decompress(_CODEC_OF[name], bomb, MiB)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        # The output buffer (at most limit + 1) plus the one it grew from.
        assert peak < 3 * MiB, (name, peak)


def test_bombs_bounded_in_native_memory(bombs: dict[str, bytes], tmp_path: Path) -> None:
    """tracemalloc cannot see allocations inside cramjam: measure the process RSS."""
    for name, bomb in bombs.items():
        (tmp_path / name).write_bytes(bomb)
    script = textwrap.dedent(
        """
        import resource, sys
        from pathlib import Path
        from trio_broker.protocol.compression import Compression, decompress
        from trio_broker.protocol.errors import DecompressionLimitError
        codecs = dict(arg.split("=") for arg in sys.argv[2:])
        bombs = {n: Path(sys.argv[1], n).read_bytes() for n in codecs}
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for name, bomb in bombs.items():
            try:
                decompress(Compression(int(codecs[name])), bomb, 1 << 20)
            except DecompressionLimitError:
                pass
            else:
                raise SystemExit(f"{name}: no limit error")
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
        """
    )
    args = [f"{name}={int(_CODEC_OF[name])}" for name in bombs]
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    growth_kib = int(out.stdout.strip())
    assert growth_kib < 32 * 1024, f"RSS grew by {growth_kib} KiB"
