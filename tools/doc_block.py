"""A generated block between two marker lines of a document: read it, or write it anew.

Shared by the table generators (tools/api_table.py, tools/config_table.py), whose
docs tests compare the block in the document with a fresh one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def extract(text: str, begin: str, end: str) -> str:
    """The generated block as it currently stands in a document, markers included."""
    start = text.index(begin)
    stop = text.index(end, start) + len(end)
    return text[start:stop]


def main(description: str, doc: Path, begin: str, end: str, block: Callable[[], str],
         printed: Callable[[], str]) -> None:  # fmt: skip
    """``--write`` replaces the block in ``doc``; otherwise ``printed()`` goes to stdout."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", action="store_true", help=f"update {doc.name}")
    if not parser.parse_args().write:
        print(printed())
        return
    text = doc.read_text()
    doc.write_text(text.replace(extract(text, begin, end), block()))
    print(f"updated {doc}", file=sys.stderr)
