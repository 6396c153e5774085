"""The pool's commit (txsink/connectors/kafka/clients/pool.py) with fake producers: when a reused
producer's task starts again, and from where. Against the real broker:
integration/test_kafka_pool.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from txsink.connectors.kafka.clients import pool
from txsink.connectors.kafka.clients.producers import StaleProducerError
from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.errors import FencedError, RetryableError


class FakeMarkers:
    def __init__(self) -> None:
        self.epoch: int | None = None
        self.waits: list[float | None] = []
        self.fail_reused_read = False

    def reread(self, app: str, shard: int, *, wait_s: float | None = None) -> int | None:
        self.waits.append(wait_s)
        if wait_s is not None and self.fail_reused_read:
            raise RetryableError("open transaction on the marker topic")
        return self.epoch


class FakeProducers:
    """ShardProducers as commit_shard uses it; ``stale``: the producers made so far that
    another producer fenced (their first records fail)."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.markers = FakeMarkers()
        self.made = 0
        self.current: int | None = None
        self.stale: set[int] = set()
        self.produced: list[tuple[int, Any]] = []  # (producer, item) of committed ones
        self.fail_commit_of: set[int] = set()

    def has(self, shard: int) -> bool:
        return self.current is not None

    def get(self, shard: int, phase: str = "commit") -> int:
        if self.current is None:
            self.made += 1
            self.current = self.made
        return self.current

    def drop(self, shard: int) -> None:
        self.current = None

    def close(self) -> None:
        self.current = None

    def confirm(self, shard: int) -> None:
        if self.current in self.stale:
            raise StaleProducerError("fenced")

    def transaction(
        self, shard: int, app: str, epoch: int, body: Callable[[Any], None], *, reused: bool
    ) -> None:
        producer = self.get(shard)
        pending: list[tuple[int, Any]] = []
        try:
            body(lambda item: pending.append((producer, item)))
            if producer in self.fail_commit_of:
                raise FencedError("taken over")
        except BaseException:
            self.drop(shard)
            raise
        self.produced += pending
        self.markers.epoch = epoch


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProducers]:
    pool.clear()
    made: list[FakeProducers] = []

    def factory(settings: KafkaSettings) -> FakeProducers:
        made.append(FakeProducers(settings))
        return made[-1]

    monkeypatch.setattr(pool, "ShardProducers", factory)
    pool.shard_producers(SETTINGS)
    yield made[0]
    pool.clear()


SETTINGS = KafkaSettings("b:9092", "u", "txsink", "m", 1, 30.0, {"sasl.password": "secret"})


def commit(epoch: int, items: list[str], log: list[str] | None = None) -> bool:
    log = [] if log is None else log

    def produce(producer: Any, item: str) -> int:
        producer(item)
        log.append(item)
        return 0 if item == "" else 1

    return pool.commit_shard(
        SETTINGS, 0, "app", epoch, items=iter(items), produce=produce, start=log.clear
    )


def test_reused_producer_commits_without_a_new_one(fake: FakeProducers) -> None:
    assert commit(0, ["a", "b"]) and commit(1, ["c"])
    assert fake.made == 1 and [i for _, i in fake.produced] == ["a", "b", "c"]
    # The first task's producer was fresh: full wait; the reused one: a short wait.
    assert fake.markers.waits == [None, pool.REUSED_MARKER_WAIT_S]
    assert not commit(1, ["c"])  # the marker says committed: nothing produced
    assert fake.made == 1


def test_fenced_reused_producer_starts_again_from_the_first_item(fake: FakeProducers) -> None:
    commit(0, ["a"])
    fake.stale.add(1)  # another worker initialised the shard's id since
    log: list[str] = []
    assert commit(1, ["", "b", "c"], log)  # an empty first item: kept until confirmed
    assert fake.made == 2
    assert [(p, i) for p, i in fake.produced if i != "a"] == [(2, ""), (2, "b"), (2, "c")]
    assert log == ["", "b", "c"]  # start() reset the caller's counts


def test_failure_after_confirmation_is_not_retried(fake: FakeProducers) -> None:
    commit(0, ["a"])
    fake.fail_commit_of.add(1)
    with pytest.raises(FencedError):
        commit(1, ["b", "c"])  # "b" confirmed: the items are gone, so it raises
    assert fake.made == 1 and not fake.has(0)  # and the producer was dropped


def test_failure_of_a_reused_producer_before_confirmation_is_retried(
    fake: FakeProducers,
) -> None:
    commit(0, ["a"])
    fake.fail_commit_of.add(1)
    assert commit(1, ["", ""])  # nothing confirmed (no records): safe to start again
    assert fake.made == 2


def test_a_fresh_producer_is_not_retried(fake: FakeProducers) -> None:
    fake.fail_commit_of.add(1)
    with pytest.raises(FencedError):
        commit(0, [""])
    assert fake.made == 1


def test_a_reused_producer_stuck_on_the_marker_topic_is_replaced(fake: FakeProducers) -> None:
    commit(0, ["a"])
    fake.markers.fail_reused_read = True
    assert commit(1, ["b"])
    assert fake.made == 2 and fake.markers.waits[-2:] == [pool.REUSED_MARKER_WAIT_S, None]


def test_pooled_producer_reports_fresh_once(fake: FakeProducers) -> None:
    assert pool.pooled_producer(SETTINGS, 0) == (1, True)
    assert pool.pooled_producer(SETTINGS, 0) == (1, False)
    pool.evict(SETTINGS, 0)
    assert pool.pooled_producer(SETTINGS, 0) == (2, True)


def test_a_transaction_over_half_its_timeout_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """WAL, replay and direct mode warn the same way (direct: from the task's start)."""
    from txsink.connectors.kafka.clients.producers import warn_if_slow

    settings = KafkaSettings(
        "b:9092", "u", "txsink", "m", 1, 30.0, {"transaction.timeout.ms": 20000}
    )
    with caplog.at_level("WARNING"):
        warn_if_slow(settings, 3, 7, 9.0)
        assert not caplog.records
        warn_if_slow(settings, 3, 7, 11.0)
    (record,) = caplog.records
    assert (
        "shard 3" in record.getMessage() and "transaction.timeout.ms (20s)" in record.getMessage()
    )


# -- a fenced producer's flush, whatever it raises -----------------------------------------


class _FlushRaises:
    """A producer whose flush fails as a fenced one's can in confluent-kafka 2.16."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def flush(self, timeout: float) -> int:
        raise self.exc


@pytest.mark.parametrize(
    "exc",
    [SystemError("<method 'key'> returned a result with an exception set"), RuntimeError("?")],
    ids=["system-error", "anything-else"],
)
def test_a_reused_producer_whose_flush_fails_in_any_way_is_stale(exc: BaseException) -> None:
    """Found by the steady-state replay benchmark: a pooled producer fenced by another
    worker's producer of the same shard raised an error from flush that no typed clause
    caught; the Python worker died and the decided epoch's commit failed instead of being
    taken over by a fresh producer. Any failure of that flush now says "stale", which
    :func:`pool.commit_shard` answers with a fresh producer."""
    from txsink.connectors.kafka.clients.producers import ShardProducers

    producers = ShardProducers(KafkaSettings("b:9092", "t", "txsink", "markers", 2, 5.0))
    producers._producers[3] = _FlushRaises(exc)
    with pytest.raises(StaleProducerError, match="shard 3"):
        producers.confirm(3)


def test_the_delivery_callback_never_raises_into_librdkafka() -> None:
    """With a fatal error pending, reading the failed message raises inside the callback:
    the error alone is kept."""
    from confluent_kafka import KafkaError

    from txsink.connectors.kafka.clients.producers import on_failed_delivery

    class Msg:
        def key(self) -> bytes:
            raise SystemError("returned a result with an exception set")

    errors: list[Any] = []
    on_failed_delivery(errors, KafkaError(KafkaError._FENCED), Msg())
    on_failed_delivery(errors, KafkaError(KafkaError._FENCED), Msg())
    assert len(errors) == 1 and "_FENCED" in errors[0]
