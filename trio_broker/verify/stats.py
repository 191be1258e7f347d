"""Traffic statistics for the verify report: latency percentiles and a throughput timeline.

Not checks (nothing here is a violation): Spark SQL over the ``frames`` view
(capture rows without the frame bytes), pairing a request with its response on
(run, connection, correlation id) once (two small queries read the pairs), then the
client names with each capture's time span in one scan and the throughput timeline in
one more: three scans of the capture rows, each grouped by capture (``cap``: one job
may hold several captures, each with its own statistics). Latency is the capture's
view: from decoding the request to encoding its response on the broker (for a
pcap import, first request byte to last response byte).
"""

from __future__ import annotations

from typing import Any

from trio_broker.protocol.messages import API_KEY_NAMES as API_NAMES
from trio_broker.protocol.messages import ApiKey

#: Latency histogram buckets: this many per decade of milliseconds (log scale).
BUCKETS_PER_DECADE = 5
#: The throughput timeline has at most this many buckets (at least one second wide).
TIMELINE_BUCKETS = 120
#: Rows kept of the per-client latency table.
CLIENT_ROWS = 40


#: A client id as a number: aggregating a string (max) makes Spark fall back from its hash
#: aggregation to sorting, several times slower; names come back from :data:`CLIENT_NAMES`.
def client_key(column: str = "client_id") -> str:
    """SQL for the number standing for the client id in ``column``."""
    return f"xxhash64(coalesce({column}, ''))"


#: Each capture's client ids (their numbers and names) and the first and last wall time
#: of each: the client names and the timeline's span in one scan of the frames (grouped
#: by the string itself, whose hash aggregation keeps no string buffer).
CLIENTS_AND_SPAN = f"""
    SELECT cap, {client_key()} AS client, coalesce(client_id, '') AS name, t0, t1 FROM (
      SELECT cap, client_id, min(wall_ns) AS t0, max(wall_ns) AS t1
      FROM frames GROUP BY cap, client_id
    )
"""

#: Requests paired with their responses. One aggregation over the frames instead of a
#: self-join (which shuffled and sorted both sides): a (run, connection, correlation id,
#: API) key seen once in each direction is a pair; the rare keys seen more often (a reused
#: correlation id) are paired as the join would, every request with every response, by
#: joining only the frames of those keys.
LATENCY_PAIRS = f"""
    WITH k AS (
      SELECT cap, run, connection_id, correlation_id, api_key,
             count_if(direction = 'request') AS requests,
             count_if(direction = 'response') AS responses,
             max(CASE WHEN direction = 'request' THEN monotonic_ns END) AS q_ns,
             max(CASE WHEN direction = 'response' THEN monotonic_ns END) AS p_ns,
             max(CASE WHEN direction = 'request' THEN {client_key()} END) AS client
      FROM frames GROUP BY cap, run, connection_id, correlation_id, api_key
    ),
    many AS (
      SELECT run, connection_id, correlation_id, api_key FROM k
      WHERE requests > 0 AND responses > 0 AND (requests > 1 OR responses > 1)
    ),
    f AS (SELECT /*+ BROADCAST(m) */ f.* FROM frames f
          LEFT SEMI JOIN many m
            ON f.run = m.run AND f.connection_id = m.connection_id
           AND f.correlation_id = m.correlation_id AND f.api_key = m.api_key)
    SELECT cap, api_key, client, CAST((p_ns - q_ns) / 1e6 AS DOUBLE) AS ms
    FROM k WHERE requests = 1 AND responses = 1
    UNION ALL
    SELECT q.cap, q.api_key, {client_key("q.client_id")} AS client,
           CAST((p.monotonic_ns - q.monotonic_ns) / 1e6 AS DOUBLE) AS ms
    FROM f q JOIN f p
      ON q.direction = 'request' AND p.direction = 'response' AND q.run = p.run
     AND q.connection_id = p.connection_id AND q.correlation_id = p.correlation_id
     AND q.cap = p.cap AND q.api_key = p.api_key
"""

_PERCENTILES = """
    count(*) AS requests,
    percentile_approx(ms, array(0.5, 0.99, 0.999), 10000) AS p,
    max(ms) AS max_ms
"""

#: Percentiles per API and per (client id, API) in one pass over the latency table.
LATENCY_GROUPS = f"""
    SELECT grouping(client) AS per_api, cap, client, api_key, {_PERCENTILES}
    FROM latency GROUP BY GROUPING SETS ((cap, api_key), (cap, client, api_key))
"""

LATENCY_HISTOGRAM = f"""
    SELECT cap, api_key, floor(log10(greatest(ms, 0.001)) * {BUCKETS_PER_DECADE}) AS bucket,
           count(*) AS n
    FROM latency GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
"""

#: ``{span}``: each capture's (cap, first, last wall time), from :data:`CLIENTS_AND_SPAN`
#: (as literals: the frames are not scanned again to find them).
TIMELINE = f"""
    WITH span AS (SELECT * FROM (VALUES {{span}}) AS s(cap, t0, t1)),
    w AS (SELECT cap, t0,
                 CAST(greatest(1, ceil((t1 - t0) / 1e9 / {TIMELINE_BUCKETS})) AS DOUBLE) AS width
          FROM span)
    SELECT f.cap, CAST(floor((f.wall_ns - w.t0) / 1e9 / w.width) * w.width AS DOUBLE) AS second,
           first(w.width) AS width,
           CAST(sum(CASE WHEN f.direction = 'request' THEN 1 ELSE 0 END) AS BIGINT) AS requests,
           sum(CASE WHEN f.api_key = {ApiKey.PRODUCE} AND f.direction = 'request'
                    THEN f.frame_length ELSE 0 END) AS produce_bytes,
           sum(CASE WHEN f.api_key = {ApiKey.FETCH} AND f.direction = 'response'
                    THEN f.frame_length ELSE 0 END) AS fetch_bytes
    FROM frames f JOIN w ON w.cap = f.cap GROUP BY 1, 2 ORDER BY 1, 2
"""


def api_name(key: int) -> str:
    return API_NAMES.get(key, f"api_{key}")


def _latency_row(row: Any, clients: dict[int, str] | None = None) -> dict[str, Any]:
    p = row["p"] or [None, None, None]
    out = {
        "api_key": row["api_key"], "api": api_name(row["api_key"]), "requests": row["requests"],
        "p50_ms": p[0], "p99_ms": p[1], "p999_ms": p[2], "max_ms": row["max_ms"],
    }  # fmt: skip
    if clients is not None:
        out = {"client_id": clients.get(row["client"], ""), **out}
    return out


def traffic_stats(spark: Any, captures: int = 1) -> list[dict[str, Any]]:
    """Needs the ``frames`` view; registers ``latency``. Returns plain JSON-able data,
    one entry per capture (``cap`` 0 to ``captures - 1``).

    The request/response pairing (the one shuffle of all frames here) runs once: its
    small result is cached for the percentile and histogram queries.
    """
    latency = spark.sql(LATENCY_PAIRS).cache()
    latency.createOrReplaceTempView("latency")
    try:
        groups = spark.sql(LATENCY_GROUPS).collect()
        buckets = spark.sql(LATENCY_HISTOGRAM).collect()
    finally:
        spark.catalog.dropTempView("latency")
        latency.unpersist()
    clients: dict[int, str] = {}
    span: dict[int, tuple[int | None, int | None]] = {}
    for r in spark.sql(CLIENTS_AND_SPAN).collect():
        clients[r["client"]] = r["name"]
        t0, t1 = span.get(r["cap"], (None, None))
        span[r["cap"]] = (_extreme(min, t0, r["t0"]), _extreme(max, t1, r["t1"]))
    timeline = spark.sql(TIMELINE.format(span=_span_rows(span))).collect() if span else []
    return [
        _capture_stats(
            [r for r in groups if r["cap"] == cap],
            clients,
            [r for r in buckets if r["cap"] == cap],
            [r for r in timeline if r["cap"] == cap],
        )
        for cap in range(captures)
    ]


def _extreme(pick: Any, a: int | None, b: int | None) -> int | None:
    """``pick`` (min or max) of two wall times, either of which may be missing (NULL)."""
    return b if a is None else a if b is None else pick(a, b)


def _span_rows(span: dict[int, tuple[int | None, int | None]]) -> str:
    """The rows of TIMELINE's ``span`` as SQL literals."""

    def literal(value: int | None) -> str:
        return "CAST(NULL AS BIGINT)" if value is None else f"{value}L"

    return ", ".join(
        f"({cap}, {literal(t0)}, {literal(t1)})" for cap, (t0, t1) in sorted(span.items())
    )


def _capture_stats(
    groups: list[Any], clients: dict[int, str], buckets: list[Any], timeline: list[Any]
) -> dict[str, Any]:
    by_api = sorted(
        (_latency_row(r) for r in groups if r["per_api"]),
        key=lambda r: r["api_key"],
    )
    by_client = sorted(
        (_latency_row(r, clients) for r in groups if not r["per_api"]),
        key=lambda r: (-r["requests"], r["client_id"], r["api_key"]),
    )[:CLIENT_ROWS]
    histograms: dict[str, list[list[float]]] = {}
    for r in buckets:
        low = 10 ** (r["bucket"] / BUCKETS_PER_DECADE)
        histograms.setdefault(api_name(r["api_key"]), []).append([low, r["n"]])
    return {
        "latency_by_api": by_api,
        "latency_by_client": by_client,
        "latency_histograms_ms": histograms,
        "histogram_buckets_per_decade": BUCKETS_PER_DECADE,
        "timeline": [{k: v for k, v in r.asDict().items() if k != "cap"} for r in timeline],
    }
