"""``verify --report DIR``: report.json and a self-contained report.html with inline SVG plots.

The plots (a latency histogram per API, a throughput timeline) are drawn here
as SVG: no plotting library, and the HTML opens anywhere as one file.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

WIDTH, HEIGHT = 360, 150
MARGIN_LEFT, MARGIN_BOTTOM, MARGIN_TOP = 44, 28, 18
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 1:
        return f"{value:.3g}"
    return f"{value:.2g}"


def _frame(width: int, height: int, title: str, y_max: float, y_label: str) -> list[str]:
    x0, y0 = MARGIN_LEFT, height - MARGIN_BOTTOM
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        "font-family='sans-serif' font-size='10'>",
        f"<text x='{width / 2}' y='12' text-anchor='middle' font-weight='bold'>"
        f"{html.escape(title)}</text>",
        f"<line x1='{x0}' y1='{y0}' x2='{width - 6}' y2='{y0}' stroke='#444'/>",
        f"<line x1='{x0}' y1='{MARGIN_TOP}' x2='{x0}' y2='{y0}' stroke='#444'/>",
        f"<text x='{x0 - 3}' y='{MARGIN_TOP + 4}' text-anchor='end'>{_fmt(y_max)}</text>",
        f"<text x='{x0 - 3}' y='{y0}' text-anchor='end'>0</text>",
        f"<text x='4' y='{(MARGIN_TOP + y0) / 2}' transform='rotate(-90 8 {(MARGIN_TOP + y0) / 2})'"
        f" text-anchor='middle'>{html.escape(y_label)}</text>",
    ]
    return out


def histogram_svg(api: str, buckets: list[list[float]], per_decade: int) -> str:
    """Bars of request counts over log-spaced latency buckets (ms)."""
    if not buckets:
        return ""
    y_max = max(n for _, n in buckets) or 1
    low = min(b for b, _ in buckets)
    high = max(b for b, _ in buckets) * 10 ** (1 / per_decade)
    import math

    span = max(math.log10(high) - math.log10(low), 1e-9)
    plot_w = WIDTH - MARGIN_LEFT - 8
    plot_h = HEIGHT - MARGIN_BOTTOM - MARGIN_TOP
    y0 = HEIGHT - MARGIN_BOTTOM
    bar_w = plot_w / (span * per_decade) - 1
    total = sum(n for _, n in buckets)
    out = _frame(WIDTH, HEIGHT, f"{api} latency ({total} requests)", y_max, "requests")
    for start, n in buckets:
        x = MARGIN_LEFT + (math.log10(start) - math.log10(low)) / span * plot_w
        h = n / y_max * plot_h
        out.append(
            f"<rect x='{x:.1f}' y='{y0 - h:.1f}' width='{max(bar_w, 1):.1f}' height='{h:.1f}' "
            f"fill='{COLORS[0]}'><title>{_fmt(start)} ms: {n}</title></rect>"
        )
    for decade in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1):
        value = 10.0**decade
        if low <= value <= high:
            x = MARGIN_LEFT + (decade - math.log10(low)) / span * plot_w
            out.append(f"<text x='{x:.1f}' y='{y0 + 12}' text-anchor='middle'>{_fmt(value)}</text>")
    out.append(f"<text x='{WIDTH / 2}' y='{HEIGHT - 3}' text-anchor='middle'>ms (log)</text>")
    out.append("</svg>")
    return "".join(out)


def timeline_svg(rows: list[dict[str, Any]]) -> str:
    """Produce and fetch MB/s, and requests/s (own scale), per timeline bucket."""
    if not rows:
        return ""
    width, height = 2 * WIDTH + 10, 200
    seconds = [r["second"] for r in rows]
    widths = [r["width"] or 1.0 for r in rows]
    series = {
        "produce MB/s": [r["produce_bytes"] / w / 1e6 for r, w in zip(rows, widths)],
        "fetch MB/s": [r["fetch_bytes"] / w / 1e6 for r, w in zip(rows, widths)],
    }
    requests = [r["requests"] / w for r, w in zip(rows, widths)]
    y_max = max(max(v) for v in series.values()) or 1.0
    r_max = max(requests) or 1.0
    t_max = max(seconds[-1] + widths[-1], 1.0)
    plot_w = width - MARGIN_LEFT - 50
    plot_h = height - MARGIN_BOTTOM - MARGIN_TOP
    y0 = height - MARGIN_BOTTOM
    out = _frame(width, height, "throughput over time", y_max, "MB/s")

    def x_of(t: float) -> float:
        return MARGIN_LEFT + t / t_max * plot_w

    for color, (name, values) in zip(COLORS, [*series.items(), ("requests/s", requests)]):
        scale = r_max if name == "requests/s" else y_max
        points = " ".join(
            f"{x_of(t + w / 2):.1f},{y0 - v / scale * plot_h:.1f}"
            for t, w, v in zip(seconds, widths, values)
        )
        dash = " stroke-dasharray='4 2'" if name == "requests/s" else ""
        out.append(
            f"<polyline points='{points}' fill='none' stroke='{color}' stroke-width='1.5'{dash}/>"
        )
    legend_x = width - 46
    for i, (color, name) in enumerate(zip(COLORS, [*series, "requests/s"])):
        out.append(
            f"<text x='{MARGIN_LEFT + 8 + i * 110}' y='{MARGIN_TOP + 10}' fill='{color}'>"
            f"{html.escape(name)}</text>"
        )
    out.append(
        f"<text x='{legend_x}' y='{MARGIN_TOP + 4}' fill='{COLORS[2]}'>{_fmt(r_max)} req/s</text>"
    )
    out.append(
        f"<text x='{x_of(t_max):.1f}' y='{y0 + 12}' text-anchor='end'>{_fmt(t_max)} s</text>"
    )
    out.append(f"<text x='{MARGIN_LEFT}' y='{y0 + 12}'>0 s</text>")
    out.append("</svg>")
    return "".join(out)


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = []
        for c in columns:
            value = row.get(c)
            text = _fmt(value) if isinstance(value, float) else str(value)
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


STYLE = """
body{font-family:sans-serif;margin:16px;max-width:1150px}
table{border-collapse:collapse;margin:6px 0 14px}
td,th{border:1px solid #bbb;padding:3px 6px;font-size:12px;vertical-align:top;text-align:left}
code{font-size:11px;word-break:break-all}
.ok{background:#dfd}.bad{background:#fdd}
.plots svg{border:1px solid #ddd;margin:3px}
h1 .PASS{color:#080}h1 .FAIL{color:#c00}
"""


def render_html(report: dict[str, Any]) -> str:
    verdict = "PASS" if report["ok"] else "FAIL"
    rows = []
    for name, check in report["checks"].items():
        status = "ok" if check["violations"] == 0 else f"{check['violations']} violations"
        klass = "ok" if check["violations"] == 0 else "bad"
        examples = "<br>".join(html.escape(json.dumps(e, default=str)) for e in check["examples"])
        by_kind = ", ".join(f"{k}: {n}" for k, n in sorted(check["by_kind"].items()))
        rows.append(
            f"<tr class='{klass}'><td><b>{html.escape(name)}</b></td>"
            f"<td>{html.escape(check['meaning'])}</td><td>{status}</td>"
            f"<td>{html.escape(by_kind)}</td><td><code>{examples}</code></td></tr>"
        )
    warnings = []
    if report.get("frames_dropped_by_capture"):
        warnings.append(
            f"the capture dropped {report['frames_dropped_by_capture']} frames (queue full): "
            "violations may be the capture's, not the broker's"
        )
    if report["facts"].get("undecodable"):
        warnings.append(f"{report['facts']['undecodable']} frames could not be decoded")
    stats = report.get("stats") or {}
    per_decade = stats.get("histogram_buckets_per_decade", 5)
    histograms = "".join(
        histogram_svg(api, buckets, per_decade)
        for api, buckets in sorted(stats.get("latency_histograms_ms", {}).items())
    )
    latency_cols = ["api", "requests", "p50_ms", "p99_ms", "p999_ms", "max_ms"]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>trio-broker verify</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>trio-broker verify: <span class='{verdict}'>{verdict}</span></h1>",
        f"<p>{html.escape(report['capture_dir'])}: {report['frames']} frames, "
        f"{report['acknowledged_batches']} acknowledged produce batches, checked in "
        f"{report['seconds']} s. Facts: "
        + html.escape(", ".join(f"{k} {n}" for k, n in sorted(report["facts"].items())))
        + "</p>",
        "".join(f"<p class='bad'>warning: {html.escape(w)}</p>" for w in warnings),
        "<h2>Checks</h2><table><tr><th>check</th><th>meaning</th><th>result</th>"
        "<th>by kind</th><th>examples</th></tr>" + "".join(rows) + "</table>",
        "<h2>Throughput</h2><div class='plots'>"
        + timeline_svg(stats.get("timeline", []))
        + "</div>",
        "<h2>Latency per API</h2><div class='plots'>" + histograms + "</div>",
        _table(stats.get("latency_by_api", []), latency_cols),
        "<h2>Latency per client</h2>",
        _table(stats.get("latency_by_client", []), ["client_id", *latency_cols]),
        "</body></html>\n",
    ]
    return "".join(parts)


def write_report(report: dict[str, Any], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (directory / "report.html").write_text(render_html(report))
