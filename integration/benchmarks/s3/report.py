"""The S3 benchmark's results, their tables (throughput, the target), the reading of the
numbers (generated from the results, so a rerun cannot contradict them) and its section of
docs/benchmarks.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from benchmarks import _bench

from .data import COLUMNS

WRITERS = ("txsink", "upload", "s3a")
LABELS = {
    "txsink": "txsink S3Sink",
    "upload": "plain boto3 upload (ceiling)",
    "s3a": "Spark df.write.parquet (s3a)",
    "encode": "(Parquet encoding only, no S3)",
    "feed": "(Spark feed only, no S3)",
}
TARGET = 0.9  # txsink / plain upload


@dataclass
class Results(_bench.Results):
    """The runs, and how Spark's s3a writer was set up (or why it was not)."""

    name: ClassVar[str] = "s3"
    title: ClassVar[str] = "S3"
    server: ClassVar[str] = "s3"
    baseline: ClassVar[str] = "upload"

    s3a: str = ""  # how s3a was set up, or why it could not be
    s3a_ok: bool = False

    def mbytes(self, writer: str, partitions: int) -> float:
        """Median MB of output (encoded bytes for ``encode``)."""
        return _bench.median([m.extra.get("bytes", 0) / 1e6 for m in self.of(writer, partitions)])

    def mb_per_s(self, writer: str, partitions: int) -> float:
        secs = _bench.median(self.seconds(writer, partitions))
        return self.mbytes(writer, partitions) / secs if secs > 0 else float("nan")


def throughput_table(res: Results) -> str:
    def objects(writer: str, p: int, runs: list[_bench.Measurement]) -> str:
        if writer in WRITERS:
            return f"{res.mbytes(writer, p):.1f} / {runs[0].extra.get('objects', '-')}"
        return f"{res.mbytes(writer, p):.1f} / -" if writer == "encode" else ""

    return _bench.throughput_table(
        res,
        LABELS,
        (*WRITERS, "encode", "feed"),
        WRITERS,
        rate_header="rows/s (median)",
        vs_header="vs plain upload",
        server_header="S3 server",
        columns=[
            ("MB/s", "r", lambda w, p, _: f"{res.mb_per_s(w, p):.1f}" if w != "feed" else ""),
            ("MB / objects", "r", objects),
        ],
    )


def target_table(res: Results) -> str:
    rows = [
        [
            str(p),
            _bench.ratio_cell(res, "txsink", p, target=TARGET),
            _bench.ratio_cell(res, "s3a", p),
            _bench.ratio_cell(res, "txsink", p, "s3a", single_runs=False),
        ]
        for p in res.partitions
    ]
    return _bench.markdown_table(
        [
            "partitions",
            f"txsink / plain upload (target >= {TARGET}x)",
            "Spark s3a / plain upload",
            "txsink / Spark s3a",
        ],
        rows,
        "rrrr",
    )


def reading(res: Results) -> list[str]:
    """The numbers, read: generated from the results so a rerun cannot contradict them."""
    out: list[str] = []
    ps = [p for p in res.partitions if res.seconds("txsink", p) and res.seconds("upload", p)]
    if ps:
        met = [res.ratio("txsink", p) >= TARGET for p in ps]
        verdict = (
            "met"
            if all(met)
            else "NOT met"
            if not any(met)
            else "met only at "
            + ", ".join(f"{p} partitions" for p, ok in zip(ps, met, strict=True) if ok)
        )
        ratios = "; ".join(res.ratio_at("txsink", p) for p in ps)
        out.append(
            f"**txsink vs plain upload**: {ratios}. Target >= {TARGET}x: {verdict}. Both "
            "encode the same Parquet in the tasks (pyarrow, snappy, a row group per Arrow "
            "batch; output sizes in the table). The plain upload encodes the whole partition, "
            "then boto3 uploads it with 10 threads; txsink uploads a 16 MiB part whenever "
            "one fills, between batches, so encoding and uploading take turns in one thread. "
            "What txsink adds: its start-up check, an upload marker object per transaction "
            "(written twice), CRC32 checksums per part, the decision, manifest and committed "
            "records, and one CompleteMultipartUpload per object from the driver (timed below)."
        )
        noisy = [p for p in ps if res.straddles("txsink", p)]
        if noisy:
            others = ", ".join(
                f"{res.cpu('txsink', p)['others']:.1f} CPU-s at {p} partitions" for p in noisy
            )
            out.append(
                "**Noise**: at "
                + " and ".join(str(p) for p in noisy)
                + " partitions txsink was faster than the plain upload in some runs and slower "
                "in others, so the gap between the medians is within the run-to-run noise; "
                f"other jobs on the machine took {others} per txsink run (median, the *other* "
                "column), against the benchmark's own CPU of the same order."
            )
    for p in ps:
        enc = res.seconds("encode", p)
        if enc:
            e = _bench.median(enc)
            u = _bench.median(res.seconds("upload", p))
            feed = _bench.median(res.seconds("feed", p)) if res.seconds("feed", p) else 0.0
            upload = (
                f"the plain upload's {u:.2f} s are {u - e:.2f} s more than encoding alone: the "
                f"cost of sending {res.mbytes('upload', p):.0f} MB to the local server"
                if u > e
                else f"the plain upload took {u:.2f} s, no longer than encoding alone: sending "
                f"{res.mbytes('upload', p):.0f} MB to the local server is lost in the noise"
            )
            out.append(
                f"**Where the time goes at {p} partitions**: Spark alone (feed) takes "
                f"{feed:.2f} s, Spark + Parquet encoding (encode) {e:.2f} s, and {upload}. "
                f"txsink's pre-commit job (encode + upload parts, in the tasks) took "
                f"{res.phases(p)['precommit']:.2f} s."
                if res.seconds("txsink", p)
                else ""
            )
    if res.s3a_ok:
        ps3 = [p for p in res.partitions if res.seconds("s3a", p) and res.seconds("upload", p)]
        if ps3:
            ratios = ", ".join(
                f"{res.ratio('txsink', p, over='s3a'):.2f}x at {p} partitions" for p in ps3
            )
            out.append(
                f"**txsink vs Spark's s3a writer** (txsink's rate / s3a's): {ratios}. s3a "
                "encodes in the JVM (Spark's Parquet writer, no Arrow hand-over to Python) and, "
                "with the default FileOutputCommitter, writes each file under `_temporary/` and "
                "renames it at task commit and again at job commit; on S3 a rename is a copy "
                "and a delete. The job commit moves the files one by one, so a reader listing "
                "the folder can see part of the output, and a re-run of a batch writes its "
                "files again."
            )
    else:
        out.append(f"**Spark's s3a writer** was not measured: {res.s3a}")
    return out


def render(res: Results) -> str:
    v, mach = res.versions, res.machine
    load_note = (
        "The load average counts the benchmark itself; the *other* CPU column is what other "
        "jobs took."
    )
    parts = [
        *_bench.header(res, "S3", load_note),
        f"- Versions: PySpark {v.get('pyspark')} (`local[2]`, {mach['java']}), Python "
        f"{mach['python']}, pyarrow {v.get('pyarrow')}, boto3 {v.get('boto3')}, S3 server: "
        f"{v.get('server')} on the same machine ({v.get('endpoint')}). {res.s3a}",
        f"- Data: {res.rows:,} rows of an order line (`{', '.join(n for n, _ in COLUMNS)}`), "
        "generated in Spark from `spark.range`, repartitioned and cached before any timing. "
        "Every writer writes Parquet with snappy into its own prefix of one bucket; the "
        "output is read back and checked (count, distinct ids, column aggregates equal to the "
        "source's; for txsink through its manifests, with no multipart upload left open; for "
        "s3a the `_SUCCESS` marker) and deleted.",
        '- Writers: **txsink** `Coordinator([S3Sink(url, uid, format="parquet")], '
        'log="s3://…/txlog").write(df, epoch=0)`, the full protocol with the txsink log on '
        "S3 too; **plain boto3 upload** `mapInArrow` tasks that encode the same Parquet "
        "(pyarrow `ParquetWriter`, one `write_batch` per Arrow batch, as S3Sink does) and "
        "`upload_fileobj` it (boto3's defaults: multipart above 8 MiB, 10 threads) — the "
        'ceiling; **Spark s3a** `df.write.parquet("s3a://…")` with the default commit '
        "protocol. The encode and feed rows are not writers: tasks that encode and drop the "
        "Parquet, and tasks that only receive the batches.",
        f"- Times are wall-clock per run, {res.repeat} run(s) each, after an untimed warm-up "
        "run of every writer at full size; rows/s and MB/s use the median time; MB/s is the "
        "writer's own output bytes. txsink and the plain upload swap order every other run. "
        "*CPU s* are CPU seconds per run (median) of this benchmark's process tree (driver, "
        "Spark JVM, Python workers), of the S3 server's process, and of everything else.",
        *_bench.blocks(throughput_table(res), target_table(res), title="Throughput"),
        *_bench.cpu_blocks(res, LABELS, (*WRITERS, "feed"), servers=[("s3", "MinIO")]),
    ]
    if any(res.seconds("txsink", p) for p in res.partitions):
        parts += _bench.blocks(
            "Driver phases (`EpochResult.seconds`, median; *check + schema* is the rest of "
            "the wall time: the sink's start-up checks, the log's conditional-write probe and "
            "the Arrow schema; *commit* is CompleteMultipartUpload per object + the manifest + "
            "the committed mark):",
            _bench.phase_table(res),
            title="Where txsink's time goes",
        )
    parts += _bench.bullets("Reading", reading(res))
    if res.void:
        parts += _bench.bullets("Void runs", res.void)
    return "\n".join(parts) + "\n"
