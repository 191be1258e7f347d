"""A Spark Structured Streaming word count between two trio-broker topics.

Reads records from a source topic through Spark's Kafka connector, counts them per
word (the record's value, or its key with ``--count-by key``) in a stateful streaming
aggregation whose state lives in a checkpoint directory, and writes every changed
count (output mode ``update``) to a sink topic: key = the word, value = its count so
far as a decimal string. A consumer that keeps the latest value per key of the sink
topic therefore has the current counts.

Run it with the connector on Spark's classpath, e.g.::

    spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 \\
        tests/spark/word_count_job.py --bootstrap 127.0.0.1:9092 --checkpoint /tmp/wc

or as ``python tests/spark/word_count_job.py ... --jars a.jar,b.jar`` (see
docs/spark.md). It runs until SIGTERM/SIGINT (or ``--run-seconds``), then stops the
query between micro-batches. If the query fails (say the broker was away for longer
than the clients' timeouts), it is started again from its checkpoint, at most
``--max-restarts`` times: Spark then re-runs the unfinished micro-batch, so the counts
stay exact (the sink may repeat a count, never write a wrong one).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from types import FrameType
from typing import Any

#: Printed (with the query id) once the query runs; the e2e test waits for it.
STARTED = "word-count: query started"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True, help="trio-broker HOST:PORT list")
    parser.add_argument("--source-topic", default="words")
    parser.add_argument("--sink-topic", default="counts")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint dir")
    parser.add_argument("--count-by", choices=["value", "key"], default="value")
    parser.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"))
    parser.add_argument("--jars", default="", help="comma-separated connector jars")
    parser.add_argument("--packages", default="", help="Maven coordinates (spark.jars.packages)")
    parser.add_argument("--trigger-seconds", type=float, default=1.0)
    parser.add_argument("--run-seconds", type=float, default=0.0, help="0: until signalled")
    parser.add_argument("--max-restarts", type=int, default=3)
    return parser.parse_args(argv)


def spark_session(args: argparse.Namespace) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(args.master)
        .appName("trio-broker-word-count")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Small machines: two shuffle partitions hold the aggregation's state.
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
    )
    if args.jars:
        builder = builder.config("spark.jars", args.jars)
    if args.packages:
        builder = builder.config("spark.jars.packages", args.packages)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def start_query(spark: Any, args: argparse.Namespace) -> Any:
    from pyspark.sql import functions as F

    records = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.source_topic)
        # A new query counts the topic from its beginning; a restarted one resumes
        # from the offsets in its checkpoint (this option is then ignored).
        .option("startingOffsets", "earliest")
        # Offsets going backwards (records the broker acknowledged and then lost) or
        # records deleted before they were read would make the counts wrong without
        # a trace: fail the query instead.
        .option("failOnDataLoss", "true")
        .option("maxOffsetsPerTrigger", "5000")
        .load()
    )
    counts = (
        records.select(F.col(args.count_by).cast("string").alias("word"))
        .where(F.col("word").isNotNull())
        .groupBy("word")
        .count()
        .select(F.col("word").alias("key"), F.col("count").cast("string").alias("value"))
    )
    return (
        counts.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("topic", args.sink_topic)
        # Kafka's producer defaults (acks=all, idempotence) stand; ask for them anyway.
        .option("kafka.acks", "all")
        .option("checkpointLocation", args.checkpoint)
        .outputMode("update")
        .trigger(processingTime=f"{args.trigger_seconds} seconds")
        .start()
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    spark = spark_session(args)
    deadline = time.monotonic() + args.run_seconds if args.run_seconds > 0 else None
    restarts = 0
    try:
        while True:
            query = start_query(spark, args)
            print(f"{STARTED} id={query.id} restarts={restarts}", flush=True)
            while query.isActive and not stopping:
                if deadline is not None and time.monotonic() > deadline:
                    stopping = True
                    break
                time.sleep(0.5)  # awaitTermination would raise the query's error
            if stopping:
                query.stop()
                print("word-count: stopped", flush=True)
                return 0
            error = query.exception()
            print(f"word-count: query failed: {error}", flush=True)
            if restarts >= args.max_restarts:
                return 1
            restarts += 1
            time.sleep(1.0)
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
