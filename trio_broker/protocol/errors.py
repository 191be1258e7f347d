"""The codec's own exception family.

Decoding anything a peer sent raises only :class:`ProtocolError` (or a subclass);
that is a property test and a fuzz target. Each subclass names the Kafka error
code a broker should answer with when the protocol has one.
"""

from __future__ import annotations

from trio_broker.protocol.error_codes import ErrorCode


class KafkaError(Exception):
    """An error that names the Kafka error code a handler answers with.

    The one family: protocol, storage and handler errors all carry ``error_code``
    (a class default, or set per instance by ``KafkaError(code, message)``).
    """

    error_code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, *args: object) -> None:
        if len(args) == 2 and isinstance(args[0], int) and isinstance(args[1], str):
            self.error_code = ErrorCode(args[0])
            args = (args[1],)
        super().__init__(*args)


class ProtocolError(KafkaError):
    """Bytes from the wire that do not form a valid Kafka message."""

    #: The code a broker answers with, when the request can be answered at all.
    error_code: ErrorCode = ErrorCode.INVALID_REQUEST


class TruncatedError(ProtocolError):
    """The buffer ended before the value it was supposed to hold."""


class InvalidValueError(ProtocolError):
    """A value is out of its allowed range (negative length, over-long varint, ...)."""


class FrameTooLargeError(ProtocolError):
    """A frame's length prefix exceeds the configured maximum."""


class UnsupportedVersionError(ProtocolError):
    """An API key or version this broker does not implement."""

    error_code = ErrorCode.UNSUPPORTED_VERSION

    def __init__(self, message: str, api_key: int = -1, api_version: int = -1) -> None:
        super().__init__(message)
        self.api_key = api_key
        self.api_version = api_version


class CorruptRecordError(ProtocolError):
    """A record batch whose CRC does not match, or whose sizes are inconsistent."""

    error_code = ErrorCode.CORRUPT_MESSAGE


class InvalidRecordError(ProtocolError):
    """A record batch that is well-formed but breaks a rule (count mismatch, bad magic...)."""

    error_code = ErrorCode.INVALID_RECORD


class UnsupportedCompressionError(ProtocolError):
    """A compression codec id outside 0..4."""

    error_code = ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


class DecompressionLimitError(ProtocolError):
    """Decompressing a batch would exceed the configured output bound (a 'bomb')."""

    error_code = ErrorCode.CORRUPT_MESSAGE
