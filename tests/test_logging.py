"""What a running pipeline says: one line per epoch by default, silenced or redirected by
one switch, the user's own logging configuration first; every abort told once by the
core; a client library's burst of connection failures told as one WARNING per outage.

The output tests run a coordinator in a child process (as a user's job runs, with
logging unconfigured; pytest configures logging in its own process).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.memsink import Crasher, MemSink, MemTarget, batches_for, memory_precommit
from txsink import Coordinator, EpochAbortedError
from txsink.observe.logs import committed_text, one_line, seconds_text
from txsink.observe.outages import Failure, OutageFilter
from txsink.txid import TxnId

ROOT = Path(__file__).resolve().parent.parent

#: A job with one in-memory sink: three epochs, then Spark's replay of the last one.
JOB = """
import logging, sys
setup = sys.argv[2]
if setup == "user":
    logging.basicConfig(level=logging.INFO, format="USER %(name)s %(message)s")
if setup == "redirect":
    import txsink
    txsink.configure_logging("info", stream=open(sys.argv[3], "w"))
from tests.memsink import Crasher, MemSink, MemTarget, batches_for, memory_precommit
from txsink import Coordinator
coordinator = Coordinator(MemSink("mem", MemTarget(), Crasher()), log=sys.argv[1])
if setup == "late":  # the user configures logging after creating the coordinator
    logging.basicConfig(level=logging.INFO, format="USER %(name)s %(message)s")
for epoch in (0, 1, 2, 2):
    coordinator.run_epoch(epoch, memory_precommit(batches_for(epoch, 2, 3)), app_id="app")
"""

COMMITTED = re.compile(
    r"txsink: \[mem epoch (\d)\] committed: mem 6 rows "
    r"\(precommit \d+ ms, decide \d+ ms, commit \d+ ms\)"
)


def _job(tmp_path: Path, setup: str = "", *, env: dict[str, str] | None = None) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "TXSINK_LOG"}
    done = subprocess.run(
        [sys.executable, "-c", JOB, str(tmp_path / "txlog"), setup, str(tmp_path / "out.txt")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    assert done.stdout == ""
    return done.stderr


def test_a_default_run_prints_one_line_per_epoch(tmp_path: Path) -> None:
    lines = _job(tmp_path).splitlines()
    assert len(lines) == 4, lines
    assert [COMMITTED.fullmatch(line) is not None for line in lines[:3]] == [True] * 3, lines
    assert [m.group(1) for line in lines[:3] if (m := COMMITTED.fullmatch(line))] == list("012")
    assert lines[3] == "txsink: [mem epoch 2] already committed: Spark's replay skipped"


@pytest.mark.parametrize("level", ["off", "warning", "OFF"])
def test_txsink_log_silences_it(tmp_path: Path, level: str) -> None:
    assert _job(tmp_path, env={"TXSINK_LOG": level}) == ""


def test_an_unknown_txsink_log_says_so_once(tmp_path: Path) -> None:
    lines = _job(tmp_path, env={"TXSINK_LOG": "loud"}).splitlines()
    assert lines[0].startswith("txsink: WARNING TXSINK_LOG='loud' is not one of off, error,")
    assert len(lines) == 5 and COMMITTED.fullmatch(lines[1])


@pytest.mark.parametrize("setup", ["user", "late"])
def test_the_users_logging_configuration_wins(tmp_path: Path, setup: str) -> None:
    lines = _job(tmp_path, setup).splitlines()
    assert not [line for line in lines if line.startswith("txsink:")], lines
    assert lines[0].startswith("USER txsink.coordinator [uid=mem epoch=0] committed: mem 6 rows (")
    assert len(lines) == 4, lines


def test_configure_logging_redirects_it(tmp_path: Path) -> None:
    assert _job(tmp_path, "redirect") == ""
    lines = (tmp_path / "out.txt").read_text().splitlines()
    assert len(lines) == 4 and all(COMMITTED.fullmatch(line) for line in lines[:3]), lines


def test_configure_logging_refuses_an_unknown_level() -> None:
    from txsink import configure_logging

    with pytest.raises(ValueError, match="expected one of off, error, warning, info, debug"):
        configure_logging("loud")


def test_texts() -> None:
    assert seconds_text(0.0081) == "8 ms" and seconds_text(1.234) == "1.2 s"
    assert seconds_text(75.4) == "75 s"
    assert (
        committed_text(
            {"orders": 1200, "pg": 1},
            {"recover": 0.001, "precommit": 1.21, "decide": 0.006, "commit": 0.03},
        )
        == "orders 1,200 rows, pg 1 row (recover 1 ms, precommit 1.2 s, decide 6 ms, commit 30 ms)"
    )
    long = "word " * 100
    cut = one_line(f"\n  {long}\nsecond line", 60)
    assert cut.endswith("word…") and len(cut) <= 60 and "second" not in cut


# -- aborts: once each, by the core -------------------------------------------------------


def _aborts(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if name in r.getMessage()]


def test_every_abort_is_told_once_by_the_core(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A failed pre-commit aborts its round's transactions; recovery aborts what a crashed
    run left: each transaction in one INFO line of the coordinator's logger."""
    caplog.set_level(logging.DEBUG, logger="txsink")
    target = MemTarget()
    coordinator = Coordinator(MemSink("mem", target, Crasher()), log=str(tmp_path / "log"))
    ok = memory_precommit(batches_for(0, 2, 3))

    def failing(plan: object) -> list[object]:
        ok(plan)  # type: ignore[arg-type]
        raise RuntimeError("a task failed")

    with pytest.raises(EpochAbortedError):
        coordinator.run_epoch(0, failing, app_id="app")  # type: ignore[arg-type]
    left = TxnId("app", "mem", 1, 0, 0, 9)  # a crashed run's prepared transaction
    target.prepared[str(left)] = [1]
    coordinator.run_epoch(0, ok, app_id="app")
    assert target.prepared == {}
    for name in ["txsink.app.mem.e0.r0.p0.a0", "txsink.app.mem.e0.r0.p1.a1", str(left)]:
        told = _aborts(caplog, name)
        assert len(told) == 1, [r.getMessage() for r in told]
        assert told[0].name == "txsink.coordinator" and told[0].levelno == logging.INFO
        assert "aborted " + name in told[0].getMessage()
    committed = [
        r.getMessage() for r in caplog.records if "] committed: mem 6 rows" in r.getMessage()
    ]
    assert len(committed) == 1 and "(recover " in committed[0], committed  # recovery had work
    recovery = [r for r in caplog.records if "the previous run did not finish" in r.getMessage()]
    assert len(recovery) == 1 and recovery[0].levelno == logging.WARNING
    assert "1 prepared transaction(s) of epoch 1 no decision names" in recovery[0].getMessage()


# -- a client library's outages -----------------------------------------------------------


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class _Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def _refused(n: int) -> logging.LogRecord:
    text = f"[thrd:h:1/bootstrap]: h:1/bootstrap: Connect to ipv4#h:1 failed: refused #{n}"
    return logging.LogRecord("lib", logging.ERROR, "", 0, "%s [%s] %s", ("FAIL", "c", text), None)


def _classify(record: logging.LogRecord) -> Failure | None:
    args = record.args if isinstance(record.args, tuple) else ()
    return Failure("broker h:1", "Connection refused") if args[:1] == ("FAIL",) else None


def test_one_warning_per_outage_and_one_line_at_its_end() -> None:
    logger = logging.getLogger("txsink.tests.outages")
    handler = _Collect()
    seen = handler.records
    logger.addHandler(handler)
    clock = _Clock()
    outages = OutageFilter(logger, _classify, uid="k", clock=clock)
    try:
        for n in range(200):  # ~200 refused connections in 15 s
            clock.now += 0.075
            logger.handle(_refused(n))
        logger.handle(logging.LogRecord("lib", logging.ERROR, "", 0, "other %s", ("x",), None))
        outages.ended()
        outages.ended()  # no outage open: nothing
        clock.now += 500
        logger.handle(_refused(999))  # a new outage, much later
    finally:
        logger.removeHandler(handler)
    texts = [(r.levelname, r.getMessage()) for r in seen]
    assert texts == [
        ("WARNING", "[uid=k epoch=None] broker h:1 unreachable: Connection refused; retrying"),
        ("ERROR", "[uid=k epoch=None] other x"),
        (
            "INFO",
            "[uid=k epoch=None] broker h:1 reachable again after 15 s (199 more failure "
            "line(s) held back)",
        ),
        ("WARNING", "[uid=k epoch=None] broker h:1 unreachable: Connection refused; retrying"),
    ]
    assert all(getattr(r, "txsink_uid", None) == "k" for r in seen)


def test_a_failure_after_a_quiet_spell_opens_a_new_outage() -> None:
    logger = logging.getLogger("txsink.tests.quiet")
    handler = _Collect()
    seen = handler.records
    logger.addHandler(handler)
    clock = _Clock()
    OutageFilter(logger, _classify, quiet_s=60, clock=clock)
    try:
        for step in (0, 30, 30, 61, 10):  # the ended() call was missed: 61 s without a failure
            clock.now += step
            logger.handle(_refused(step))
    finally:
        logger.removeHandler(handler)
    assert [r.levelname for r in seen] == ["WARNING", "WARNING"]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_librdkafka_refused_connections_are_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A producer whose broker refuses every connection: librdkafka reports each attempt;
    the sink's logger passes one WARNING, then one line when an operation succeeds."""
    from confluent_kafka import Producer

    from txsink.connectors.kafka.clients.settings import KafkaSettings

    caplog.set_level(logging.INFO, logger="txsink")
    port = _closed_port()
    uid = f"refused{port}"
    settings = KafkaSettings(f"127.0.0.1:{port}", uid, "txsink", "markers", 1, 5.0)
    conf = settings.producer_conf(0, lambda *_: None)
    del conf["transactional.id"]  # a plain producer of the sink's settings
    producer = Producer(conf)
    producer.produce("t", b"x")
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        producer.poll(0.2)
    held = json.dumps([r.getMessage() for r in caplog.records])
    ours = [r for r in caplog.records if r.name.startswith("txsink.connectors.kafka.librdkafka")]
    assert [r.levelname for r in ours] == ["WARNING"], held
    assert ours[0].getMessage() == (
        f"[uid={uid} epoch=None] Kafka broker 127.0.0.1:{port} unreachable: Connection "
        "refused; retrying"
    )
    settings.reachable()
    held = json.dumps([r.getMessage() for r in caplog.records])
    ended = [r for r in caplog.records if "reachable again" in r.getMessage()]
    assert len(ended) == 1 and ended[0].levelname == "INFO", held
    assert re.search(r"after \d+(\.\d)? s \((\d+) more failure line\(s\) held back\)", held)
    assert int(re.findall(r"\((\d+) more failure", held)[0]) >= 2, held
    producer.purge()
    producer.flush(0)
