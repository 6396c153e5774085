"""Postgres benchmark: txsink's PostgresSink next to plain CSV COPY, plain binary COPY,
Spark's JDBC writer and psycopg ``executemany``, writing the same cached rows into fresh
tables; then a wide table (the same columns plus bytea, text[] and jsonb).

    integration/benchmarks/run postgres [--rows N] [--partitions 2,8] [--repeat K]
                                        [--wide-rows N]

Writers (each into its own fresh table, dropped after its output is verified):

txsink       ``Coordinator([PostgresSink(mode="append")]).write(df, epoch=0)``: every task
             casts its Arrow batches to the table's types, encodes them with pgpq into
             binary COPY and PREPAREs; the driver records the decision and runs COMMIT
             PREPARED per partition. The full protocol, two-phase commit.
staging      the same with ``commit="staging"`` (for servers with max_prepared_transactions
             = 0): binary COPY into the sink's logged staging table and a local COMMIT in
             each task; after the decision the driver moves the epoch's rows into the table
             in one local transaction (INSERT ... SELECT, progress rows, TRUNCATE).
copy         plain CSV COPY: ``mapInArrow`` tasks COPY pyarrow's CSV in an ordinary
             transaction and COMMIT (what txsink did before binary COPY). No 2PC, no log.
binary       the ceiling: ``mapInArrow`` tasks COPY pgpq's binary encoding of the batches as
             they are (the tables' types are pgpq's own) in an ordinary transaction.
upsert       txsink with ``mode="upsert", key=["id"]`` into a table with that primary key:
             the epoch repartitioned by the key, binary COPY into each task's stage table,
             then ``INSERT ... ON CONFLICT`` at prepare.
jdbc         ``df.write.jdbc(..., mode="append")``, PostgreSQL JDBC driver, ``batchsize``
             10000 and ``reWriteBatchedInserts=true``.
executemany  ``mapInArrow`` tasks run ``cursor.executemany("INSERT ...")`` in one transaction
             (psycopg 3 pipelines it: no round trip per row).
feed         no database: ``mapInArrow`` tasks only receive the batches (Spark's own cost).

Plus, unless ``--no-extras``: txsink's phases (EpochResult.seconds) and a per-task profile,
PREPARE / COMMIT PREPARED latency, small epochs (two-phase and staging commits against plain
COPY), single-connection COPY and encoding rates; and, at
``--wide-rows`` (0 skips it), the wide table: txsink (the nested column as JSON text from
Spark, and as a struct that txsink turns into JSON; the staging commit), plain binary COPY
and Spark's JDBC writer (``stringtype=unspecified`` for the jsonb column). Server CPU per
row for each.
"""

# The modules, one job each (``main`` runs them; ``integration/benchmarks/run postgres``):
#   tables         the rows (narrow, wide), their DDL, the frame, the fingerprint, the feed
#   plain          plain CSV COPY, plain binary COPY, psycopg executemany (no 2PC)
#   jdbc           Spark's JDBC writer
#   txsink_writer  txsink's PostgresSink (append, upsert), and its profiled subclass
#   context        the run's context (session, server, schema, CPU meter, void runs)
#   measure        timing one writer into a fresh table, verifying and voiding it; a profile run
#   extras         small epochs, 2PC latency, one connection without Spark
#   report         the results and their tables; reading: the prose and the section
#   main           the command line and the run, with the one Spark session
