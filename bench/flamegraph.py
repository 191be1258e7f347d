"""Collapsed stacks (``a;b;c 42`` per line, py-spy's ``--format raw``) -> SVG flame graph.

A small renderer of our own so one py-spy recording gives both the picture
(docs/perf/*.svg) and the numbers (self and inclusive time per function).

    .venv/bin/python bench/flamegraph.py STACKS.txt OUT.svg [--title TEXT]
"""

from __future__ import annotations

import argparse
import html
import zlib
from collections import Counter
from pathlib import Path

WIDTH = 1200
ROW = 16
FONT = 11
MIN_WIDTH_PX = 0.3  # frames narrower than this are not drawn (still counted)


class Node:
    __slots__ = ("children", "name", "total")

    def __init__(self, name: str) -> None:
        self.name = name
        self.total = 0
        self.children: dict[str, Node] = {}

    def child(self, name: str) -> Node:
        node = self.children.get(name)
        if node is None:
            node = self.children[name] = Node(name)
        return node


def read_stacks(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks.append((frames.split(";"), int(count)))
    return stacks


def build_tree(stacks: list[tuple[list[str], int]]) -> Node:
    root = Node("all")
    for frames, count in stacks:
        root.total += count
        node = root
        for frame in frames:
            node = node.child(frame)
            node.total += count
    return root


def self_and_inclusive(stacks: list[tuple[list[str], int]]) -> tuple[Counter[str], Counter[str]]:
    """Samples per function: on top of the stack (self) and anywhere in it (inclusive)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for frames, count in stacks:
        if frames:
            own[short(frames[-1])] += count
        for name in {short(f) for f in frames}:
            inclusive[name] += count
    return own, inclusive


def short(frame: str) -> str:
    """'send (trio_broker/server/connection.py:120)' -> 'send (trio_broker/server/connection.py)'."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{name} ({path})" if path else name


def colour(name: str) -> str:
    # Our code warm, the standard library and packages cool; stable per name.
    h = zlib.crc32(name.encode()) % 60
    if "trio_broker/" in name:
        return f"rgb(235,{100 + h},{40 + h // 2})"
    if "trio/" in name:
        return f"rgb({90 + h},{150 + h},220)"
    return f"rgb({170 + h},{170 + h},{120 + h})"


def render(root: Node, title: str) -> str:
    rects: list[str] = []
    depth_max = 0

    def walk(node: Node, x: float, depth: int) -> None:
        nonlocal depth_max
        scale = WIDTH / root.total
        for child in sorted(node.children.values(), key=lambda n: n.name):
            w = child.total * scale
            if w >= MIN_WIDTH_PX:
                depth_max = max(depth_max, depth)
                label = short(child.name)
                pct = 100 * child.total / root.total
                text = html.escape(label)
                chars = int(w / (FONT * 0.6))
                shown = (
                    text if len(label) <= chars else html.escape(label[: max(0, chars - 2)] + "..")
                )
                rects.append(
                    f"<g><title>{text} ({child.total} samples, {pct:.1f}%)</title>"
                    f'<rect x="{x:.2f}" y="{{y{depth}}}" width="{w:.2f}" height="{ROW - 1}" '
                    f'fill="{colour(child.name)}"/>'
                    + (
                        f'<text x="{x + 2:.2f}" y="{{t{depth}}}">{shown}</text>'
                        if chars >= 3
                        else ""
                    )
                    + "</g>"
                )
                walk(child, x, depth + 1)
            x += w

    walk(root, 0.0, 0)
    height = (depth_max + 3) * ROW + 10
    body = "\n".join(rects)
    # Icicle layout turned upside down (flame): depth 0 at the bottom.
    for depth in range(depth_max + 1):
        y = height - (depth + 2) * ROW
        body = body.replace(f"{{y{depth}}}", str(y)).replace(f"{{t{depth}}}", str(y + ROW - 4))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="monospace" font-size="{FONT}">\n'
        f'<rect width="100%" height="100%" fill="white"/>\n'
        f'<text x="4" y="14" font-size="13">{html.escape(title)} '
        f"({root.total} samples; hover a frame for its share)</text>\n{body}\n</svg>\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stacks", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--title", default="flame graph")
    args = parser.parse_args(argv)
    stacks = read_stacks(args.stacks)
    args.out.write_text(render(build_tree(stacks), args.title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
