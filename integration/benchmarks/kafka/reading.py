"""The Kafka benchmark's section of docs/benchmarks.md: the setup, the tables, and the
reading of the numbers (generated from the results, so a rerun cannot contradict them)."""

from __future__ import annotations

from benchmarks import _bench

from txsink.connectors.kafka.records.checksum import CHECKSUM_VERSION

from .report import (
    LABELS,
    TARGETS,
    WRITERS,
    Results,
    commit_profile_table,
    phase_table,
    precommit_profile_table,
    single_table,
    target_table,
    throughput_table,
)


def reading(res: Results) -> list[str]:
    """The numbers, read: generated from the results so a rerun cannot contradict them."""
    out: list[str] = []
    for writer, target in TARGETS.items():
        ps = [p for p in res.partitions if res.seconds(writer, p) and res.seconds("spark", p)]
        if not ps:
            continue
        ratios = ", ".join(f"{res.ratio(writer, p, 'spark'):.2f}x at {p}" for p in ps)
        met = all(res.ratio(writer, p, "spark") >= target for p in ps)
        out.append(
            f"**{LABELS[writer]} vs Spark's Kafka sink** ({ratios} partitions): target >= "
            f"{target}x {'met' if met else 'NOT met'}."
        )
    ps = [p for p in res.partitions if res.seconds("producer", p)]
    if ps:
        parts = []
        for writer in TARGETS:
            if all(res.seconds(writer, p) for p in ps):
                ratios = ", ".join(f"{res.ratio(writer, p):.2f}x at {p}" for p in ps)
                parts.append(f"{writer} {ratios} partitions")
        if parts:
            out.append(
                "**txsink vs the plain idempotent producer** (at-least-once, a new producer "
                f"in every task): {'; '.join(parts)}. Spark's sink, the bar above, is "
                "at-least-once too, with a Java producer cached per executor JVM."
            )
    s = res.single
    for p in res.partitions:
        pr = res.profiles.get(("wal", p), {})
        if res.seconds("wal", p):
            ph = res.phases(p, "wal")
            total = _bench.median(res.seconds("wal", p))
            line = (
                f"**WAL mode at {p} partitions**: {total:.2f} s in all; the pre-commit job "
                f"(tasks write their records to the WAL and fsync it) {ph['precommit']:.2f} s "
                f"({ph['precommit'] / total:.0%}), then the commit {ph['commit']:.2f} s "
                f"({ph['commit'] / total:.0%}): a second Spark job, one task per shard "
                f"(shards={p} here), reads the WAL and produces it with the marker."
            )
            out.append(line)
        if res.seconds("direct", p):
            ph = res.phases(p, "direct")
            total = _bench.median(res.seconds("direct", p))
            out.append(
                f"**Direct mode at {p} partitions**: {total:.2f} s in all; the single-pass job "
                f"(tasks encode, checksum and produce into open transactions, vote, wait for "
                f"the decision, commit) {ph['precommit']:.2f} s "
                f"({ph['precommit'] / total:.0%}); {ph['other']:.2f} s "
                f"({ph['other'] / total:.0%}) outside it, mostly `check()` (it fences every "
                "transactional id of the sink: once per query run, not per epoch)."
            )
        pr = res.profiles.get(("replay", p), {})
        if res.seconds("replay", p):
            ph = res.phases(p, "replay")
            total = _bench.median(res.seconds("replay", p))
            line = (
                f"**Replay mode at {p} partitions**: {total:.2f} s in all; pre-commit "
                f"{ph['precommit']:.2f} s ({ph['precommit'] / total:.0%}: a shuffle by the "
                f"key's hash into {p} shards, persisted, then counted and checksummed), commit "
                f"{ph['commit']:.2f} s ({ph['commit'] / total:.0%}: a second job re-reads the "
                "persisted shards, checksums them again and produces), and "
                f"{ph['other']:.2f} s ({ph['other'] / total:.0%}) outside both, mostly "
                "`check()`."
            )
            if pr and pr["c_total"] > 0:
                c = pr["c_total"]
                fixed = pr["c_producer"] + pr["c_marker"]
                units = max(1, pr["commit_units"])
                line += (
                    f" In the profile run: `check()` took {pr['check']:.2f} s on the driver, "
                    f"calling `init_transactions` for the {p} shards one after another and "
                    "then dropping those producers; the pre-commit tasks spent "
                    f"{pr['pre_write']:.2f} s (summed) building records and the checksum; "
                    "the shuffle by the key's hash with its persist alone, without any sink, "
                    f"takes {pr.get('shuffle_s', float('nan')):.2f} s (the plain producer's "
                    f"whole run: {_bench.median(res.seconds('producer', p)):.2f} s); the {units} "
                    f"commit tasks spent {c:.2f} s (summed), {fixed / c:.0%} of it on fixed "
                    f"costs ({fixed / units:.2f} s per task: a new transactional producer "
                    f"with `init_transactions` {pr['c_producer'] / units:.2f} s, the marker "
                    f"read {pr['c_marker'] / units:.2f} s), {pr['c_produce'] / c:.0%} "
                    f"producing, {pr['c_read'] / c:.0%} reading the persisted rows back with "
                    f"records and checksum, {pr['c_commit_txn'] / c:.0%} in "
                    "`commit_transaction`."
                )
            out.append(line)
    if s:
        n = s["rows"]
        out.append(
            f"**One Python process** (no Spark, {n:,} records): KafkaSink's produce loop in "
            f"one transaction runs at {_bench.fmt_rate(n / s['txn_sink_s'])} records/s, the "
            "same transaction with the leanest loop (positional `produce(topic, value, key)` "
            f"of two columns) at {_bench.fmt_rate(n / s['txn_lean_s'])} records/s "
            f"({s['txn_sink_s'] / s['txn_lean_s']:.2f}x), a plain idempotent producer (no "
            "transaction, the same lean loop) at "
            f"{_bench.fmt_rate(n / s['plain_s'])} records/s. All three report failed "
            "deliveries only (`delivery.report.only.error`); `commit_transaction` fails if "
            "any record of the transaction failed. The replay checksum (version "
            f"{CHECKSUM_VERSION}) costs {s['checksum_s']:.2f} s per {n:,} records, in each "
            "of the two passes (pre-commit and commit)."
        )
        if "first_delivery_ms" in s:
            out.append(
                "**Fixed costs per producer** (medians): a new idempotent producer "
                f"delivers its first record after {s['first_delivery_ms']:.0f} ms (librdkafka "
                "acquires the producer id first), `init_transactions` on a new transactional "
                f"producer takes {s['init_transactions_ms']:.0f} ms (median of 3 each), "
                "the marker read (`Markers.last`) "
                f"{s['marker_ms']:.0f} ms (median of {s.get('marker_n', 3):.0f}; a new "
                "AdminClient for `list_offsets`, then a consumer polled in 0.2 s steps until "
                "its position passes the transaction's commit marker"
                + (
                    f"; {s['marker_slow']:.0f} of the calls took over 1 s, the slowest "
                    f"{s['marker_max_ms']:.0f} ms"
                    if "marker_slow" in s
                    else ""
                )
                + "). "
                "The plain producer and replay mode pay the first two in every task; Spark's "
                "sink reuses one cached producer across tasks, which is why it gains the most "
                "from more partitions."
            )
    if res.spark_kafka is not None and res.spark_kafka.notes:
        out.append(
            "**Spark's Kafka connector version**: "
            + "; ".join(res.spark_kafka.notes)
            + f". It ran on PySpark {res.versions.get('pyspark', '?')} without errors, and its "
            "output was verified like every writer's."
        )
    if res.spark_kafka_error:
        out.append(f"**Spark's Kafka sink was not measured**: {res.spark_kafka_error}.")
    return out


def render(res: Results) -> str:
    v, mach = res.versions, res.machine
    avg_value = res.value_bytes / res.rows if res.rows else 0
    sk = res.spark_kafka
    connector = (
        ", ".join(f"{a} {ver}" for a, ver in sorted(sk.versions.items())) if sk else "not measured"
    )
    parts = [
        *_bench.header(res, "Kafka"),
        f"- Versions: PySpark {v['pyspark']} (`local[N]`, N = the most partitions measured, "
        f"for the direct writer's barrier stage; {mach['java']}), Python "
        f"{mach['python']}, pyarrow {v['pyarrow']}, confluent-kafka {v['confluent_kafka']} "
        f"(librdkafka {v['librdkafka']}), Kafka {v['broker']} (one local KRaft broker, "
        f"{v['broker_settings']}); Spark's Kafka sink: {connector}.",
        f"- Data: {res.rows:,} records, a string key (`user-NNNNNNN`, 12 bytes) and a JSON "
        f"value of {avg_value:.0f} bytes on average (a web-shop event, "
        "`to_json(named_struct('id', id, 'type', ..., 'ts', ..., 'amount', ...))`), "
        f"{res.data_bytes / 1e6:.0f} MB of key + value, generated in Spark from `spark.range`, "
        'repartitioned by the key\'s hash (`repartition(n, "key")`, for every writer) and '
        "cached before any timing. Each writer writes into its own fresh "
        f"topic ({res.topic_partitions} partitions, replication 1), deleted after its output is "
        "verified: read back with `isolation.level=read_committed` to the last stable offsets, "
        "exactly N records with N distinct ids, the key/value byte counts and CRC32 sums equal "
        "to the source's, no transaction left open, no WAL file left.",
        '- Writers: **txsink WAL** `Coordinator([KafkaSink(mode="wal", key="key", '
        'value="value")]).write(df, epoch=0)`, the full protocol (WAL file + fsync in each task, '
        "decision in the log, a commit job produces every record and the marker in one "
        "transaction per shard, one task per shard; `shards=<partitions>`); "
        '**txsink replay** `mode="replay", '
        "shards=<partitions>` (reshard by the key's hash, persist, count + checksum in the "
        "tasks, decision, a commit job with one transactional producer per shard); **plain "
        "idempotent producer** `mapInArrow` tasks, each with a non-transactional confluent-kafka "
        "Producer, the same produce loop (delivery callback), `flush()` at the end; **Spark "
        'Kafka sink** `df.selectExpr("key", "value").write.format("kafka")...save()`. All four '
        "with `acks=all`, idempotence, `linger.ms=20` and `compression.type=lz4` (txsink's "
        "defaults). The feed row is Spark alone: tasks that receive the batches and write "
        "nothing.",
        f"- Times are wall-clock per run, {res.repeat} run(s) each, after an untimed full-size "
        "warm-up run of every writer (Spark's Kafka sink included); rates use the median; MB/s "
        "counts key + value bytes.",
        *_bench.blocks(throughput_table(res), target_table(res), title="Throughput"),
        *_bench.cpu_blocks(
            res, LABELS, (*WRITERS, "feed"), over="spark", servers=[("kafka", "Kafka broker")]
        ),
    ]
    if any(res.seconds(w, p) for w in ("wal", "replay") for p in res.partitions):
        parts += _bench.blocks(
            "Driver phases (`EpochResult.seconds`, median; *check + schema + unpersist* is the "
            "rest of the wall time: the sink's start-up checks with `init_transactions` per "
            "shard, the Arrow schema, and in replay mode the `unpersist` of the epoch):",
            phase_table(res),
            title="Where txsink's time goes",
        )
    if res.profiles:
        parts += _bench.blocks(
            "Pre-commit tasks (one extra, untimed run of each mode with a subclass of KafkaSink "
            "that times its hooks per batch; seconds summed over tasks, 2 run at a time; *Spark "
            "feed* is the task's time outside the sink; replay mode's shuffle runs before these "
            "tasks, in a stage of its own: *shuffle + persist alone* times "
            '`df.repartition(shards, "key").persist().count()` without any sink):',
            precommit_profile_table(res),
            "Commit (same runs; *read* is reading the WAL file, or in replay mode Spark "
            "re-reading the persisted rows plus building the records and the checksum; "
            "*produce loop* is `producers.produce_records`; *commit_transaction* includes "
            "`begin_transaction` and the marker record):",
            commit_profile_table(res),
        )
    if res.single:
        parts += _bench.blocks(
            f"The steps of the commit on all {res.single['rows']:,} records in this process "
            "(each produce variant into a fresh topic, verified like the writers):",
            single_table(res),
            title="One Python process, no Spark",
        )
    parts += _bench.bullets("Reading", reading(res))
    return "\n".join(parts) + "\n"
