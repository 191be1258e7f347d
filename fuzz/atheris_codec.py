"""Coverage-guided fuzzing of the request decoder with atheris (libFuzzer).

The property is the one of ``fuzz/test_fuzz_codec.py``: for any bytes,
``decode_request`` succeeds or raises ``ProtocolError``; a decoded request
re-encodes, and re-decoding that is stable. The first input byte also picks a
request schema and version whose body decoder gets the rest of the input, so
every body decoder is reached even without a valid header.

Run (atheris is optional; it is imported only here)::

    .venv/bin/python fuzz/atheris_codec.py fuzz/corpus/ -max_total_time=60

``fuzz/corpus/`` is seeded with the frames captured from real clients
(``tools/capture_golden.py``); libFuzzer adds what it finds to it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import atheris

    with atheris.instrument_imports():
        from trio_broker.protocol import codec, messages, schema
        from trio_broker.protocol.errors import ProtocolError

    cases = [
        (s, v)
        for _, s in sorted(schema.REQUESTS.items())
        for v in range(s.min_version, s.max_version + 1)
    ]

    def body(s: schema.MessageSchema, version: int, msg: schema.Message) -> bytes:
        return b"".join(bytes(p) for p in codec.encode_body(s, version, msg))

    def stable(s: schema.MessageSchema, version: int, msg: schema.Message) -> None:
        again = body(s, version, msg)
        if body(s, version, codec.decode_body(s, version, memoryview(again))) != again:
            raise AssertionError(f"{s.name} v{version}: encode . decode is not stable")

    def test_one_input(data: bytes) -> None:
        try:
            header, msg = messages.decode_request(data)
        except ProtocolError:
            pass
        else:
            stable(schema.REQUESTS[header.api_key], header.api_version, msg)
        if data:
            s, version = cases[data[0] % len(cases)]
            try:
                msg = codec.decode_body(s, version, memoryview(data)[1:])
            except ProtocolError:
                return
            stable(s, version, msg)

    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
