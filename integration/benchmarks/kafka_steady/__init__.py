"""Kafka in steady state: one long-running streaming query per writer, as users run
streams, the first epochs (the JVM's JIT, the workers' imports, the producers' start)
left out of the figures.

    integration/benchmarks/run kafka_steady [--rows 100000] [--epochs 30] [--skip 5]
                                            [--partitions 2] [--repeat 3] [--quick]

Input: ``--epochs`` epochs of ``--rows`` records (the kafka benchmark's records: a string
key and a ~207-byte JSON value, ids unique across epochs), generated once per partition
count as Parquet files, one file per Spark partition, partitioned by the key's hash. Each
query reads them with ``readStream.parquet(...)`` and ``maxFilesPerTrigger`` = partitions
under ``trigger(availableNow=True)``: exactly one epoch per micro-batch, one task per file
(``spark.sql.files.openCostInBytes`` keeps Spark from packing files together), and the query
ends by itself after the last epoch. Every writer reads the same files the same way.

Writers (each its own query, checkpoint and fresh topic of --topic-partitions partitions):

spark     Spark's own Kafka sink, ``writeStream.format("kafka")`` (its producer cached in
          the executor JVM across epochs), acks=all, idempotence, linger.ms=20, lz4
producer  ``foreachBatch``: the kafka benchmark's plain idempotent confluent-kafka producer
          (a new producer in every task of every epoch: what such a foreachBatch does)
direct    ``foreachBatch(Coordinator([KafkaSink(mode="direct", ...)]))``, shards max(8, p)
wal       the same with ``mode="wal"`` (shards = partitions)
replay    the same with ``mode="replay"`` (shards = partitions)
feed      ``foreachBatch`` tasks that only receive the batches (Spark's own cost)

Measured per query: from the end of epoch ``--skip`` - 1 to the end of the last epoch (a
``StreamingQueryListener`` takes a CPU snapshot at each epoch's progress event): records/s,
and CPU-seconds per million records by role (Spark's JVM and its JIT threads, the Python
workers' main thread and other threads, the driver, the broker). Every topic is read back
with ``isolation.level=read_committed``: exactly the records of all epochs, no duplicate,
none missing, no transaction left open; a wrong output voids the run.
"""

# The modules (``integration/benchmarks/run kafka_steady``):
#   source   the epochs as Parquet files and the stream that reads them
#   queries  one streaming query per writer, the listener that meters its epochs
#   main     the command line, the run, the results and the report
