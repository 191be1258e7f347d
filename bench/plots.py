"""SVG charts for docs/performance.md, written without a plotting library.

* :func:`latency_cdf_svg` - one line per workload: latency (ms, log scale) against
  the fraction of records acknowledged within it.
* :func:`bars_svg` - measured value as a share of its target, one bar per figure,
  with the physical limit's share beside it where there is one.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

#: Quantiles kept per workload in the JSON (enough for a smooth CDF, small to store).
CDF_QUANTILES = [i / 100 for i in range(100)] + [0.995, 0.999, 1.0]
COLOURS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def quantiles(sorted_values: Sequence[float], scale: float = 1.0) -> list[float]:
    """The values at CDF_QUANTILES of an ascending sequence (times ``scale``)."""
    if not sorted_values:
        return []
    last = len(sorted_values) - 1
    return [sorted_values[min(last, round(q * last))] * scale for q in CDF_QUANTILES]


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            'font-family="sans-serif" font-size="12">',
            '<rect width="100%" height="100%" fill="white"/>',
            f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="14">'
            f"{html.escape(title)}</text>",
            *body,
            "</svg>",
            "",
        ]
    )


def latency_cdf_svg(series: dict[str, list[float]], title: str) -> str:
    """``series``: name -> latencies in ms at CDF_QUANTILES (see :func:`quantiles`)."""
    width, height, left, right, top, bottom = 760, 420, 60, 200, 30, 50
    plot_w, plot_h = width - left - right, height - top - bottom
    values = [v for qs in series.values() for v in qs if v > 0]
    if not values:
        return _svg(width, height, ['<text x="60" y="60">no data</text>'], title)
    lo = 10 ** math.floor(math.log10(min(values)))
    hi = 10 ** math.ceil(math.log10(max(values)))
    span = math.log10(hi) - math.log10(lo) or 1.0

    def x(ms: float) -> float:
        return left + (math.log10(max(ms, lo)) - math.log10(lo)) / span * plot_w

    def y(fraction: float) -> float:
        return top + (1 - fraction) * plot_h

    body = [
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>'
    ]
    decade = lo
    while decade <= hi * 1.0001:
        px = x(decade)
        body.append(
            f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{top + plot_h}" stroke="#eee"/>'
        )
        body.append(
            f'<text x="{px:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{decade:g}</text>'
        )
        decade *= 10
    for fraction in (0, 0.5, 0.9, 0.99, 1.0):
        py = y(fraction)
        body.append(
            f'<line x1="{left}" y1="{py:.1f}" x2="{left + plot_w}" y2="{py:.1f}" stroke="#eee"/>'
        )
        body.append(f'<text x="{left - 6}" y="{py + 4:.1f}" text-anchor="end">{fraction:g}</text>')
    body.append(
        f'<text x="{left + plot_w / 2}" y="{height - 12}" text-anchor="middle">'
        "latency, ms (log scale)</text>"
    )
    body.append(
        f'<text x="16" y="{top + plot_h / 2}" transform="rotate(-90 16 {top + plot_h / 2})" '
        'text-anchor="middle">fraction of records acknowledged</text>'
    )
    for i, (name, qs) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        points = " ".join(
            f"{x(v):.1f},{y(q):.1f}" for q, v in zip(CDF_QUANTILES, qs, strict=False) if v > 0
        )
        body.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        ly = top + 14 + i * 18
        body.append(
            f'<line x1="{left + plot_w + 12}" y1="{ly - 4}" x2="{left + plot_w + 32}" '
            f'y2="{ly - 4}" stroke="{colour}" stroke-width="3"/>'
        )
        p99 = qs[CDF_QUANTILES.index(0.99)] if len(qs) == len(CDF_QUANTILES) else float("nan")
        body.append(
            f'<text x="{left + plot_w + 38}" y="{ly}">{html.escape(name)} (p99 {p99:,.0f})</text>'
        )
    return _svg(width, height, body, title)


def bars_svg(rows: list[tuple[str, float, float | None]], title: str) -> str:
    """``rows``: (figure, measured/target, limit/target or None). 1.0 = on target."""
    width, left, bar_h, gap, top = 760, 300, 14, 12, 34
    height = top + len(rows) * (2 * bar_h + gap) + 40
    top_value = max([1.2] + [v for _, m, lim in rows for v in (m, lim or 0)])
    plot_w = width - left - 80

    def w(v: float) -> float:
        return max(0.0, v) / top_value * plot_w

    body: list[str] = []
    target_x = left + w(1.0)
    for i, (name, measured, limit) in enumerate(rows):
        y0 = top + i * (2 * bar_h + gap)
        body.append(
            f'<text x="{left - 8}" y="{y0 + bar_h}" text-anchor="end">{html.escape(name)}</text>'
        )
        colour = "#2ca02c" if measured >= 1.0 else "#d62728"
        body.append(
            f'<rect x="{left}" y="{y0}" width="{w(measured):.1f}" height="{bar_h}" fill="{colour}"/>'
        )
        body.append(
            f'<text x="{left + w(measured) + 4:.1f}" y="{y0 + bar_h - 3}">{measured:.2f}</text>'
        )
        if limit is not None:
            body.append(
                f'<rect x="{left}" y="{y0 + bar_h}" width="{w(limit):.1f}" height="{bar_h - 4}" '
                'fill="#bbb"/>'
            )
            body.append(
                f'<text x="{left + w(limit) + 4:.1f}" y="{y0 + 2 * bar_h - 5}" fill="#666">'
                f"limit {limit:.2f}</text>"
            )
    body.append(
        f'<line x1="{target_x:.1f}" y1="{top - 6}" x2="{target_x:.1f}" y2="{height - 34}" '
        'stroke="black" stroke-dasharray="4 3"/>'
    )
    body.append(
        f'<text x="{target_x:.1f}" y="{height - 18}" text-anchor="middle">target = 1.0 '
        "(green: met; grey: the physical limit in the same units)</text>"
    )
    return _svg(width, height, body, title)
