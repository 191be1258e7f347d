"""Java properties files (Kafka's ``server.properties``), read as ``java.util.Properties`` does.

The rules, from the ``Properties.load`` documentation:

- A logical line is a natural line (ended by ``\\n``, ``\\r`` or ``\\r\\n``) plus the
  following natural lines while it ends in an odd number of backslashes; the
  continuation's leading whitespace (space, tab, form feed) is dropped.
- Blank lines, and lines whose first non-whitespace character is ``#`` or ``!``, are
  skipped. A comment line never continues, but a continuation that starts with ``#``
  is part of the value (unless nothing came before it: then it is a comment).
- The key runs to the first unescaped ``=``, ``:`` or whitespace; whitespace, then one
  ``=`` or ``:``, then whitespace separate it from the value. Trailing whitespace of
  the value is kept.
- Escapes in keys and values: ``\\t \\n \\r \\f``, ``\\uXXXX``, and a backslash before any
  other character stands for that character (``\\=``, ``\\:``, ``\\ ``, ``\\\\``, ``\\#``).
- A later duplicate key replaces an earlier one.

Kafka reads the file's bytes as ISO-8859-1; :func:`read_properties_file` decodes
UTF-8 (falling back to ISO-8859-1), so ``\\uXXXX`` escapes mean the same in both.
"""

from __future__ import annotations

import re
from pathlib import Path

from trio_broker.config_errors import ConfigError

_WHITESPACE = " \t\f"
_SEPARATORS = "=:"
_SIMPLE_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text: str) -> dict[str, str]:
    """Every key and value of a properties document, in file order; ConfigError if malformed."""
    properties: dict[str, str] = {}
    for start, line in _logical_lines(text):
        key, value = _split_key_value(line)
        try:
            properties[_unescape(key)] = _unescape(value)
        except ValueError as exc:
            number = len(re.split(r"\r\n|\r|\n", text[:start]))
            raise ConfigError(f"line {number}: {exc}") from None
    return properties


def read_properties_file(path: Path) -> dict[str, str]:
    """:func:`parse_properties` of a file; ConfigError if it cannot be read."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("iso-8859-1")
    try:
        return parse_properties(text)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(offset where it starts, logical line) for each line that holds a key.

    A character-level reader with Java's corner cases: a comment can start wherever the
    logical line is still empty (also after a continuation that added nothing), a
    backslash-newline at the very end of the text still yields its (possibly empty)
    line, and ``\r\n`` after a continuation counts as one line end.
    """
    out: list[tuple[int, str]] = []
    size = len(text)
    position = 0
    while True:
        chars: list[str] = []
        start = 0
        skip_whitespace = True
        appended_line_begin = False  # just continued: an empty line ends the logical line
        preceding_backslash = False
        while True:
            if position >= size:
                if chars:
                    out.append((start, "".join(chars[:-1] if preceding_backslash else chars)))
                return out
            char = text[position]
            position += 1
            if skip_whitespace:
                if char in _WHITESPACE:
                    continue
                if not appended_line_begin and char in "\r\n":
                    continue
                skip_whitespace = appended_line_begin = False
            if not chars and char in "#!":
                while position < size and text[position] not in "\r\n":
                    position += 1  # the comment runs to the end of its line
                skip_whitespace = True
                continue
            if char not in "\r\n":
                if not chars:
                    start = position - 1
                chars.append(char)
                preceding_backslash = not preceding_backslash if char == "\\" else False
                continue
            if not chars:
                skip_whitespace = True
                continue
            if position >= size or not preceding_backslash:
                out.append((start, "".join(chars[:-1] if preceding_backslash else chars)))
                break
            chars.pop()  # the continuation backslash is not part of the line
            skip_whitespace = appended_line_begin = True
            preceding_backslash = False
            if char == "\r" and text[position] == "\n":
                position += 1


def _split_key_value(line: str) -> tuple[str, str]:
    """The raw (still escaped) key and value of one logical line."""
    position = 0
    while position < len(line):
        char = line[position]
        if char == "\\":
            position += 2  # an escaped character belongs to the key
            continue
        if char in _SEPARATORS or char in _WHITESPACE:
            break
        position += 1
    key = line[:position]
    rest = line[position:].lstrip(_WHITESPACE)
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(_WHITESPACE)
    return key, rest


def _unescape(raw: str) -> str:
    if "\\" not in raw:
        return raw
    out: list[str] = []
    position = 0
    while position < len(raw):
        char = raw[position]
        position += 1
        if char != "\\":
            out.append(char)
            continue
        if position >= len(raw):
            break  # a lone trailing backslash (end of file) stands for nothing
        escaped = raw[position]
        position += 1
        if escaped == "u":
            digits = raw[position : position + 4]
            if len(digits) < 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError(f"malformed \\uxxxx escape: \\u{digits}")
            out.append(chr(int(digits, 16)))
            position += 4
        else:
            out.append(_SIMPLE_ESCAPES.get(escaped, escaped))
    # Surrogate pairs written as two \u escapes (Java's UTF-16) become one character.
    text = "".join(out)
    if any("\ud800" <= c <= "\udfff" for c in text):
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text
