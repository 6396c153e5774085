"""Kafka benchmark: txsink's KafkaSink (WAL and replay modes) next to a plain idempotent
producer and Spark's built-in Kafka sink, writing the same cached records into fresh topics.

    integration/benchmarks/run kafka [--rows N] [--partitions 2,8] [--repeat K]

Records: a string key (``user-NNNNNNN``) and a ~207-byte JSON value (a web-shop event built
in Spark with ``to_json(named_struct(...))``, its first field the unique ``id``), cached
and partitioned by the key's hash (``repartition(n, "key")``) for every writer. Every writer
first runs once untimed at full size (``--warmup``); ``--feed`` as in every benchmark.

Writers (each into its own fresh topic of --topic-partitions partitions, deleted after its
output is verified):

wal       ``Coordinator([KafkaSink(mode="wal", key="key", value="value")]).write(df,
          epoch=0)``: every task writes its records to an Arrow IPC WAL file and fsyncs it;
          the driver records the decision, then a commit job (one task per shard,
          shards=<partitions>) produces every WAL record plus the shard's marker in one
          Kafka transaction per shard. Full protocol.
replay    ``KafkaSink(mode="replay", shards=<partitions>)``: the epoch is resharded by the
          key's hash and persisted; pre-commit tasks count and checksum their shard; the
          commit job re-reads the persisted rows, one task per shard, each producing its
          records plus the marker in one transaction. Full protocol.
producer  the ceiling: ``mapInArrow`` tasks, each with a plain (non-transactional)
          idempotent confluent-kafka Producer (``acks=all``, txsink's ``linger.ms=20``,
          ``compression.type=lz4``, ``murmur2_random``), the same produce loop with a
          delivery callback, ``flush()`` at the end.
spark     Spark's built-in Kafka sink (``df.write.format("kafka")``), Java KafkaProducer with
          the same acks, idempotence, linger.ms and compression.
feed      no Kafka: ``mapInArrow`` tasks only receive the batches (Spark's own cost).

Verification: the topic is read back with ``isolation.level=read_committed`` up to its last
stable offsets: exactly N records, N distinct ids (parsed from the value) in range, and the
sums of key/value lengths and CRC32s equal to the source's; no transaction may be left open
(last stable offset == high watermark) and no WAL file left behind.

Plus, unless ``--no-extras``: txsink's phases (EpochResult.seconds), a per-step profile of
one extra run of each mode (precommit tasks, commit), and single-process (no Spark) rates
of the steps KafkaSink's commit is made of.
"""

# The modules, one job each (``main`` runs them; ``integration/benchmarks/run kafka``):
#   records        the feed: the records, the cached frame, its fingerprint, the feed-only job
#   topics         fresh topics, and the read_committed read-back that verifies each run
#   producer       the plain idempotent producer (the ceiling)
#   spark_sink     Spark's own Kafka sink, and its jars
#   txsink_writer  txsink's KafkaSink: direct, WAL and replay modes
#   profiled       KafkaSink with timers around its seams, for the profile runs
#   context        the run's context (session, broker, CPU meter, topics, void runs)
#   measure        timing one writer, verifying and voiding it; one profile run
#   single         the commit's steps in one Python process, no Spark; fixed costs
#   report         the results and their tables; reading: the prose and the section
#   main           the command line and the run, with the one Spark session
