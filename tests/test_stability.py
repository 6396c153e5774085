"""The replay-stability check (txsink.spark.stability) and the outage rounds of a single pass,
on plan texts and scripted jobs: no Spark, no server.

The plan texts are Spark 4.3's own ``explain(extended=True)`` analyzed sections (the form
Spark Connect gives); the classic path walks the same nodes through the JVM
(integration/test_kafka_direct.py runs it on real queries).
"""

from __future__ import annotations

from typing import Any, NoReturn

import pytest

from txsink.errors import EpochAbortedError
from txsink.protocol.singlepass import SinglePassOutcome, run_single_pass_in_rounds
from txsink.spark.stability import _analyzed_section, parse_plan_text, unstable_step

SOURCE = "StreamingRelation FileSource[/in], [id#1L, key#2], name=<Unassigned>"


def _why(text: str, *, adaptive: bool = False, streaming: str | None = None) -> str | None:
    plan = parse_plan_text(text)
    behind = parse_plan_text(streaming) if streaming else None
    return unstable_step(plan, adaptive=adaptive, streaming_plan=behind)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        (f"~Repartition 4, true\n+- {SOURCE}", "round-robin"),
        (f"~Repartition 2, false\n+- {SOURCE}", "coalesce(2)"),
        (f"~RepartitionByExpression [id#1L ASC NULLS FIRST], 3\n+- {SOURCE}", "range"),
        (f"~Sample 0.0, 0.5, false, 2626, Bernoulli\n+- {SOURCE}", "sample()"),
        (f"GlobalLimit 3\n+- LocalLimit 3\n   +- {SOURCE}", "limit()"),
        (f"Sort [id#1L ASC NULLS FIRST], true\n+- {SOURCE}", "orderBy"),
        (
            f"~Project [id#1L, rand(-58) AS r#3]\n+- ~RepartitionByExpression [id#1L], 4\n"
            f"   +- {SOURCE}",
            "rand(...) is not deterministic",
        ),
        (f"~Project [id#1L, uuid(Some(-54)) AS u#8]\n+- {SOURCE}", "uuid(...)"),
        (f"~Union false, false\n:- {SOURCE}\n+- ~Repartition 3, true\n   +- {SOURCE}", "(3)"),
    ],
)
def test_unstable_plans_are_named(text: str, found: str) -> None:
    why = _why(text)
    assert why is not None and found in why, why


@pytest.mark.parametrize(
    "text",
    [
        SOURCE,
        f"~Repartition 1, true\n+- {SOURCE}",
        f"~RepartitionByExpression [id#1L], 4\n+- ~Repartition 4, true\n   +- {SOURCE}",
        f"~Project [id#1L, input_file_name() AS f#2]\n+- {SOURCE}",
        f"~Aggregate [key#2], [key#2, count(1) AS n#4L]\n+- ~Repartition 4, true\n   +- {SOURCE}",
        f"~Union false, false\n:- {SOURCE}\n+- {SOURCE}",
    ],
)
def test_stable_plans_pass(text: str) -> None:
    assert _why(text) is None


def test_adaptive_shuffles_without_a_count_are_refused_unless_streaming_state() -> None:
    by_key = f"RepartitionByExpression [id#1L]\n+- {SOURCE}"
    assert _why(by_key) is None
    assert "adaptive" in (_why(by_key, adaptive=True) or "")
    # A static aggregation under AQE: the partition count is picked at run time.
    assert "adaptive" in (_why(f"Aggregate [key#2], [key#2]\n+- {SOURCE}", adaptive=True) or "")
    # A streaming (stateful) aggregation: the checkpoint fixes its partitions.
    assert _why(f"~Aggregate [key#2], [key#2]\n+- {SOURCE}", adaptive=True) is None
    # A hash repartition with a count is stable under AQE.
    assert _why(f"RepartitionByExpression [id#1L], 4\n+- {SOURCE}", adaptive=True) is None


def test_a_foreach_batch_dataframe_is_judged_with_its_streaming_query() -> None:
    batch = "LogicalRDD [id#1L, key#2], false"
    stream = (
        f"~WriteToMicroBatchDataSourceV1 ForeachBatchSink\n+- ~Repartition 4, true\n   +- {SOURCE}"
    )
    assert "round-robin" in (_why(batch, streaming=stream) or "")
    # A hash repartition in foreachBatch fixes the deal, whatever the stream did.
    rehashed = f"RepartitionByExpression [key#2], 4\n+- {batch}"
    assert _why(rehashed, streaming=stream) is None
    # Non-deterministic rows in the stream cannot be fixed by the partitioning.
    sink = "~WriteToMicroBatchDataSourceV1 ForeachBatchSink"
    odd = f"{sink}\n+- ~Project [rand(7) AS r#3]\n   +- {SOURCE}"
    assert "rand" in (_why(rehashed, streaming=odd) or "")


def test_the_analyzed_section_is_cut_from_explain_text() -> None:
    text = (
        "== Parsed Logical Plan ==\n'Project [*]\n+- x\n\n== Analyzed Logical Plan ==\n"
        f"id: bigint, key: string\n~Repartition 4, true\n+- {SOURCE}\n\n"
        "== Optimized Logical Plan ==\n~Repartition 4, true\n"
    )
    plan = parse_plan_text(_analyzed_section(text))
    assert [n.name for n in plan.walk()] == ["Repartition", "StreamingRelation"]


# -- the outage rounds of a single-pass epoch ---------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, msg: str, *args: Any) -> None:
        self.lines.append(msg % args)


def _failing(times: int, clock: _Clock, each_s: float = 1.0) -> Any:
    calls: list[int] = []

    def run(round_: int) -> SinglePassOutcome:
        calls.append(round_)
        clock.now += each_s
        if len(calls) <= times:
            err = RuntimeError("connection refused")
            err.txsink_single_pass = SinglePassOutcome(job_failed=True)  # type: ignore[attr-defined]
            raise err
        return SinglePassOutcome(decided=True)

    run.calls = calls  # type: ignore[attr-defined]
    return run


def _abort(round_: int, err: BaseException) -> NoReturn:
    raise EpochAbortedError(f"aborted round {round_}: {err}")


class _Steps:
    def __init__(self, voided: list[int]) -> None:
        self.voided, self.claimed = voided, iter(range(1, 100))

    def claim(self) -> int:
        return next(self.claimed)

    def void(self, round_: int, err: BaseException) -> None:
        self.voided.append(round_)

    def abort(self, round_: int, err: BaseException) -> NoReturn:
        _abort(round_, err)


def _rounds(run: Any, clock: _Clock, outage_s: float, voided: list[int]) -> tuple[int, Any]:
    return run_single_pass_in_rounds(
        0,
        0,
        outage_s=outage_s,
        run=run,
        steps=_Steps(voided),
        logger=_Log(),  # type: ignore[arg-type]
        describe=str,
        clock=clock,
        sleep=clock.sleep,
    )


def test_an_outage_shorter_than_the_bound_is_ridden_out_in_new_rounds() -> None:
    clock, voided = _Clock(), list[int]()
    run = _failing(4, clock)
    round_, out = _rounds(run, clock, 30.0, voided)
    assert out.decided and round_ == 4 and voided == [0, 1, 2, 3]
    assert clock.slept == [0.5, 1.0, 2.0, 4.0]  # doubling pauses, nothing open meanwhile


def test_an_outage_longer_than_the_bound_fails_the_epoch() -> None:
    clock, voided = _Clock(), list[int]()
    with pytest.raises(EpochAbortedError, match="connection refused"):
        _rounds(_failing(100, clock), clock, 10.0, voided)
    assert clock.now < 20 and len(voided) >= 3


def test_without_a_bound_a_failed_job_fails_at_once() -> None:
    clock, voided = _Clock(), list[int]()
    with pytest.raises(EpochAbortedError):
        _rounds(_failing(1, clock), clock, 0.0, voided)
    assert voided == [] and clock.slept == []
