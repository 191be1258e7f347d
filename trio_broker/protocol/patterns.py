"""Regular expressions that arrive in requests, matched in linear time (sans-I/O).

A client's pattern runs on the broker's event loop, so Python's backtracking ``re``
is out: ``(?:.*)`` repeated a few dozen times and then a literal took seconds to
minutes against one short name. RE2 (Google's ``google-re2``, module ``re2``)
matches in time linear in the text for a bounded pattern, and refuses what needs
backtracking (back-references, lookaround) as a syntax error. Its syntax is
otherwise close to Java's, which Kafka uses for these fields.

Used by ListTransactions v2's ``transactional_id_pattern`` and by KIP-848's regex
subscriptions (``state/consumer_group.py``).
"""

from __future__ import annotations

import re2

__all__ = ["MAX_PATTERN_BYTES", "InvalidPattern", "Pattern", "compile_pattern"]

#: The longest pattern accepted, in UTF-8 bytes. Kafka sets none for these fields;
#: RE2's match time grows with the pattern's size, so it is bounded: a name filter
#: of a kilobyte is already generous.
MAX_PATTERN_BYTES = 1024

# No stderr line per bad pattern (a client could flood the log with them); the
# error still comes back as the exception's message. RE2's default program memory
# bound (8 MiB) caps what a pattern under MAX_PATTERN_BYTES may compile to.
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False


class InvalidPattern(ValueError):
    """A pattern RE2 cannot compile, or one longer than :data:`MAX_PATTERN_BYTES`:
    Kafka's INVALID_REGULAR_EXPRESSION."""


class Pattern:
    """A compiled request pattern; :meth:`fullmatch` is true when the whole name matches
    (Java's ``Matcher.matches()``, which Kafka uses)."""

    __slots__ = ("_compiled", "source")

    def __init__(self, source: str, compiled: re2._Regexp) -> None:
        self.source = source
        self._compiled = compiled

    def fullmatch(self, name: str) -> bool:
        return self._compiled.fullmatch(name) is not None


def compile_pattern(source: str) -> Pattern:
    """Compile a client's pattern; :class:`InvalidPattern` when refused."""
    if len(source.encode("utf-8", "surrogatepass")) > MAX_PATTERN_BYTES:
        raise InvalidPattern(f"pattern longer than {MAX_PATTERN_BYTES} bytes")
    try:
        compiled = re2.compile(source, _OPTIONS)
    except re2.error as exc:
        message = exc.args[0] if exc.args else exc
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        raise InvalidPattern(f"invalid pattern: {message}") from None
    return Pattern(source, compiled)
