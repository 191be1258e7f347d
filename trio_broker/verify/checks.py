"""The checks of ``trio-broker verify``: Spark SQL over the decoded facts, nothing else.

Each check runs once (:data:`CHECKS`), over views built from the facts (:data:`VIEWS`),
all of them in one query (:func:`all_checks_sql`). Fact kinds are numbers in Spark (see
:mod:`~trio_broker.verify.compact`): the SQL names kinds as ``{produce_ack}``-style
placeholders, filled in by :func:`sql`. Text only: the Spark session, the decoding and
the report are :mod:`trio_broker.verify.job`'s.
"""

from __future__ import annotations

from trio_broker.verify.compact import KIND_CODE

__all__ = [
    "CHECKS",
    "CO_PARTITIONED",
    "EXAMPLES",
    "MATERIALIZED",
    "NEEDS",
    "VIEWS",
    "all_checks_sql",
    "captures_view_sql",
    "checks_to_run",
    "named_view_sql",
    "run_brokers_view_sql",
    "sql",
]

#: Examples kept per violation kind in the summary and the report.
EXAMPLES = 5

#: Views built from the facts before the checks run (name -> SQL). Every row carries
#: ``cap``, the capture it comes from (see :func:`named_view_sql`), and every join,
#: aggregation and window below is keyed by it: one job may check several captures,
#: and a fact of one must never meet a fact of another.
VIEWS: dict[str, str] = {
    # ``named`` (the facts with topic ids resolved to names, ``tname``) comes first: see
    # named_view_sql.
    # The facts of every kind but the six a capture holds by the million (a Produce's
    # batches and answers, a Fetch's), in one table cached before the checks: they read
    # these kinds in about twenty places, and each read of ``named`` scanned all of the
    # facts for a few rows (0.5 CPU s at 1M frames against 0.2 here, warm).
    "sparse": """
        SELECT * FROM named
        WHERE kind NOT IN ({produce_batch}, {produce_ack}, {fetch_part}, {fetch_batch},
                           {fetch_request}, {fetch_isolation})
    """,
    # The batches of every Fetch response, in one table cached before the checks (as the
    # facts, hash-partitioned by topic and partition: a filter keeps that): six views and
    # checks read them, and each such read of ``named`` scanned all of the facts for the
    # third of them that are fetched batches.
    "fetch_batches": "SELECT * FROM named WHERE kind = {fetch_batch}",
    # Acknowledged produce batches: request batch joined to its response partition.
    "acked": """
        SELECT b.cap, b.run, b.conn, b.corr, b.tname AS topic, b.partition,
               a.offset + b.idx AS base_offset, b.crc, b.record_count,
               b.producer_id, b.producer_epoch, b.base_sequence, a.ts AS ack_ts, b.attributes,
               b.ts AS req_ts
        FROM named b JOIN named a
          ON a.kind = {produce_ack} AND b.kind = {produce_batch} AND a.error = 0
         AND a.cap = b.cap AND a.run = b.run AND a.conn = b.conn AND a.corr = b.corr
         AND a.tname = b.tname AND a.partition = b.partition
    """,
    # The log as fetches saw it: one row per distinct (partition, offset, crc).
    "fetched": """
        SELECT cap, tname AS topic, partition, offset AS base_offset, last_offset, crc,
               producer_id, base_sequence, count(*) AS times_fetched
        FROM fetch_batches
        GROUP BY cap, tname, partition, offset, last_offset, crc, producer_id, base_sequence
    """,
    "fetched_extent": """
        SELECT cap, topic, partition, max(last_offset) AS max_fetched FROM fetched
        GROUP BY cap, topic, partition
    """,
    "fetch_requests": """
        SELECT cap, run, conn, corr, min(ts) AS req_ts FROM named
        WHERE kind = {fetch_request} GROUP BY cap, run, conn, corr
    """,
    # Fetch response partitions (every error: each check picks its own), each with the
    # time its request arrived. Cached, and hash-partitioned by (topic, partition) as the
    # facts are (see job.CO_PARTITIONED): three checks read it, each of which joined the
    # fetch facts with the requests again (a scan, an aggregation and two shuffles each),
    # and their windows over (topic, partition, ...) then sort it without a shuffle.
    "fetch_parts": """
        SELECT p.cap, p.run, p.conn, p.corr, p.tname AS topic, p.partition, p.error,
               p.offset AS hw, p.last_offset AS lso, p.ts AS resp_ts, r.req_ts
        FROM named p JOIN fetch_requests r
          ON p.cap = r.cap AND p.run = r.run AND p.conn = r.conn AND p.corr = r.corr
        WHERE p.kind = {fetch_part}
    """,
    # Per fetch (error NONE), the highest high watermark and last stable offset that
    # fetches completed before its request was sent had shown, by the same broker run:
    # one window (one sort of the fetches) for high_watermark_monotonic and
    # last_stable_offset, which sorted them each. Each fetch is two events: its response
    # (ord 1, what it showed) and its request (ord 0, judged: only those rows are kept).
    # A negative LSO (none given) counts as none.
    "fetch_seen": """
        WITH parts AS (
          SELECT cap, run, conn, corr, topic, partition, resp_ts, req_ts, hw,
                 CASE WHEN lso >= 0 THEN lso END AS lso
          FROM fetch_parts WHERE error = 0
        ),
        events AS (
          SELECT cap, run, topic, partition, resp_ts AS t, 1 AS ord, hw, lso,
                 CAST(NULL AS BIGINT) AS conn, CAST(NULL AS INT) AS corr,
                 CAST(NULL AS BIGINT) AS own_hw, CAST(NULL AS BIGINT) AS own_lso
          FROM parts
          UNION ALL
          SELECT cap, run, topic, partition, req_ts, 0, NULL, NULL, conn, corr, hw, lso
          FROM parts
        )
        SELECT cap, run, topic, partition, t, ord, conn, corr, own_hw, own_lso,
               max_hw_before, max_lso_before
        FROM (
          SELECT *, max(hw) OVER w AS max_hw_before, max(lso) OVER w AS max_lso_before
          FROM events
          WINDOW w AS (PARTITION BY cap, run, topic, partition ORDER BY t, ord
                       ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
        ) WHERE ord = 0
    """,
    # Transactions ended by their producer: EndTxn requests answered with error NONE.
    "txn_ends": """
        SELECT r.cap, r.run, r.conn, r.corr, r.producer_id, r.producer_epoch, r.committed,
               r.note AS transactional_id, r.ts AS end_ts
        FROM sparse r JOIN sparse a
          ON r.kind = {end_txn} AND a.kind = {end_txn_ack} AND a.error = 0
         AND a.cap = r.cap AND a.run = r.run AND a.conn = r.conn AND a.corr = r.corr
    """,
    # Acknowledged transactional batches (attribute bit 0x10), each with the transaction
    # that ends it: the first EndTxn of its producer id and epoch received after its ack
    # (a producer ends a transaction only once its produce requests are answered). One
    # window over the producer's acks and ends, so long-lived producers cost no join
    # between every ack and every end. end_ts and committed are NULL while it is open.
    # The window runs backwards in time (the ends at or after an ack are the rows up to
    # it): Spark computes a frame reaching UNBOUNDED FOLLOWING again for every row, which
    # was quadratic in a producer's batches.
    "txn_batches": """
        WITH ev AS (
          SELECT cap, run, topic, partition, base_offset, producer_id, producer_epoch,
                 ack_ts AS t, 1 AS ord,
                 CAST(NULL AS STRUCT<ts: BIGINT, committed: INT, conn: BIGINT, corr: INT,
                                     tid: STRING>) AS e
          FROM acked WHERE (attributes & 16) <> 0
          UNION ALL
          SELECT cap, run, CAST(NULL AS BIGINT), CAST(NULL AS INT), CAST(NULL AS BIGINT),
                 producer_id, producer_epoch, end_ts, 0,
                 named_struct('ts', end_ts, 'committed', committed, 'conn', conn,
                              'corr', corr, 'tid', transactional_id)
          FROM txn_ends
        ),
        nx AS (
          SELECT *, min(e) OVER (PARTITION BY cap, run, producer_id, producer_epoch
                                 ORDER BY t DESC, ord DESC
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS nxt
          FROM ev
        )
        SELECT DISTINCT cap, run, topic, partition, base_offset, producer_id, producer_epoch,
               nxt.ts AS end_ts, nxt.committed AS committed, nxt.conn AS end_conn,
               nxt.corr AS end_corr, nxt.tid AS transactional_id
        FROM nx WHERE ord = 1
    """,
    # Fetch response partitions (error NONE) answering read_committed Fetch requests.
    # Cached (few rows, none without read_committed consumers), so that rc_batches, gated
    # by it, is planned away when there are none: empty, its joins of every fetched batch
    # still cost about 8 CPU s at 1M frames.
    "rc_parts": """
        SELECT p.cap, p.run, p.conn, p.corr, p.tname AS topic, p.partition, p.offset AS hw,
               p.last_offset AS lso, p.ts AS resp_ts
        FROM named p JOIN named i
          ON p.kind = {fetch_part} AND i.kind = {fetch_isolation} AND i.isolation_level = 1
         AND p.error = 0 AND i.cap = p.cap AND i.run = p.run AND i.conn = p.conn
         AND i.corr = p.corr
    """,
    # The batches of those partitions; ``hidden``: the response's aborted-transaction list
    # tells the consumer to drop it, as Kafka's consumer reads the list: the batch's
    # producer has an entry with first offset at or below it, and no control batch
    # (the abort marker) of that producer lies between that entry and the batch.
    "rc_batches": """
        WITH b AS (
          SELECT b.cap, b.run, b.conn, b.corr, b.tname AS topic, b.partition,
                 b.offset AS base_offset, b.last_offset, b.producer_id, b.attributes, p.lso
          FROM fetch_batches b JOIN rc_parts p
            ON b.cap = p.cap AND b.run = p.run AND b.conn = p.conn
           AND b.corr = p.corr AND b.tname = p.topic AND b.partition = p.partition
          WHERE {has_rc_parts}
        ),
        entry AS (
          SELECT b.cap, b.run, b.conn, b.corr, b.topic, b.partition, b.base_offset,
                 max(a.offset) AS first_offset
          FROM b JOIN sparse a
            ON a.kind = {fetch_aborted} AND a.cap = b.cap AND a.run = b.run
           AND a.conn = b.conn AND a.corr = b.corr AND a.tname = b.topic
           AND a.partition = b.partition AND a.producer_id = b.producer_id
           AND a.offset <= b.base_offset
          WHERE (b.attributes & 32) = 0
          GROUP BY b.cap, b.run, b.conn, b.corr, b.topic, b.partition, b.base_offset
        ),
        ended AS (
          SELECT e.cap, e.run, e.conn, e.corr, e.topic, e.partition, e.base_offset,
                 count(c.base_offset) AS markers
          FROM entry e JOIN b d
            ON d.cap = e.cap AND d.run = e.run AND d.conn = e.conn AND d.corr = e.corr
           AND d.topic = e.topic AND d.partition = e.partition AND d.base_offset = e.base_offset
          LEFT JOIN b c
            ON c.cap = e.cap AND c.run = e.run AND c.conn = e.conn AND c.corr = e.corr
           AND c.topic = e.topic AND c.partition = e.partition AND (c.attributes & 32) <> 0
           AND c.producer_id = d.producer_id
           AND c.base_offset >= e.first_offset AND c.base_offset < e.base_offset
          GROUP BY e.cap, e.run, e.conn, e.corr, e.topic, e.partition, e.base_offset
        )
        SELECT b.*, coalesce(x.markers = 0, false) AS hidden
        FROM b LEFT JOIN ended x
          ON x.cap = b.cap AND x.run = b.run AND x.conn = b.conn AND x.corr = b.corr
         AND x.topic = b.topic AND x.partition = b.partition AND x.base_offset = b.base_offset
    """,
}

#: Views cached before the checks run (each is read by several checks), in the order of
#: :data:`VIEWS`: each is kept as it is made, and the views after it read the kept table;
#: a view's ``{has_...}`` gates know the kinds and the views made before it.
MATERIALIZED = (
    "sparse",
    "fetch_batches",
    "acked",
    "fetched",
    "fetch_parts",
    "fetch_seen",
    "txn_batches",
    "rc_parts",
    "rc_batches",
)
#: Materialized views hash-partitioned by (topic, partition) before they are cached, as
#: the facts are (a view that is a join on other keys would otherwise keep those).
CO_PARTITIONED = ("fetch_parts",)

#: Each check once: name -> (what a violation means, SQL returning one row per violation
#: with a ``violation`` kind column and the ``cap`` it was found in).
CHECKS: dict[str, tuple[str, str]] = {
    "acked_produce_fetched": (
        "every acknowledged produce batch is fetched at its acknowledged offset with the same "
        "CRC, exactly once",
        """
        WITH m AS (
          SELECT a.cap, a.run, a.conn, a.corr, a.topic, a.partition,
                 CASE WHEN f.crc = a.crc THEN 1 ELSE 0 END AS at_offset,
                 CASE WHEN f.crc <> a.crc THEN 1 ELSE 0 END AS other_at_offset,
                 0 AS elsewhere
          FROM acked a JOIN fetched f
            ON f.cap = a.cap AND f.topic = a.topic AND f.partition = a.partition
           AND f.base_offset = a.base_offset
          UNION ALL
          SELECT a.cap, a.run, a.conn, a.corr, a.topic, a.partition, 0, 0, 1
          -- The same batch elsewhere: CRC, size and producer fields all equal (a CRC alone
          -- is 32 bits: a million batches hold about a hundred colliding pairs).
          FROM acked a JOIN fetched f
            ON f.cap = a.cap AND f.topic = a.topic AND f.partition = a.partition
           AND f.crc = a.crc AND f.base_offset <> a.base_offset
           AND f.last_offset - f.base_offset = a.record_count - 1
           AND f.producer_id <=> a.producer_id AND f.base_sequence <=> a.base_sequence
        ),
        agg AS (
          SELECT cap, run, conn, corr, topic, partition, sum(at_offset) AS at_offset,
                 sum(other_at_offset) AS other_at_offset, sum(elsewhere) AS elsewhere
          FROM m GROUP BY cap, run, conn, corr, topic, partition
        ),
        j AS (
          SELECT a.*, coalesce(g.at_offset, 0) AS at_offset,
                 coalesce(g.other_at_offset, 0) AS other_at_offset,
                 coalesce(g.elsewhere, 0) AS elsewhere
          FROM acked a
          JOIN fetched_extent e
            ON a.cap = e.cap AND a.topic = e.topic AND a.partition = e.partition
           AND e.max_fetched >= a.base_offset
          LEFT JOIN agg g
            ON a.cap = g.cap AND a.run = g.run AND a.conn = g.conn AND a.corr = g.corr
           AND a.topic = g.topic AND a.partition = g.partition
        )
        SELECT cap, CASE
                 WHEN at_offset = 0 AND other_at_offset = 0 AND elsewhere = 0 THEN 'ack_missing'
                 WHEN at_offset = 0 AND elsewhere > 0 THEN 'ack_moved'
                 WHEN other_at_offset > 0 THEN 'ack_crc_mismatch'
                 ELSE 'ack_duplicated' END AS violation,
               topic, partition, base_offset, crc, record_count, producer_id, base_sequence,
               at_offset, other_at_offset, elsewhere
        FROM j WHERE NOT (at_offset = 1 AND other_at_offset = 0 AND elsewhere = 0)
        """,
    ),
    "fetched_batches_agree": (
        "per partition, no two different batches were fetched at one offset",
        """
        SELECT cap, 'fetch_conflict' AS violation, topic, partition, base_offset,
               count(DISTINCT crc) AS distinct_crcs, collect_set(crc) AS crcs
        FROM fetched GROUP BY cap, topic, partition, base_offset
        HAVING count(DISTINCT crc) > 1
        """,
    ),
    "fetch_response_contiguous": (
        "within each fetch response partition, batches have increasing, contiguous offsets",
        """
        WITH w AS (
          SELECT cap, run, conn, corr, tname AS topic, partition, idx, offset AS base_offset,
                 lag(last_offset) OVER (PARTITION BY cap, run, conn, corr, tname, partition
                                        ORDER BY idx) AS prev_last
          FROM fetch_batches
        )
        SELECT cap, CASE WHEN base_offset <= prev_last THEN 'fetch_out_of_order'
                    ELSE 'fetch_gap' END AS violation,
               topic, partition, run, conn, corr, idx, prev_last, base_offset
        FROM w WHERE prev_last IS NOT NULL AND base_offset <> prev_last + 1
        """,
    ),
    "high_watermark_monotonic": (
        "per partition, a fetch never reports a high watermark lower than one already "
        "returned by a fetch that completed before it was sent: by the same broker run, or, "
        "across brokers and runs, in the same leader epoch",
        """
        WITH parts AS (
          SELECT cap, run, conn, corr, topic, partition, hw, resp_ts, req_ts
          FROM fetch_parts WHERE error = 0
        ),
        -- Each fetch's request (ord 0) with the highest HW shown before it (fetch_seen).
        seen AS (
          SELECT cap, run, topic, partition, t, ord, conn, corr, own_hw,
                 max_hw_before AS max_before
          FROM fetch_seen
        ),
        -- The epoch a fetch was answered in: the last one its broker's own Metadata answers
        -- (same run) named it leader in before the request. A broker's view of its epoch
        -- only grows within a run, so this is never above the true one.
        terms AS (
          SELECT l.cap, l.run, l.tname AS topic, l.partition, l.ts AS t, 0 AS ord,
                 l.leader_epoch AS epoch, NULL AS conn, NULL AS corr
          FROM sparse l JOIN run_brokers b
            ON b.cap = l.cap AND b.run = l.run AND b.broker_id = l.leader_id
          WHERE l.kind = {partition_leader}
          UNION ALL
          -- Only runs of a cluster's captures (run_brokers) have terms: elsewhere no fetch
          -- has an epoch, and with no cluster in the job this whole part is planned away.
          SELECT s.cap, s.run, s.topic, s.partition, s.t, 1 AS ord, NULL, s.conn, s.corr
          FROM seen s LEFT SEMI JOIN run_brokers b ON b.cap = s.cap AND b.run = s.run
          WHERE s.ord = 0
        ),
        in_epoch AS (
          SELECT cap, run, topic, partition, conn, corr,
                 last(epoch, true) OVER (PARTITION BY cap, run, topic, partition
                                         ORDER BY t, ord
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
                   AS epoch, ord
          FROM terms
        ),
        -- Fetches with a known epoch, each as its request (ord 0, its own HW) and its
        -- response (ord 1, the HW it showed), across all runs of the partition.
        dated AS (
          SELECT s.*, e.epoch FROM seen s JOIN in_epoch e
            ON e.ord = 1 AND s.ord = 0 AND e.cap = s.cap AND e.run = s.run AND e.conn = s.conn
           AND e.corr = s.corr AND e.topic = s.topic AND e.partition = s.partition
          WHERE e.epoch IS NOT NULL
        ),
        across AS (
          SELECT cap, run, topic, partition, t, 0 AS ord, epoch, NULL AS hw, conn, corr,
                 own_hw, max_before AS run_max
          FROM dated
          UNION ALL
          SELECT d.cap, d.run, d.topic, d.partition, p.resp_ts, 1, d.epoch, p.hw, NULL, NULL,
                 NULL, NULL
          FROM dated d JOIN parts p
            ON p.cap = d.cap AND p.run = d.run AND p.conn = d.conn AND p.corr = d.corr
           AND p.topic = d.topic AND p.partition = d.partition
        ),
        -- In its epoch: the highest HW shown before it, by whichever run. Across epochs
        -- nothing: a new leader's Fetch answers show its own HW, which may lag what its
        -- predecessor showed until the followers report (Kafka's behaviour; KIP-207 hides
        -- it only from ListOffsets, as replication/leader.py's visible_high_watermark).
        per_epoch AS (
          SELECT *, max(hw) OVER (PARTITION BY cap, topic, partition, epoch ORDER BY t, ord
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS own_max
          FROM across
        ),
        judged AS (
          SELECT r.cap, r.run, r.conn, r.corr, r.topic, r.partition, r.epoch, r.own_hw,
                 r.run_max, r.own_max AS max_before
          FROM per_epoch r
          WHERE r.ord = 0
        )
        SELECT cap, 'high_watermark_backwards' AS violation, topic, partition, run, conn, corr,
               own_hw AS high_watermark, max_before AS earlier_high_watermark,
               CAST(NULL AS INT) AS leader_epoch
        FROM seen WHERE ord = 0 AND max_before IS NOT NULL AND own_hw < max_before
        UNION ALL
        -- Only what the per-run rule above did not already report.
        SELECT cap, 'high_watermark_backwards_across_brokers', topic, partition, run, conn,
               corr, own_hw, max_before, epoch
        FROM judged
        WHERE max_before IS NOT NULL AND own_hw < max_before
          AND NOT coalesce(own_hw < run_max, false)
        """,
    ),
    "one_leader_per_epoch": (
        "per partition and leader epoch, at most one broker acknowledged writes (a write's "
        "epoch is the one stamped on the batch fetched at its offset) and Metadata answers "
        "name at most one leader",
        """
        WITH stamped AS (
          SELECT DISTINCT cap, tname AS topic, partition, offset AS base_offset, crc,
                 leader_epoch
          FROM fetch_batches WHERE leader_epoch >= 0
        ),
        -- A new leader acknowledges an idempotent producer's retry as a duplicate of what
        -- the old leader appended, stamped with the old epoch (the first send may be lost
        -- with a killed broker's capture): such an acknowledgement counts for its broker
        -- only when that broker's own Metadata answers named it leader in that epoch.
        claimed AS (
          SELECT DISTINCT l.cap, l.tname AS topic, l.partition, l.leader_epoch, l.leader_id
          FROM sparse l JOIN run_brokers r
            ON r.cap = l.cap AND r.run = l.run AND r.broker_id = l.leader_id
          WHERE l.kind = {partition_leader}
        ),
        writes AS (
          SELECT a.cap, a.topic, a.partition, s.leader_epoch, r.broker_id,
                 min(a.base_offset) AS first_offset, max(a.base_offset) AS last_offset,
                 count(*) AS batches
          FROM acked a
          JOIN stamped s
            ON s.cap = a.cap AND s.topic = a.topic AND s.partition = a.partition
           AND s.base_offset = a.base_offset AND s.crc = a.crc
          JOIN run_brokers r ON r.cap = a.cap AND r.run = a.run
          LEFT JOIN claimed c
            ON c.cap = a.cap AND c.topic = a.topic AND c.partition = a.partition
           AND c.leader_epoch = s.leader_epoch AND c.leader_id = r.broker_id
          WHERE a.producer_id < 0 OR c.leader_id IS NOT NULL
          GROUP BY a.cap, a.topic, a.partition, s.leader_epoch, r.broker_id
        ),
        named_leaders AS (
          SELECT DISTINCT cap, tname AS topic, partition, leader_epoch, leader_id
          FROM sparse WHERE kind = {partition_leader}
        )
        SELECT cap, 'two_brokers_acked_in_epoch' AS violation, topic, partition, leader_epoch,
               sort_array(collect_list(broker_id)) AS brokers,
               sort_array(collect_list(named_struct('broker', broker_id, 'first_offset',
                 first_offset, 'last_offset', last_offset, 'batches', batches))) AS writes
        FROM writes GROUP BY cap, topic, partition, leader_epoch HAVING count(*) > 1
        UNION ALL
        SELECT cap, 'two_leaders_named_in_epoch', topic, partition, leader_epoch,
               sort_array(collect_list(leader_id)), NULL
        FROM named_leaders GROUP BY cap, topic, partition, leader_epoch HAVING count(*) > 1
        """,
    ),
    "producer_sequences": (
        "per (producer id, epoch, partition): acknowledged sequences are contiguous, and a "
        "duplicate is answered with the original offset",
        """
        WITH idem AS (SELECT * FROM acked WHERE producer_id >= 0 AND base_sequence >= 0),
        dups AS (
          SELECT cap, 'sequence_duplicate_other_offset' AS violation, topic, partition,
                 producer_id, producer_epoch, base_sequence, collect_set(base_offset) AS offsets,
                 CAST(NULL AS INT) AS expected_sequence
          FROM idem GROUP BY cap, topic, partition, producer_id, producer_epoch, base_sequence
          HAVING count(DISTINCT base_offset) > 1
        ),
        uniq AS (
          SELECT cap, topic, partition, producer_id, producer_epoch, base_sequence,
                 min(base_offset) AS base_offset, max(record_count) AS record_count,
                 min(run) AS run
          FROM idem GROUP BY cap, topic, partition, producer_id, producer_epoch, base_sequence
        ),
        w AS (
          SELECT *, lag(base_sequence) OVER o AS prev_seq, lag(record_count) OVER o AS prev_count,
                 lag(base_offset) OVER o AS prev_offset, lag(run) OVER o AS prev_run
          FROM uniq
          WINDOW o AS (PARTITION BY cap, topic, partition, producer_id, producer_epoch
                       ORDER BY base_sequence)
        ),
        -- Only gaps need explaining: each later step joins these few rows, never every
        -- acknowledged batch (the range join of ``filled`` over all of them was quadratic
        -- in a producer's batches: 89 s of CPU at 1M frames, the 10M capture never ended).
        gaps AS (
          SELECT * FROM w
          WHERE prev_seq IS NOT NULL AND base_sequence <> prev_seq + prev_count
        ),
        -- A gap is excused when the fetched log holds exactly the missing sequences and
        -- their acknowledgement is missing for a reason: across a broker restart (kill -9)
        -- it may have been queued in the tap when the broker died; within a run, the
        -- batch was sent and answered with an error (REQUEST_TIMED_OUT while acks=all
        -- waited for a follower: the batch stays in the log, as in Kafka) or not at all.
        -- ``unacked``: gaps whose first missing batch was sent in a Produce request that
        -- was not acknowledged with it.
        unacked AS (
          SELECT DISTINCT g.cap, g.topic, g.partition, g.producer_id, g.producer_epoch,
                 g.base_sequence
          FROM gaps g JOIN named b
            ON b.kind = {produce_batch} AND b.cap = g.cap AND b.tname = g.topic
           AND b.partition = g.partition AND b.producer_id = g.producer_id
           AND b.producer_epoch = g.producer_epoch
           AND b.base_sequence = g.prev_seq + g.prev_count
          LEFT ANTI JOIN acked a
            ON a.cap = b.cap AND a.run = b.run AND a.conn = b.conn AND a.corr = b.corr
           AND a.topic = b.tname AND a.partition = b.partition
           AND a.base_sequence = b.base_sequence
          WHERE b.producer_id >= 0 AND b.base_sequence >= 0
        ),
        log_seqs AS (
          SELECT DISTINCT cap, tname AS topic, partition, producer_id, producer_epoch,
                 base_sequence, record_count
          FROM fetch_batches WHERE producer_id >= 0 AND base_sequence >= 0
        ),
        filled AS (
          SELECT w.cap, w.topic, w.partition, w.producer_id, w.producer_epoch, w.base_sequence,
                 sum(l.record_count) AS records
          FROM gaps w JOIN log_seqs l
            ON l.cap = w.cap AND l.topic = w.topic AND l.partition = w.partition
           AND l.producer_id = w.producer_id AND l.producer_epoch = w.producer_epoch
           AND l.base_sequence >= w.prev_seq + w.prev_count
           AND l.base_sequence < w.base_sequence
          LEFT JOIN unacked u
            ON u.cap = w.cap AND u.topic = w.topic AND u.partition = w.partition
           AND u.producer_id = w.producer_id AND u.producer_epoch = w.producer_epoch
           AND u.base_sequence = w.base_sequence
          WHERE w.prev_run <> w.run OR u.base_sequence IS NOT NULL
          GROUP BY w.cap, w.topic, w.partition, w.producer_id, w.producer_epoch,
                   w.base_sequence
        )
        SELECT * FROM dups
        UNION ALL
        SELECT w.cap, CASE WHEN w.base_offset <= w.prev_offset THEN 'sequence_offset_order'
                    ELSE 'sequence_gap' END AS violation,
               w.topic, w.partition, w.producer_id, w.producer_epoch, w.base_sequence,
               array(w.prev_offset, w.base_offset) AS offsets,
               CAST(w.prev_seq + w.prev_count AS INT) AS expected_sequence
        FROM w LEFT JOIN filled g
          ON g.cap = w.cap AND g.topic = w.topic AND g.partition = w.partition
         AND g.producer_id = w.producer_id AND g.producer_epoch = w.producer_epoch
         AND g.base_sequence = w.base_sequence
        WHERE w.prev_seq IS NOT NULL
          AND (w.base_offset <= w.prev_offset
               OR (w.base_sequence <> w.prev_seq + w.prev_count
                   AND coalesce(g.records, -1) <> w.base_sequence - w.prev_seq - w.prev_count))
        """,
    ),
    "offset_fetch_current": (
        "an OffsetFetch answered by the broker FindCoordinator last named for the group never "
        "gives an offset that an accepted commit had already replaced: a commit accepted "
        "before the last one accepted ahead of the fetch, with no commit of that offset since "
        "(commits themselves may go down: a client may commit any offset, and librdkafka "
        "resends queued commits after a newer one)",
        """
        WITH c AS (
          SELECT r.cap, r.group_id, r.tname AS topic, r.partition, r.offset, r.ts AS req_ts,
                 a.ts AS ack_ts, a.error AS ack_error
          FROM sparse r LEFT JOIN sparse a
            ON a.kind = {commit_ack} AND a.cap = r.cap AND a.run = r.run AND a.conn = r.conn
           AND a.corr = r.corr AND a.tname = r.tname AND a.partition = r.partition
          WHERE r.kind = {commit_request}
        ),
        f AS (
          SELECT a.cap, a.run, a.conn, a.corr, coalesce(a.group_id, r.group_id) AS group_id,
                 a.tname AS topic, a.partition, a.offset, r.ts AS req_ts, a.ts AS resp_ts
          FROM sparse a JOIN sparse r
            ON a.kind = {offset_fetch_answer} AND r.kind = {offset_fetch_request}
           AND r.cap = a.cap AND r.run = a.run AND r.conn = a.conn AND r.corr = a.corr
           AND (a.group_id IS NULL OR a.group_id = r.group_id)
          WHERE a.error = 0 AND a.offset >= 0
        ),
        -- Who FindCoordinator last named for the group before each fetch arrived: only
        -- that broker's answers are judged (a paused or cut-off broker that has not yet
        -- learnt it lost the group answers from its stale table, in Kafka too).
        coord AS (
          SELECT a.cap, coalesce(a.group_id, r.group_id) AS group_id,
                 a.leader_id AS coordinator, a.ts
          FROM sparse a LEFT JOIN sparse r
            ON r.kind = {coordinator_request} AND r.cap = a.cap AND r.run = a.run
           AND r.conn = a.conn AND r.corr = a.corr
          WHERE a.kind = {coordinator_named}
        ),
        cev AS (
          SELECT cap, group_id, ts AS t, 1 AS ord, coordinator, CAST(NULL AS BIGINT) AS run,
                 CAST(NULL AS BIGINT) AS conn, CAST(NULL AS INT) AS corr
          FROM coord WHERE group_id IS NOT NULL
          UNION ALL
          SELECT DISTINCT cap, group_id, req_ts, 0, CAST(NULL AS INT), run, conn, corr FROM f
        ),
        named_by AS (
          SELECT cap, run, conn, corr, group_id, ord,
                 last(coordinator, true) OVER (PARTITION BY cap, group_id ORDER BY t, ord
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS coordinator
          FROM cev
        ),
        -- (One capture directory has no run_brokers rows: its one broker is judged.)
        judged AS (
          SELECT f.* FROM f
          JOIN named_by n
            ON n.ord = 0 AND n.cap = f.cap AND n.run = f.run AND n.conn = f.conn
           AND n.corr = f.corr AND n.group_id = f.group_id
          LEFT JOIN run_brokers b ON b.cap = f.cap AND b.run = f.run
          WHERE b.broker_id IS NULL OR b.broker_id = n.coordinator
        ),
        -- Accepted commits (at their answer) and judged fetches (at their arrival), in
        -- time order per partition: each fetch sees the last commit accepted before it.
        ev AS (
          SELECT cap, group_id, topic, partition, ack_ts AS t, 1 AS ord,
                 req_ts AS commit_req, offset AS commit_offset, CAST(NULL AS BIGINT) AS run,
                 CAST(NULL AS BIGINT) AS conn, CAST(NULL AS INT) AS corr,
                 CAST(NULL AS BIGINT) AS offset, CAST(NULL AS BIGINT) AS resp_ts
          FROM c WHERE ack_error = 0
          UNION ALL
          SELECT cap, group_id, topic, partition, req_ts, 0, NULL, NULL, run, conn, corr,
                 offset, resp_ts
          FROM judged
        ),
        w AS (
          SELECT *,
                 last(commit_req, true) OVER (PARTITION BY cap, group_id, topic, partition
                   ORDER BY t, ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS since,
                 last(commit_offset, true) OVER (PARTITION BY cap, group_id, topic, partition
                   ORDER BY t, ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                   AS last_accepted
          FROM ev
        ),
        s AS (SELECT * FROM w WHERE ord = 0 AND since IS NOT NULL),
        -- Its offset was committed (whatever the outcome) after the last accepted commit
        -- was sent: it may be the current one. Per offset, backwards in time, the first
        -- commit of it sent at or after ``since`` (a consumer commits the same offset
        -- every few seconds while idle: a join of fetches with those commits, with the
        -- time range as its condition, grew as their product).
        fresh AS (
          SELECT DISTINCT cap, run, conn, corr, group_id, topic, partition FROM (
            SELECT *, min(CASE WHEN ord = 1 THEN t END) OVER (
                        PARTITION BY cap, group_id, topic, partition, offset
                        ORDER BY t DESC, ord DESC
                        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS next_commit
            FROM (
              SELECT cap, group_id, topic, partition, offset, since AS t, 0 AS ord, run,
                     conn, corr, resp_ts
              FROM s
              UNION ALL
              SELECT cap, group_id, topic, partition, offset, req_ts, 1, NULL, NULL, NULL,
                     NULL
              FROM c
            )
            WHERE group_id IS NOT NULL AND topic IS NOT NULL AND partition IS NOT NULL
              AND offset IS NOT NULL
          ) WHERE ord = 0 AND next_commit <= resp_ts
        ),
        -- Its offset is one an accepted commit had replaced. An offset no captured commit
        -- has is not judged: a broker killed with -9 takes the last moments of its
        -- capture with it, and the commits it accepted then are unknown here.
        replaced AS (
          SELECT DISTINCT s.cap, s.run, s.conn, s.corr, s.group_id, s.topic, s.partition
          FROM s JOIN (
            SELECT cap, group_id, topic, partition, offset, min(ack_ts) AS first_ack
            FROM c WHERE ack_error = 0 GROUP BY cap, group_id, topic, partition, offset
          ) a
            ON a.cap = s.cap AND a.group_id = s.group_id AND a.topic = s.topic
           AND a.partition = s.partition AND a.offset = s.offset AND a.first_ack < s.since
        )
        SELECT s.cap, 'offset_fetch_stale' AS violation, s.group_id, s.topic, s.partition,
               s.offset AS fetched_offset, s.last_accepted AS last_accepted_offset,
               s.run, s.conn, s.corr
        FROM s LEFT SEMI JOIN replaced r
          ON r.cap = s.cap AND r.run = s.run AND r.conn = s.conn AND r.corr = s.corr
         AND r.group_id = s.group_id AND r.topic = s.topic AND r.partition = s.partition
        LEFT ANTI JOIN fresh ok
          ON ok.cap = s.cap AND ok.run = s.run AND ok.conn = s.conn AND ok.corr = s.corr
         AND ok.group_id = s.group_id AND ok.topic = s.topic AND ok.partition = s.partition
        """,
    ),
    "group_assignment_exclusive": (
        "per group generation, no partition is assigned to two members",
        """
        WITH a AS (
          SELECT r.cap, r.run, r.group_id, r.generation, r.member_id, s.topic, s.partition
          FROM sparse s JOIN sparse r
            ON s.kind = {sync_assign} AND r.kind = {sync_request}
           AND s.cap = r.cap AND s.run = r.run AND s.conn = r.conn AND s.corr = r.corr
        )
        -- Per run: written when generations started again at 1 after a restart; a
        -- restored group now goes on from its stored generation (kept per run).
        SELECT cap, 'partition_assigned_twice' AS violation, group_id, generation, topic,
               partition, collect_set(member_id) AS members
        FROM a GROUP BY cap, run, group_id, generation, topic, partition
        HAVING count(DISTINCT member_id) > 1
        """,
    ),
    "read_committed_no_aborted": (
        "a read_committed fetch never hands the consumer a record of an aborted transaction "
        "(every such batch it returns is covered by its aborted-transaction list) nor one at "
        "or past its last stable offset",
        """
        SELECT b.cap, 'aborted_batch_returned' AS violation, b.topic, b.partition,
               b.base_offset, b.producer_id, t.transactional_id, b.run, b.conn, b.corr,
               CAST(NULL AS BIGINT) AS last_stable_offset
        FROM rc_batches b JOIN txn_batches t
          ON t.cap = b.cap AND t.run = b.run AND t.topic = b.topic
         AND t.partition = b.partition AND t.base_offset = b.base_offset
         AND t.producer_id = b.producer_id
        WHERE t.committed = 0 AND NOT b.hidden
        UNION ALL
        SELECT cap, 'beyond_last_stable_offset', topic, partition, base_offset, producer_id,
               CAST(NULL AS STRING), run, conn, corr, lso
        FROM rc_batches WHERE lso >= 0 AND last_offset >= lso
        """,
    ),
    "committed_transaction_atomic": (
        "a committed transaction is visible all-or-nothing: each of its batches, on every "
        "partition that read_committed fetches read past it, was returned to one and not "
        "marked aborted",
        """
        WITH extent AS (
          SELECT cap, topic, partition, max(last_offset) AS max_read FROM rc_batches
          GROUP BY cap, topic, partition
        ),
        seen AS (
          SELECT cap, topic, partition, base_offset, producer_id,
                 max(CASE WHEN hidden THEN 0 ELSE 1 END) AS visible,
                 max(CASE WHEN hidden THEN 1 ELSE 0 END) AS hidden
          FROM rc_batches GROUP BY cap, topic, partition, base_offset, producer_id
        )
        SELECT t.cap, CASE WHEN s.base_offset IS NULL THEN 'committed_batch_missing'
                    ELSE 'committed_batch_hidden' END AS violation,
               t.topic, t.partition, t.base_offset, t.producer_id, t.producer_epoch,
               t.transactional_id, t.end_conn, t.end_corr
        FROM txn_batches t
        JOIN extent e ON e.cap = t.cap AND e.topic = t.topic AND e.partition = t.partition
                     AND e.max_read >= t.base_offset
        LEFT JOIN seen s
          ON s.cap = t.cap AND s.topic = t.topic AND s.partition = t.partition
         AND s.base_offset = t.base_offset AND s.producer_id = t.producer_id
        WHERE t.committed = 1 AND (s.base_offset IS NULL OR s.hidden = 1)
        """,
    ),
    "last_stable_offset": (
        "per partition, the last stable offset never exceeds the high watermark, never goes "
        "below one returned by a fetch completed before, and never passes a transaction "
        "still open (no EndTxn received yet, and no marker fetched below it)",
        """
        WITH parts AS (
          SELECT cap, run, conn, corr, topic, partition, hw, lso, resp_ts, req_ts
          FROM fetch_parts WHERE error = 0 AND lso >= 0
        ),
        -- Each fetch's request (ord 0) with the highest LSO shown before it (fetch_seen).
        seen AS (
          SELECT cap, run, topic, partition, t, ord, conn, corr, own_lso,
                 max_lso_before AS max_before
          FROM fetch_seen WHERE own_lso IS NOT NULL
        ),
        -- The responses of partitions (and runs) with transactional batches: only they can
        -- pass an open transaction (a capture without transactions sorts none below).
        txn_parts AS (
          SELECT * FROM parts p LEFT SEMI JOIN (
            SELECT DISTINCT cap, run, topic, partition FROM txn_batches
          ) k ON k.cap = p.cap AND k.run = p.run AND k.topic = p.topic
             AND k.partition = p.partition
          -- (Each read of txn_batches or the markers below is gated by has_txn_batches:
          -- without transactional batches the optimizer drops this whole part.)
          WHERE {has_txn_batches}
        ),
        -- At a response (ord 1): the lowest batch of a transaction whose EndTxn came after
        -- it (ord -1: one ended at the response's time was not open then). Backwards in
        -- time: Spark recomputes a frame reaching UNBOUNDED FOLLOWING for every row.
        ending AS (
          SELECT *, min(open_offset) OVER (PARTITION BY cap, run, topic, partition
                                           ORDER BY t DESC, ord DESC
                                           ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
                      AS open_after
          FROM (
            SELECT cap, run, conn, corr, topic, partition, lso, resp_ts AS t, 1 AS ord,
                   CAST(NULL AS BIGINT) AS open_offset
            FROM txn_parts
            UNION ALL
            SELECT cap, run, NULL, NULL, topic, partition, NULL, end_ts, -1, base_offset
            FROM txn_batches WHERE end_ts IS NOT NULL AND {has_txn_batches}
          )
        ),
        markers AS (
          SELECT DISTINCT cap, tname AS topic, partition, producer_id, offset AS marker_offset
          FROM fetch_batches WHERE (attributes & 32) <> 0 AND {has_txn_batches}
        ),
        -- Transactional batches with no EndTxn in the capture, each with its producer's
        -- first marker fetched above it (NULL: none). Such a batch is open to an LSO in
        -- (base_offset, next_marker]: one the marker does not lie below.
        unended AS (
          SELECT * FROM (
            SELECT cap, run, topic, partition, ord, base_offset,
                   min(marker_offset) OVER (PARTITION BY cap, topic, partition, producer_id
                                            ORDER BY base_offset DESC, ord DESC
                                            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
                     AS next_marker
            FROM (
              SELECT cap, run, topic, partition, producer_id, base_offset, 1 AS ord,
                     CAST(NULL AS BIGINT) AS marker_offset
              FROM txn_batches WHERE end_ts IS NULL AND {has_txn_batches}
              UNION ALL
              SELECT cap, NULL, topic, partition, producer_id, marker_offset, 0,
                     marker_offset
              FROM markers
            )
          ) WHERE ord = 1
        ),
        -- Over the offsets of a partition and run: each response's LSO (ord 0), and the
        -- intervals of LSOs an unended batch is open to (+1 after its offset, -1 after its
        -- next marker); a response whose LSO lies in one (open > 0) passed that batch.
        stabbed AS (
          SELECT *, sum(step) OVER (PARTITION BY cap, run, topic, partition ORDER BY key, ord
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS open
          FROM (
            SELECT cap, run, topic, partition, lso AS key, 0 AS ord, 0 AS step, conn, corr
            FROM txn_parts
            UNION ALL
            SELECT cap, run, topic, partition, base_offset, 1, 1, NULL, NULL FROM unended
            UNION ALL
            SELECT cap, run, topic, partition, next_marker, 2, -1, NULL, NULL FROM unended
            WHERE next_marker IS NOT NULL
          )
        ),
        -- The responses that passed a batch of an open transaction (exactly those that the
        -- last part below reports): joining only these with the transactional batches
        -- keeps that join from growing as fetches x transactional batches.
        suspects AS (
          SELECT cap, run, conn, corr, topic, partition FROM ending
          WHERE ord = 1 AND open_after < lso
          UNION
          SELECT cap, run, conn, corr, topic, partition FROM stabbed
          WHERE ord = 0 AND open > 0
        ),
        passed AS (
          SELECT p.cap, p.run, p.conn, p.corr, p.topic, p.partition, p.lso, t.base_offset,
                 t.producer_id, t.transactional_id, t.end_ts, p.resp_ts
          FROM parts p
          LEFT SEMI JOIN suspects s
            ON s.cap = p.cap AND s.run = p.run AND s.conn = p.conn AND s.corr = p.corr
           AND s.topic = p.topic AND s.partition = p.partition
          JOIN txn_batches t
            ON t.cap = p.cap AND t.run = p.run AND t.topic = p.topic
           AND t.partition = p.partition AND t.base_offset < p.lso
           AND (t.end_ts IS NULL OR t.end_ts > p.resp_ts)
        )
        SELECT cap, 'lso_backwards' AS violation, topic, partition, run, conn, corr,
               own_lso AS last_stable_offset, max_before AS earlier_last_stable_offset,
               CAST(NULL AS BIGINT) AS open_batch_offset, CAST(NULL AS BIGINT) AS producer_id
        FROM seen WHERE ord = 0 AND max_before IS NOT NULL AND own_lso < max_before
        UNION ALL
        SELECT cap, 'lso_above_high_watermark', topic, partition, run, conn, corr, lso, hw,
               NULL, NULL
        FROM parts WHERE lso > hw
        UNION ALL
        SELECT DISTINCT p.cap, 'lso_past_open_transaction', p.topic, p.partition, p.run,
               p.conn, p.corr, p.lso, NULL, p.base_offset, p.producer_id
        FROM passed p LEFT JOIN markers m
          ON m.cap = p.cap AND m.topic = p.topic AND m.partition = p.partition
         AND m.producer_id = p.producer_id
         AND m.marker_offset > p.base_offset AND m.marker_offset < p.lso
        -- An EndTxn received after the response: open then. No EndTxn in the capture (the
        -- coordinator aborted it, or capture ended): open unless its marker was fetched.
        WHERE p.end_ts IS NOT NULL OR m.marker_offset IS NULL
        """,
    ),
    "acked_topic_kept": (
        "a partition never answers with a log end below the end of a batch acknowledged "
        "before the request was sent (a ListOffsets for the latest offset, or, one broker "
        "alone, a Fetch's high watermark), "
        "and a topic with acknowledged batches never comes back with a new topic id (or, "
        "one broker alone, unknown): unless a DeleteTopics request named the topic",
        """
        WITH deleted AS (
          SELECT DISTINCT cap, tname AS topic FROM sparse WHERE kind = {delete_topic}
        ),
        -- One capture directory: one broker, whose Fetch answers and Metadata must know
        -- what it acknowledged. In a cluster a new leader's Fetch HW may lag and a broker
        -- may not know a new topic yet, as in Kafka: there only ListOffsets (KIP-207) and
        -- topic ids count. (``captures``: per capture, whether it is one broker alone.)
        single AS (SELECT cap FROM captures WHERE alone),
        acks AS (
          SELECT a.cap, a.topic, a.partition, a.ack_ts, a.base_offset, a.record_count
          FROM acked a LEFT ANTI JOIN deleted d ON d.cap = a.cap AND d.topic = a.topic
        ),
        -- Answers showing a partition's log end, at the time their request was sent. Not a
        -- Produce's offset: a retry is answered with its first copy's offset, and after a
        -- kill -9 the first copy's request may be missing from the torn capture (seen in
        -- CI's crash loop and Jepsen runs with nothing lost).
        shown AS (
          SELECT r.cap, 'list_offsets' AS answer, r.run, r.conn, r.corr, r.tname AS topic,
                 r.partition, r.ts AS t, a.offset AS log_end
          FROM sparse r JOIN sparse a
            ON r.kind = {list_offsets_request} AND a.kind = {list_offsets_answer}
           AND a.cap = r.cap AND a.run = r.run AND a.conn = r.conn AND a.corr = r.corr
           AND a.tname = r.tname AND a.partition = r.partition
          WHERE r.offset = -1 AND coalesce(r.isolation_level, 0) = 0 AND a.error = 0
            AND a.offset >= 0
          UNION ALL
          SELECT p.cap, 'fetch', p.run, p.conn, p.corr, p.topic, p.partition, p.req_ts,
                 CASE WHEN p.error = 0 THEN p.hw ELSE 0 END
          FROM fetch_parts p LEFT SEMI JOIN single s ON s.cap = p.cap
          WHERE p.error IN (0, 3, 100)
        ),
        ev AS (
          SELECT cap, topic, partition, ack_ts AS t, 1 AS ord,
                 base_offset + record_count AS acked_end, CAST(NULL AS STRING) AS answer,
                 CAST(NULL AS BIGINT) AS run, CAST(NULL AS BIGINT) AS conn,
                 CAST(NULL AS INT) AS corr, CAST(NULL AS BIGINT) AS log_end
          FROM acks
          UNION ALL
          SELECT cap, topic, partition, t, 0, NULL, answer, run, conn, corr, log_end FROM shown
        ),
        lowered AS (
          SELECT *, max(acked_end) OVER (PARTITION BY cap, topic, partition ORDER BY t, ord
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
                    AS acked_before
          FROM ev
        ),
        ids AS (
          SELECT cap, run, conn, corr, tname AS topic, note AS topic_id,
                 lag(note) OVER (PARTITION BY cap, tname ORDER BY ts) AS previous_id
          FROM sparse WHERE kind = {topic_id} AND {has_topic_id}
        ),
        gone AS (
          SELECT cap, 'topic_id_changed' AS violation, run, conn, corr, topic, previous_id,
                 topic_id
          FROM ids WHERE previous_id IS NOT NULL AND previous_id <> topic_id
          UNION ALL
          SELECT u.cap, 'topic_unknown', u.run, u.conn, u.corr, u.tname, NULL, NULL
          FROM sparse u LEFT SEMI JOIN single s ON s.cap = u.cap
          WHERE u.kind = {topic_unknown} AND {has_topic_unknown}
        ),
        -- (With neither kind in the job, the has_topic_id and has_topic_unknown gates let
        -- the optimizer drop this part, and its scan of the capture rows, while planning.)
        -- Dated by their Metadata request (the answer may be captured after acks of
        -- writes the broker handled later).
        gone_at AS (
          SELECT /*+ BROADCAST(g) */ g.*, q.monotonic_ns AS t
          FROM gone g JOIN frames q
            ON q.direction = 'request' AND q.cap = g.cap AND q.run = g.run
           AND q.connection_id = g.conn AND q.correlation_id = g.corr
          LEFT ANTI JOIN deleted d ON d.cap = g.cap AND d.topic = g.topic
        ),
        lost AS (
          SELECT /*+ BROADCAST(g) */ g.cap, g.violation, g.run, g.conn, g.corr, g.topic,
                 g.previous_id, g.topic_id, count(*) AS acked_batches,
                 max(a.base_offset + a.record_count) AS acked_end
          FROM gone_at g JOIN acks a ON a.cap = g.cap AND a.topic = g.topic AND a.ack_ts < g.t
          GROUP BY g.cap, g.violation, g.run, g.conn, g.corr, g.topic, g.previous_id,
                   g.topic_id
        )
        SELECT cap, 'log_end_below_acked' AS violation, topic, partition, answer, log_end,
               acked_before AS acked_end, run, conn, corr, CAST(NULL AS STRING) AS previous_id,
               CAST(NULL AS STRING) AS topic_id, CAST(NULL AS BIGINT) AS acked_batches
        FROM lowered WHERE ord = 0 AND acked_before > log_end
        UNION ALL
        SELECT cap, violation, topic, NULL, 'metadata', NULL, acked_end, run, conn, corr,
               previous_id, topic_id, acked_batches
        FROM lost
        """,
    ),
}


#: What each check's violations are made of: it can report one only where the job holds
#: facts of each of these kinds and rows of each of these materialized views (in any of
#: its captures). :func:`all_checks_sql` leaves out a check whose needs are not met:
#: Spark cannot know while planning that the cached facts hold none of a kind, and such
#: an empty check still cost 4-6 CPU s at 1M frames (every scan of the facts, its
#: shuffles, sorts and generated code). Every violation row of a check comes from an
#: inner join (or a semi join) with each table named here.
NEEDS: dict[str, tuple[str, ...]] = {
    "acked_produce_fetched": ("acked", "fetched"),
    "fetched_batches_agree": ("fetched",),
    "fetch_response_contiguous": ("fetch_batches",),
    "high_watermark_monotonic": ("fetch_seen",),
    "one_leader_per_epoch": (),
    "producer_sequences": ("acked",),
    "offset_fetch_current": (
        "offset_fetch_request",
        "offset_fetch_answer",
        "commit_request",
        "commit_ack",
    ),
    "group_assignment_exclusive": ("sync_request", "sync_assign"),
    "read_committed_no_aborted": ("rc_batches",),
    "committed_transaction_atomic": ("txn_batches", "rc_batches"),
    "last_stable_offset": ("fetch_parts",),
    "acked_topic_kept": ("acked",),
}


def sql(text: str, present: set[str] | None = None) -> str:
    """``text`` with each ``{kind}`` placeholder replaced by that fact kind's code, and
    each ``{has_<kind or view>}`` by whether ``present`` (the fact kinds and materialized
    views the job holds rows of; None: all) has it, ``true`` or ``false``: a part of a
    check that reads nothing but an empty kind can be gated by it in its WHERE, and the
    optimizer then drops the part while planning, where the cached table's emptiness is
    known only once each of its stages has run."""
    gates = {
        f"has_{name}": "true" if present is None or name in present else "false"
        for name in (*KIND_CODE, *MATERIALIZED)
    }
    return text.format_map({**KIND_CODE, **gates})


def run_brokers_view_sql(brokers: list[tuple[int, int, int]]) -> str:
    """The ``run_brokers`` view: (capture, run index, node id of the broker that captured
    the run: the capture rows' ``broker_id``), for the runs of captures of several
    directories (a cluster) only."""
    if not brokers:
        # Empty, and known to be while planning: every join with it is pruned (the checks'
        # parts that date writes and fetches with leader epochs cost nothing then).
        return (
            "SELECT CAST(NULL AS INT) AS cap, CAST(NULL AS INT) AS run, "
            "CAST(NULL AS INT) AS broker_id WHERE false"
        )
    rows = ", ".join(f"({cap}, {run}, {broker})" for cap, run, broker in brokers)
    return f"SELECT * FROM (VALUES {rows}) AS t(cap, run, broker_id)"


def captures_view_sql(alone: list[bool]) -> str:
    """The ``captures`` view: each capture's index and whether it is one broker alone (one
    directory: no ``run_brokers`` rows), which the checks judge by stricter rules."""
    rows = ", ".join(f"({cap}, {str(one).lower()})" for cap, one in enumerate(alone))
    return f"SELECT * FROM (VALUES {rows}) AS t(cap, alone)"


def named_view_sql(topic_ids: list[tuple[int, int, int]], run_caps: list[int]) -> str:
    """The decoded facts with ``cap``, the index of the capture each fact's run belongs to
    (``run_caps[run]``), and ``tname``: the topic's hash, also for facts that name their
    topic by id (Produce v13, Fetch v13+), looked up in the distinct (capture, hash of
    ``id:…``, hash of the name) triples of the Metadata responses. The triples are few: an
    inline table, broadcast, so naming the facts never shuffles them; without any, a
    projection."""
    if len(set(run_caps)) <= 1:
        cap = f"{run_caps[0] if run_caps else 0}"
    else:
        cap = f"element_at(array({', '.join(map(str, run_caps))}), run + 1)"
    with_cap = f"SELECT *, CAST({cap} AS INT) AS cap FROM decoded"
    if not topic_ids:
        return f"SELECT *, topic AS tname FROM ({with_cap})"
    rows = ", ".join(f"({cap}, {key}L, {name}L)" for cap, key, name in topic_ids)
    return f"""
        SELECT /*+ BROADCAST(t) */ f.*, coalesce(t.name, f.topic) AS tname
        FROM ({with_cap}) f LEFT JOIN (VALUES {rows}) AS t(cap, key, name)
          ON f.cap = t.cap AND f.topic = t.key
    """


def checks_to_run(present: set[str] | None = None) -> list[str]:
    """The checks whose :data:`NEEDS` are all in ``present`` (the fact kinds and the
    materialized views the job holds rows of; None: every check)."""
    return [name for name in CHECKS if present is None or all(n in present for n in NEEDS[name])]


def all_checks_sql(present: set[str] | None = None) -> str:
    """Every check in one query (one Spark job): per capture and violation kind, its count
    and examples (the first by their JSON text). One window over the union of the checks'
    violations, not one per check: each window is a shuffle stage, and stages cost time
    even empty. Only the checks that can find a violation with the fact kinds and views
    in ``present`` (:func:`checks_to_run`): the others have none to report."""
    parts = [
        f"SELECT cap, '{name}' AS check_name, violation, to_json(struct(*)) AS example "
        f"FROM ({sql(CHECKS[name][1], present)})"
        for name in checks_to_run(present)
    ]
    if not parts:
        return (
            "SELECT CAST(NULL AS INT) AS cap, '' AS check_name, '' AS violation, "
            "CAST(0 AS BIGINT) AS n, '' AS example WHERE false"
        )
    union = "\nUNION ALL\n".join(parts)
    return f"""
        SELECT cap, check_name, violation, n, example FROM (
          SELECT *, count(*) OVER (PARTITION BY cap, check_name, violation) AS n,
                 row_number() OVER (PARTITION BY cap, check_name, violation
                                    ORDER BY example) AS rn
          FROM ({union})
        ) WHERE rn <= {EXAMPLES}"""
