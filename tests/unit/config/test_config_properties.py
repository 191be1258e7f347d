"""The Java-properties reader (config_properties.py): java.util.Properties' rules.

Hand-written cases for each rule, then a differential test: random documents built
from the characters that matter (separators, backslashes, comment marks, line
ends, unicode) are parsed by us and by ``java.util.Properties.load`` in a JVM, and
must give the same keys and values (skipped when no ``java`` is installed).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.kafka_tools.classpath import FAST_START_JVM
from trio_broker.config_errors import ConfigError
from trio_broker.config_properties import parse_properties, read_properties_file


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=1\nb = 2\nc:3\nd 4\ne\t=\t5", {"a": "1", "b": "2", "c": "3", "d": "4", "e": "5"}),
        ("key = value  ", {"key": "value  "}),  # trailing whitespace is kept
        ("key", {"key": ""}),
        ("key=", {"key": ""}),
        ("a==b", {"a": "=b"}),  # one separator only; the second '=' is the value's
        ("a = : b", {"a": ": b"}),
        ("a b c", {"a": "b c"}),
        ("# comment\n! also a comment\n   # indented comment\n\nk=v", {"k": "v"}),
        ("k=v # not a comment", {"k": "v # not a comment"}),
        ("k=1\nk=2", {"k": "2"}),  # the later one wins
        ("a=1\r\nb=2\rc=3", {"a": "1", "b": "2", "c": "3"}),
    ],
)  # fmt: skip
def test_keys_separators_and_comments(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("list = a,\\\n       b,\\\n   c", {"list": "a,b,c"}),  # continuation drops indentation
        ("k = one\\\\\nother = two", {"k": "one\\", "other": "two"}),  # even backslashes: no join
        ("k = x\\\\\\\ny", {"k": "x\\y"}),  # three: an escaped backslash, then a join
        ("k = a\\\n# not a comment\n", {"k": "a# not a comment"}),
        ("# comment \\\nk=v", {"k": "v"}),  # a comment line never continues
        ("k\\\n  ey = v", {"key": "v"}),  # a key can continue too
        ("k = end\\", {"k": "end"}),  # a backslash at the end of the file joins nothing
        ("\\\nk=v", {"k": "v"}),
    ],
)  # fmt: skip
def test_line_continuations(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a\\=b = c", {"a=b": "c"}),
        ("a\\:b\\ c = d", {"a:b c": "d"}),
        ("k = tab\\there\\nnew\\rret\\fform", {"k": "tab\there\nnew\rret\fform"}),
        ("k = \\q\\#\\!\\\\", {"k": "q#!\\"}),  # any other escaped character stands for itself
        ("\\#k = v", {"#k": "v"}),
        ("k = \\ leading space", {"k": " leading space"}),
        ("k = caf\\u00e9 \\u20AC", {"k": "café €"}),
        ("k = \\ud83d\\ude00", {"k": "\U0001f600"}),  # a surrogate pair is one character
        ("k = naïve ✓", {"k": "naïve ✓"}),
        ("\\u006b = v", {"k": "v"}),
    ],
)  # fmt: skip
def test_escapes_and_unicode(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected


@pytest.mark.parametrize("text", ["k = \\u12", "k = \\uzzzz", "\\u00g1 = v"])
def test_a_malformed_unicode_escape_is_an_error_naming_the_line(text: str) -> None:
    with pytest.raises(ConfigError, match=r"line 1: malformed \\uxxxx"):
        parse_properties(text)
    with pytest.raises(ConfigError, match=r"line 4: malformed \\uxxxx"):
        parse_properties("# one\r\nok = 1\r\n\r\n" + text)


def test_files_are_utf8_or_latin1(tmp_path: Path) -> None:
    utf8 = tmp_path / "utf8.properties"
    utf8.write_bytes("k = é\n".encode())
    latin1 = tmp_path / "latin1.properties"
    latin1.write_bytes("k = é\n".encode("iso-8859-1"))
    assert read_properties_file(utf8) == read_properties_file(latin1) == {"k": "é"}
    with pytest.raises(ConfigError, match="cannot read config"):
        read_properties_file(tmp_path / "missing.properties")


# --------------------------------------------------------------------------- against Java

_JAVA_LOADER = r"""
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.util.*;

public class LoadProperties {
    static String quote(String s) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : s.toCharArray()) out.append(String.format("\\u%04x", (int) c));
        return out.append('"').toString();
    }
    public static void main(String[] args) throws IOException {
        StringBuilder out = new StringBuilder("[");
        for (int i = 0; i < args.length; i++) {
            Properties props = new Properties();
            try (Reader in = Files.newBufferedReader(Paths.get(args[i]), StandardCharsets.UTF_8)) {
                props.load(in);
            } catch (IllegalArgumentException e) {
                out.append(i > 0 ? "," : "").append("null");
                continue;
            }
            out.append(i > 0 ? "," : "").append("{");
            boolean first = true;
            for (String key : new TreeSet<>(props.stringPropertyNames())) {
                out.append(first ? "" : ",").append(quote(key)).append(":")
                   .append(quote(props.getProperty(key)));
                first = false;
            }
            out.append("}");
        }
        System.out.println(out.append("]"));
    }
}
"""

_PIECES = ["k", "v", "é", "€", " ", "  ", "\t", "\f", "=", ":", "#", "!", "\\", "\\\\",
           "\n", "\r\n", "\r", "\\u0041", "\\n", "\\t", "\\=", "\\ ", "x.y", "1"]  # fmt: skip


def _random_document(rng: random.Random) -> str:
    return "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 40)))


@pytest.mark.skipif(shutil.which("java") is None, reason="needs a JDK (java)")
def test_same_answers_as_java_util_properties(tmp_path: Path) -> None:
    rng = random.Random(20261125)
    documents = [_random_document(rng) for _ in range(400)]
    paths = []
    for index, document in enumerate(documents):
        path = tmp_path / f"doc{index}.properties"
        path.write_text(document, encoding="utf-8", newline="")
        paths.append(str(path))
    source = tmp_path / "LoadProperties.java"
    source.write_text(_JAVA_LOADER)
    run = subprocess.run(
        ["java", *FAST_START_JVM, str(source), *paths],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    answers = json.loads(run.stdout)
    assert len(answers) == len(documents)
    for document, java in zip(documents, answers, strict=True):
        try:
            ours: dict[str, str] | None = parse_properties(document)
        except ConfigError:
            ours = None
        assert ours == java, f"document {document!r}"
