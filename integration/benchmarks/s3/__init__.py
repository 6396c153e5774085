"""S3 benchmark: txsink's S3Sink next to plain boto3 uploads of the same Parquet bytes and
Spark's own ``df.write.parquet("s3a://...")``, writing the same cached rows to the S3 server.

    integration/benchmarks/run s3 [--rows N] [--partitions 2,8] [--repeat K]

Writers (each into its own prefix of one bucket, deleted after its output is verified):

txsink   ``Coordinator([S3Sink(url, uid)], log="s3://.../txlog").write(df, epoch=0)``: every
         task encodes its Arrow batches to Parquet (pyarrow, snappy) and uploads multipart
         parts as they fill; the driver records the decision in a txsink log on S3, completes
         the uploads and writes the epoch manifest. The full protocol.
upload   the ceiling: ``mapInArrow`` tasks encode the same Parquet (pyarrow ``ParquetWriter``,
         snappy, one ``write_batch`` per Arrow batch, as the sink does) into memory and hand
         it to boto3's ``upload_fileobj`` (multipart above 8 MiB, 10 threads). No protocol.
s3a      ``df.write.parquet("s3a://...")``: Spark's Parquet writer on hadoop-aws (the version
         of PySpark's Hadoop client, fetched from Maven Central into the jar cache) with its
         default commit protocol (FileOutputCommitter v1: task and job commit by rename,
         which s3a does as copy + delete).
encode   no S3: tasks encode the Parquet and drop it (where the upload's time goes).
feed     no S3: tasks only receive the batches (Spark's own cost).

Credentials reach every writer through the environment (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_ENDPOINT_URL_S3``, set from the ``TXSINK_S3_*`` variables
before Spark starts): boto3's chain in the Python workers, s3a's provider chain in the JVM.
No secret is in a Spark setting, a pickled closure or the output.
"""

# The modules, one job each (``main`` runs them; ``integration/benchmarks/run s3``):
#   data      the order-line rows, the cached frame, their fingerprint (also Delta's, Iceberg's)
#   bucket    the S3 server: credentials, its process, listing, reading and deleting a prefix
#   writers   txsink's S3Sink, the plain boto3 upload, Spark's s3a writer; encode- and feed-only
#   context   the run's context (session, client, bucket, CPU meter, void runs)
#   measure   timing one writer into a fresh prefix, verifying and voiding it
#   report    the results, their tables, the reading and the section
#   main      the command line and the run, with the one Spark session
