"""The Kafka sink's audit: the committed records of each epoch, found by their epoch header.

Kafka keeps no record of a transaction once it is committed (no per-epoch metadata a
reader can ask for), and the handles name no offsets (the pre-commit of WAL and replay
mode never talks to Kafka), so an epoch's records are found by the header
``KafkaSink(epoch_header=True)`` adds to each of them (``txsink.epoch``:
``<app>/<uid>/<epoch>``; :func:`~txsink.connectors.kafka.records.format.epoch_tag`).

Bounded: the sink commits epochs in order, so in each partition the epochs of its records
never decrease with the offset. A binary search over offsets (each probe reads from an
offset to the first record of ours) finds where the first audited epoch begins, and the
scan stops at the first record of a later epoch than the last audited one, or at the last
stable offset: an audit of the last N epochs reads those N epochs' records (and any other
producer's records between them), not the topic.

* metadata (``deep=False``): the topic exists; per epoch, its committed records
  (``read_committed``) counted by header, and where records are missing, the partitions
  whose log start offset moved (retention, ``delete_records``, a recreated topic).
* deep: also the replay checksum (:class:`~txsink.connectors.kafka.records.checksum.Tally`,
  the version the handles recorded) of the epoch's records against the sum of its handles'
  (replay and direct mode), and the row digest of the columns the records give back
  (:func:`digest_columns`).
* extras: records of ours (this app, this uid) of an epoch in the range that no decision of
  the range names.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from txsink.audit.digest import Digest, digest_batch
from txsink.audit.found import AuditRequest, EpochFound, EpochToAudit, Extra, TargetAudit
from txsink.connectors.kafka.clients.columns import py_columns
from txsink.connectors.kafka.clients.errors import client_calls, has_code
from txsink.connectors.kafka.clients.offsets import partition_ends
from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.connectors.kafka.records.checksum import Tally
from txsink.connectors.kafka.records.format import EPOCH_HEADER, RECORD_SCHEMA, RecordFormat
from txsink.errors import RetryableError

__all__ = ["audit_topic", "digest_columns"]

_MOD = 1 << 64
#: One record read back: (partition, key, value, headers).
Record = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


@dataclass
class _Epoch:
    """What the scan found of one epoch."""

    rows: int = 0
    partitions: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    records: list[Record] = field(default_factory=list)


def audit_topic(
    request: AuditRequest, settings: KafkaSettings, fmt: RecordFormat, mode: str
) -> TargetAudit:
    """The sink's audit (``SinkContract.audit``): see the module's docstring. A client
    error leaves as a txsink error (the audit reports the sink not audited, with it)."""
    with client_calls(settings, "auditing the topic", phase="audit"):
        return _audit(request, settings, fmt, mode)


def _audit(
    request: AuditRequest, settings: KafkaSettings, fmt: RecordFormat, mode: str
) -> TargetAudit:
    out = TargetAudit()
    if not request.epochs:
        return out
    sink = f"KafkaSink(uid={settings.uid!r})"
    if not fmt.epoch_header:
        raise NotImplementedError(
            f"{sink} writes no epoch header, so its epochs' records cannot be told apart in "
            "the topic: start it with epoch_header=True; the epochs committed from then on "
            "can be audited"
        )
    if fmt.topic is None or fmt.topic_column is not None:
        raise NotImplementedError(f"{sink} writes to topic_column's topics: not audited yet")
    topic, first, last = fmt.topic, request.first, request.last
    how = f"records of topic {topic!r} with header {EPOCH_HEADER} (read_committed)"
    admin = _admin(settings)
    tmeta = admin.list_topics(topic, timeout=settings.timeout_s).topics.get(topic)
    if tmeta is None or tmeta.error is not None:
        gone = f"topic {topic!r} does not exist (deleted, or never created)"
        out.epochs = {e.epoch: EpochFound(0, None, [gone], how) for e in request.epochs}
        return out
    parts = sorted(tmeta.partitions)
    starts = _offsets(admin, settings, topic, parts, "earliest")
    ends = partition_ends(admin, topic, parts, "read_committed", settings.timeout_s)
    prefix = f"{request.app_id}/{settings.uid}/".encode()
    found: dict[int, _Epoch] = defaultdict(_Epoch)
    with _Reader(settings, topic, prefix) as reader:
        for p in parts:
            begin = reader.first_offset(p, starts[p], ends[p], first)
            for _, epoch, record in reader.scan(p, begin, ends[p]):
                if epoch > last:
                    break
                if epoch < first:  # pragma: no cover - the search starts past them
                    continue
                got = found[epoch]
                got.rows += 1
                got.partitions[p] += 1
                if request.deep:
                    got.records.append(record)
    moved = {p: o for p, o in starts.items() if o > 0}
    for e in request.epochs:
        got = found.pop(e.epoch, _Epoch())
        if not e.handles:
            if got.rows:
                out.extras.append(_extra(topic, e.epoch, got, "its decision has no handle"))
            continue
        out.epochs[e.epoch] = _found(
            e,
            got,
            topic=topic,
            moved=moved,
            fmt=fmt,
            mode=mode,
            deep=request.deep,
            how=how,
            out=out,
        )
    for epoch, got in sorted(found.items()):
        out.extras.append(_extra(topic, epoch, got, "the epoch is not committed in the log"))
    out.notes += _notes(mode, request.deep)
    settings.reachable()
    return out


def _found(
    e: EpochToAudit,
    got: _Epoch,
    *,
    topic: str,
    moved: dict[int, int],
    fmt: RecordFormat,
    mode: str,
    deep: bool,
    how: str,
    out: TargetAudit,
) -> EpochFound:
    problems: list[str] = []
    if got.rows < e.rows:
        if not got.rows:
            problems.append(
                f"no committed record of epoch {e.epoch} in topic {topic!r}: deleted, expired "
                "by retention, or the topic was recreated"
            )
        for p, start in sorted(moved.items()):
            problems.append(
                f"topic {topic!r} partition {p} starts at offset {start}: the records before "
                "it were deleted (retention, delete_records, or a recreated topic)"
            )
    found = EpochFound(got.rows, None, problems, how)
    if not deep:
        return found
    found.how += "; their replay checksum and row digest"
    if mode in ("replay", "direct"):
        handles = e.handles
        version = int(getattr(handles[0], "checksum_version", 0))
        decided = sum(int(getattr(h, "checksum", 0)) for h in handles) % _MOD
        tally = Tally(version)
        batch = _records(topic, got.records, fmt)
        tally.add(batch, py_columns(batch))
        if tally.checksum != decided:
            problems.append(
                f"replay checksum of epoch {e.epoch}'s records in topic {topic!r} is "
                f"{tally.checksum:016x}, its pre-commit recorded {decided:016x} (version "
                f"{version}): records differ from the decided ones"
            )
    expected = e.expected
    if expected is not None:
        digest, left_out = digest_columns(got.records, fmt, expected)
        found.digest = digest
        if left_out:
            out.notes.append(
                f"epoch {e.epoch}: column(s) {', '.join(left_out)} not in the row digest: no "
                "Arrow type read back from the records gives the pre-commit's sum (a type "
                "their text does not keep, e.g. timestamps or decimals, or changed values)"
            )
    return found


def _extra(topic: str, epoch: int, got: _Epoch, why: str) -> Extra:
    where = ", ".join(f"partition {p}: {n}" for p, n in sorted(got.partitions.items()))
    what = f"{got.rows} record(s) of epoch {epoch} in topic {topic!r} ({where}): {why}"
    return Extra(what, epoch, got.rows)


def _notes(mode: str, deep: bool) -> list[str]:
    notes = [
        "records of other producers (without our header) are not looked at; records of "
        "aborted transactions are not read (read_committed)",
    ]
    if deep and mode == "wal":
        notes.append("WAL mode keeps no replay checksum in its handles: counted and digested")
    return notes


def _records(topic: str, records: list[Record], fmt: RecordFormat) -> pa.RecordBatch:
    """The records as the pre-commit tallied them (:data:`RECORD_SCHEMA`): the partition
    only where a ``partition_column`` chose it."""
    parts = [r[0] if fmt.partition_column else None for r in records]
    headers = [[{"key": k, "value": v} for k, v in r[3]] or None for r in records]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([topic] * len(records), pa.string()),
            pa.array(parts, pa.int32()),
            pa.array([r[1] for r in records], pa.binary()),
            pa.array([r[2] for r in records], pa.binary()),
            pa.array(headers, RECORD_SCHEMA.field("headers").type),
        ],
        schema=RECORD_SCHEMA,
    )


# -- the row digest of what the records give back ----------------------------------------


def digest_columns(
    records: list[Record], fmt: RecordFormat, expected: Digest
) -> tuple[Digest | None, list[str]]:
    """The :class:`Digest` of the DataFrame columns the records give back, and the columns
    left out of it.

    The key and ``value`` columns (``"auto"`` format: their bytes, UTF-8 text or number
    text) and, without ``value``, the payload columns of the JSON object; Avro values and
    the headers column are not decoded. A column's Arrow type is not in the records: each
    column is read back as each type its text may have been written from, and the one whose
    sum is the pre-commit's is kept; a column no type gives back is left out (named).
    ``None`` when no column could be read back.
    """
    candidates: dict[str, list[pa.Array]] = {}
    if fmt.key is not None and "key" not in fmt.avro:
        candidates[fmt.key] = _from_bytes([r[1] for r in records])
    if fmt.partition_column is not None:
        candidates[fmt.partition_column] = [pa.array([r[0] for r in records], pa.int64())]
    if "value" not in fmt.avro:
        if fmt.value is not None:
            candidates[fmt.value] = _from_bytes([r[2] for r in records])
        else:
            rows = [json.loads(r[2]) if r[2] is not None else {} for r in records]
            for name in expected.cols:
                if name not in candidates and name not in fmt.special_columns():
                    candidates[name] = _from_json([row.get(name) for row in rows])
    kept: dict[str, pa.Array] = {}
    left_out = []
    for name, arrays in candidates.items():
        want = expected.cols.get(name)
        match = next((a for a in arrays if _col_sum(name, a) == want), None)
        if match is None:
            left_out.append(name)
        else:
            kept[name] = match
    if not kept:
        return None, left_out
    return digest_batch(pa.table(kept)), left_out


def _col_sum(name: str, arr: pa.Array) -> int:
    return digest_batch(pa.table({name: arr})).cols[name]


def _from_bytes(values: list[bytes | None]) -> list[pa.Array]:
    """Bytes as binary, as UTF-8 text, as integers, as floats (each as far as it parses)."""
    out = [pa.array(values, pa.binary())]
    for make in (
        lambda: pa.array(values, pa.binary()).cast(pa.string()),
        lambda: pa.array([None if v is None else int(v) for v in values], pa.int64()),
        lambda: pa.array([None if v is None else float(v) for v in values], pa.float64()),
    ):
        out += _try(make)
    return out


def _from_json(values: list[Any]) -> list[pa.Array]:
    """JSON values as Arrow infers them, strings also as binary."""
    out = _try(lambda: pa.array(values))
    if out and pa.types.is_string(out[0].type):
        out += _try(lambda: pa.array([None if v is None else v.encode() for v in values]))
    return out


def _try(make: Callable[[], pa.Array]) -> list[pa.Array]:
    try:
        return [make()]
    except (ValueError, TypeError, pa.ArrowException):
        return []


# -- reading --------------------------------------------------------------------------------


def _admin(settings: KafkaSettings) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(settings.client_config())


def _offsets(
    admin: Any, settings: KafkaSettings, topic: str, parts: list[int], spec: str
) -> dict[int, int]:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

    which: Any = getattr(OffsetSpec, spec)()
    futures = admin.list_offsets(
        {TopicPartition(topic, p): which for p in parts}, request_timeout=settings.timeout_s
    )
    return {
        tp.partition: int(f.result(timeout=settings.timeout_s).offset) for tp, f in futures.items()
    }


class _Reader:
    """A ``read_committed`` consumer of one topic that reads from any offset (no group
    offsets committed), and tells our records by their epoch header."""

    def __init__(self, settings: KafkaSettings, topic: str, prefix: bytes) -> None:
        self.settings, self.topic, self.prefix = settings, topic, prefix
        self.consumer: Any = None

    def __enter__(self) -> _Reader:
        from confluent_kafka import Consumer

        self.consumer = Consumer(
            {
                **self.settings.client_config(),
                "group.id": f"txsink-audit-{self.settings.uid}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 10,
            }
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumer.close()

    def first_offset(self, p: int, low: int, end: int, epoch: int) -> int:
        """The offset where the records of ours of ``epoch`` or later begin in ``p``: a
        binary search (the epochs of our records never decrease along the offsets)."""
        lo, hi = low, end
        while lo < hi:
            mid = (lo + hi) // 2
            probe = next(self.scan(p, mid, end), None)
            if probe is None or probe[1] >= epoch:
                hi = mid
            else:
                lo = probe[0] + 1
        return lo

    def scan(self, p: int, start: int, end: int) -> Iterator[tuple[int, int, Record]]:
        """Our records of partition ``p`` from ``start`` up to ``end``: (offset, epoch,
        record)."""
        from confluent_kafka import TopicPartition

        if start >= end:
            return
        self.consumer.assign([TopicPartition(self.topic, p, start)])
        deadline = time.monotonic() + self.settings.timeout_s
        while True:
            msg = self.consumer.poll(0.5)
            if msg is None:
                if time.monotonic() > deadline:
                    raise RetryableError(
                        f"timed out reading topic {self.topic!r} partition {p} from offset "
                        f"{start} for the audit",
                        **self.settings.context("audit"),
                    )
                continue
            deadline = time.monotonic() + self.settings.timeout_s
            err = msg.error()
            offset = msg.offset() or 0
            if err is not None:
                if not has_code(err, "_PARTITION_EOF"):
                    raise RetryableError(
                        f"cannot read topic {self.topic!r} for the audit: {err.str()}",
                        **self.settings.context("audit"),
                    )
                if offset >= end:
                    return
                continue
            if offset >= end:
                return
            headers = [(str(k), v) for k, v in (msg.headers() or ())]
            tag = next((v for k, v in headers if k == EPOCH_HEADER), None)
            if (
                tag is not None
                and tag.startswith(self.prefix)
                and tag[len(self.prefix) :].isdigit()
            ):
                epoch = int(tag[len(self.prefix) :])
                yield offset, epoch, (p, msg.key(), msg.value(), headers)
            if offset + 1 >= end:
                return
