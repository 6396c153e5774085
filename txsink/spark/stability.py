"""Whether a restart's replay of an epoch deals its rows to the partitions it decided.

Sinks whose commit reads the epoch again (:attr:`~txsink.contract.SinkContract.
commits_from_data`: Kafka's replay and direct modes) verify each replayed partition against
the count and checksum decided for it. A decided epoch stays finishable only if the replay
gives the same rows, partition for partition, up to the partitions' numbering (which
:mod:`~txsink.connectors.kafka.fromreplay` matches by content). Spark does not promise it
(SPARK-28650); this module refuses, before any row is read, the plans that break it:

1. **rows that differ**: an expression Spark marks non-deterministic (``rand()``,
   ``uuid()``, ``monotonically_increasing_id()``, ``spark_partition_id()``, a UDF
   ``asNondeterministic()``), ``sample()`` (a random draw per partition, seeded anew at
   each start), ``limit()``/``offset()``/``tail()`` (whichever rows come first);
2. **a deal that depends on scheduling or on the order the source lists its partitions**,
   at the step that fixes the epoch's final partitioning: round-robin ``repartition(n)``
   (each input partition deals from a start fixed by its number), ``coalesce(n)`` (groups
   neighbouring partitions), range partitioning (``orderBy``, ``repartitionByRange``: its
   bounds come from a sample drawn per partition), ``REBALANCE``, and a shuffle whose
   partition count adaptive query execution picks at run time from the sizes of the map
   outputs (``repartition(key)`` without a number, a join or aggregation with
   ``spark.sql.adaptive.coalescePartitions.enabled``) — stateful streaming operators
   excepted, whose partition count the checkpoint fixes.

Stable: a hash ``repartition(n, *columns)`` (Spark's Murmur3 of the row's values), one
partition, and the source's own partitions (a Kafka offset range, a file split: the same
rows, perhaps under another number after a restart).

Where the plan comes from: classic PySpark walks Spark's analyzed logical plan through the
JVM (``df._jdf.queryExecution().analyzed()``, and inside ``foreachBatch`` the streaming
query's own plan, since the batch's DataFrame hides it behind a ``LogicalRDD``); Spark
Connect has the plan on the server only, so its text (``explain(extended)``, the analyzed
section) is parsed, with non-deterministic functions recognised by name.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txsink.errors import ConfigurationError
from txsink.observe.logs import get_logger

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from txsink.contract import SinkContract
    from txsink.protocol.log import TxLog

__all__ = [
    "PlanNode",
    "check_replayed",
    "check_stable",
    "parse_plan_text",
    "plan_of",
    "unstable_step",
]

#: Nodes that keep some rows and drop others by position or chance.
_ROW_PICKERS = {
    "Sample": "sample() draws rows at random in each partition, with a seed chosen anew at "
    "every start (and the partition's number)",
    "GlobalLimit": "limit() keeps whichever rows come first, which depends on scheduling",
    "LocalLimit": "limit() keeps whichever rows come first, which depends on scheduling",
    "Offset": "offset() skips whichever rows come first, which depends on scheduling",
    "Tail": "tail() keeps whichever rows come last, which depends on scheduling",
}
#: Non-deterministic expressions whose values a replay repeats (the same input file).
_STABLE_NONDETERMINISTIC = (
    "input_file_name(",
    "input_file_block_start(",
    "input_file_block_length(",
)
#: Non-deterministic functions, by the name Spark prints (Spark Connect's plan text).
_NONDETERMINISTIC_TEXT = re.compile(
    r"\b(rand|randn|random|uuid|shuffle|monotonically_increasing_id|spark_partition_id|"
    r"uniform|randstr)\("
)
#: Nodes that shuffle rows by a hash of their keys (joins, aggregations, windows...).
_HASH_SHUFFLES = {
    "Aggregate",
    "Distinct",
    "Deduplicate",
    "DeduplicateWithinWatermark",
    "Join",
    "Window",
    "Intersect",
    "Except",
    "FlatMapGroupsInPandas",
    "FlatMapCoGroupsInPandas",
    "FlatMapGroupsInArrow",
    "FlatMapCoGroupsInArrow",
    "FlatMapGroupsWithState",
    "TransformWithState",
    "FlatMapGroupsInPandasWithState",
}

_FIX = (
    "End the stream with a hash repartition by key columns before the sink "
    "(df.repartition(n, 'key')), drop the step, or use mode='wal' (the write-ahead log "
    "keeps the decided records, whatever the replay does)"
)


@dataclass(frozen=True)
class PlanNode:
    """One node of a logical plan, as the check needs it."""

    name: str  # the node's class name: Repartition, Project, Join...
    text: str  # its one-line description: "Repartition 4, true"
    nondeterministic: tuple[str, ...] = ()  # its expressions Spark marks non-deterministic
    children: tuple[PlanNode, ...] = ()
    streaming: bool = False

    def walk(self) -> Iterator[PlanNode]:
        yield self
        for child in self.children:
            yield from child.walk()


def unstable_step(
    plan: PlanNode, *, adaptive: bool = False, streaming_plan: PlanNode | None = None
) -> str | None:
    """Why ``plan`` may give a replay other rows per partition (None: stable).

    ``adaptive``: adaptive query execution may coalesce shuffle partitions here.
    ``streaming_plan``: the streaming query's plan behind a ``foreachBatch`` DataFrame's
    ``LogicalRDD`` (checked as part of it).
    """
    for part in (plan, streaming_plan):
        found = None if part is None else _rows(part)
        if found is not None:
            return found
    return _partitioning(plan, adaptive=adaptive, streaming_plan=streaming_plan)


def _rows(plan: PlanNode) -> str | None:
    """A step anywhere in ``plan`` that gives a replay other rows."""
    for node in plan.walk():
        if node.name in _ROW_PICKERS:
            return f"{_ROW_PICKERS[node.name]} ({node.text})"
        for expr in node.nondeterministic:
            if not any(expr.startswith(ok) or f" {ok}" in expr for ok in _STABLE_NONDETERMINISTIC):
                return f"{expr} is not deterministic: a replay computes other values"
    return None


def _partitioning(node: PlanNode, *, adaptive: bool, streaming_plan: PlanNode | None) -> str | None:
    """The step that fixes the final partitioning, if it deals rows unstably."""
    at: PlanNode | None = node
    while at is not None:
        node = at
        name, text = node.name, node.text
        if name == "Repartition":
            count, shuffle = _repartition_args(text)
            if count == 1:
                return None
            if shuffle:
                return (
                    f"repartition({count}) deals rows round-robin from a start fixed by each "
                    "input partition's number, so a restart whose source lists its "
                    "partitions in another order deals other rows to each partition"
                )
            return (
                f"coalesce({count}) groups neighbouring input partitions, which depend on "
                "the order the source lists them"
            )
        if name == "RepartitionByExpression":
            exprs, fixed = _by_expression_args(text)
            if not exprs:
                return "repartition() without columns deals rows round-robin"
            if re.search(r"\b(ASC|DESC)\b", exprs):
                return (
                    "a range partitioning (repartitionByRange) takes its bounds from a sample "
                    "drawn per input partition, which depends on their order"
                )
            if fixed is None and adaptive:
                return _adaptive(text)
            return None
        if name == "Sort" and text.rstrip().endswith("true"):
            return (
                "orderBy()/sort() partitions by ranges whose bounds come from a sample drawn "
                "per input partition, which depends on their order"
            )
        if name == "RebalancePartitions":
            return "a REBALANCE hint lets adaptive query execution split and merge partitions"
        if name in _HASH_SHUFFLES:
            if adaptive and not node.streaming:
                return _adaptive(text)
            if name != "Join":
                return None  # rows by a hash of their keys
            # A broadcast join keeps its streamed side's partitioning: that side must hold.
            return _any_child(node, adaptive=adaptive, streaming_plan=streaming_plan)
        if name == "Union":
            return _any_child(node, adaptive=adaptive, streaming_plan=streaming_plan)
        if name == "LogicalRDD":
            if streaming_plan is None:
                return None
            return _partitioning(streaming_plan, adaptive=adaptive, streaming_plan=None)
        # Anything else keeps its child's partitioning; a leaf is the source's own
        # partitions: the same rows, perhaps numbered otherwise (matched by content).
        at = node.children[0] if node.children else None
    return None


def _any_child(node: PlanNode, *, adaptive: bool, streaming_plan: PlanNode | None) -> str | None:
    for child in node.children:
        found = _partitioning(child, adaptive=adaptive, streaming_plan=streaming_plan)
        if found is not None:
            return found
    return None


def _adaptive(text: str) -> str:
    return (
        f"adaptive query execution picks the partition count of this shuffle ({text}) at run "
        "time from the sizes of its map outputs, which can differ in a replay; give the "
        "count (df.repartition(n, 'key') as the last step) or set "
        "spark.sql.adaptive.coalescePartitions.enabled=false"
    )


def _repartition_args(text: str) -> tuple[int, bool]:
    """``Repartition 4, true`` -> (4, shuffle)."""
    found = re.search(r"Repartition\s+(\d+),\s*(true|false)", text)
    if found is None:
        return 0, True
    return int(found[1]), found[2] == "true"


def _by_expression_args(text: str) -> tuple[str, int | None]:
    """``RepartitionByExpression [id#1L], 4`` -> ("id#1L", 4); no number -> None."""
    found = re.search(r"RepartitionByExpression\s+\[(.*)\](?:,\s*(\d+))?\s*$", text)
    if found is None:
        return "?", None
    return found[1], int(found[2]) if found[2] else None


# -- where the plan comes from -----------------------------------------------------------


def plan_of(df: DataFrame) -> tuple[PlanNode, PlanNode | None]:
    """``df``'s analyzed plan, and inside ``foreachBatch`` the streaming query's plan
    (classic PySpark; None where it is out of sight)."""
    if type(df).__module__.startswith("pyspark.sql.connect."):
        text = df._explain_string(extended=True)  # type: ignore[operator]
        return parse_plan_text(_analyzed_section(str(text))), None
    root = _from_jvm(df._jdf.queryExecution().analyzed())
    streaming = None
    if any(n.name == "LogicalRDD" for n in root.walk()):
        jplan = _streaming_query_plan(df)
        streaming = None if jplan is None else _from_jvm(jplan)
    return root, streaming


def _from_jvm(jnode: Any) -> PlanNode:
    exprs = jnode.expressions()
    odd = []
    for i in range(exprs.size()):
        expr = exprs.apply(i)
        if not expr.deterministic():
            odd.append(str(expr.sql()) if hasattr(expr, "sql") else str(expr))
    children = jnode.children()
    return PlanNode(
        name=str(jnode.nodeName()),
        text=str(jnode.simpleString(200)).lstrip("~ "),
        nondeterministic=tuple(_nondeterministic_parts(odd)),
        children=tuple(_from_jvm(children.apply(i)) for i in range(children.size())),
        streaming=bool(jnode.isStreaming()),
    )


def _nondeterministic_parts(exprs: list[str]) -> Iterator[str]:
    """An aliased expression (``rand(7) AS r``) as its function, for the message."""
    for expr in exprs:
        yield expr.split(" AS ")[0]


def _streaming_query_plan(df: DataFrame) -> Any:
    """The analyzed plan of the streaming query running this ``foreachBatch`` call: the
    batch's session is a clone whose query manager may list no query, so the sessions the
    query may have been started from are looked at too."""
    session = df.sparkSession
    query_id = session.sparkContext.getLocalProperty("sql.streaming.queryId")
    if query_id is None:
        return None
    jvm: Any = session._jvm
    candidates = [session._jsparkSession]
    for getter in ("getActiveSession", "getDefaultSession"):
        with contextlib.suppress(Exception):  # a Spark without it
            found = getattr(jvm.org.apache.spark.sql.SparkSession, getter)()
            if found.isDefined():
                candidates.append(found.get())
    for jsession in candidates:
        with contextlib.suppress(Exception):  # a session of another kind
            for jq in jsession.streams().active():
                if jq.id().toString() == query_id:
                    return jq.streamingQuery().logicalPlan()
    return None


def _analyzed_section(text: str) -> str:
    """The ``== Analyzed Logical Plan ==`` section of ``explain(extended=True)``'s text,
    without its schema line."""
    found = re.search(r"== Analyzed Logical Plan ==\n(.*?)(?:\n== |\Z)", text, re.S)
    lines = (found[1] if found else text).splitlines()
    # The section starts with the output schema ("id: bigint, key: string").
    if lines and not lines[0].lstrip("~ ").startswith(tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")):
        lines = lines[1:]
    return "\n".join(lines)


_PREFIX = re.compile(r"^(?:[ :|]  )*(?:[+:]- )?")


def parse_plan_text(text: str) -> PlanNode:
    """A plan tree from Spark's ``treeString`` text (``+-`` and ``:-`` under their
    parent, three columns per level)."""
    stack: list[tuple[int, str, list[Any]]] = []
    root: list[Any] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        prefix = _PREFIX.match(line)
        depth = len(prefix[0]) // 3 if prefix and prefix[0] else 0
        body = line[len(prefix[0]) if prefix else 0 :].strip()
        streaming = body.startswith("~")
        body = body.lstrip("~ ")
        name = body.split(" ", 1)[0].split("(", 1)[0]
        odd = tuple(m.group(0) + "...)" for m in _NONDETERMINISTIC_TEXT.finditer(body))
        entry: list[Any] = [name, body, odd, [], streaming]
        while stack and stack[-1][0] >= depth:
            stack.pop()
        (stack[-1][2] if stack else root).append(entry)
        stack.append((depth, body, entry[3]))
    if not root:
        raise ValueError("no plan in the text")
    return _built(root[0])


def _built(entry: list[Any]) -> PlanNode:
    name, body, odd, children, streaming = entry
    return PlanNode(name, body, odd, tuple(_built(c) for c in children), streaming)


def _adaptive_coalesces(df: DataFrame) -> bool:
    conf = df.sparkSession.conf
    try:
        on = str(conf.get("spark.sql.adaptive.enabled", "true")).lower() == "true"
        merge = str(conf.get("spark.sql.adaptive.coalescePartitions.enabled", "true")).lower()
    except Exception:  # a Spark without these settings
        return False
    return on and merge == "true"


def check_stable(df: DataFrame, sink_uids: list[str]) -> str:
    """Refuse ``df`` (the epoch as laid out for the sinks) if a replay could deal it
    differently; what was checked, for the start-up check's line."""
    try:
        plan, streaming = plan_of(df)
    except Exception as err:  # a plan Spark cannot show: the commit's checksums still hold
        return f"not checked (the plan could not be read: {type(err).__name__})"
    why = unstable_step(plan, adaptive=_adaptive_coalesces(df), streaming_plan=streaming)
    if why is None:
        return "each partition's rows are the same in a replay"
    raise ConfigurationError(
        f"sink(s) {', '.join(sink_uids)} commit a decided epoch from its replay, which must "
        f"give every partition the rows it had at the pre-commit, but {why}. {_FIX}",
        sink_uid=sink_uids[0] if len(sink_uids) == 1 else None,
        phase="check",
    )


#: The query runs whose plan was checked, with the sinks it was checked for: the check
#: walks the plan through the JVM (20-150 ms), once per query run is enough.
_CHECKED: set[tuple[str, tuple[str, ...]]] = set()


def check_replayed(df: DataFrame, sinks: Sequence[SinkContract[Any, Any]], log: TxLog) -> None:
    """The coordinator's check of the epoch ``df`` (as laid out) when a sink commits from
    its replay: once per streaming query run, at every one-shot write.

    A plan refused while the log holds a decided epoch is let through with a WARNING until
    that epoch is committed: only this plan's replay can finish it (a fixed plan would
    deal its rows otherwise); the first epoch after it is refused.
    """
    uids = tuple(s.uid for s in sinks if s.commits_from_data)
    if not uids:
        return
    run = _query_run(df)
    if run is not None and (run, uids) in _CHECKED:
        return
    try:
        check_stable(df, list(uids))
    except ConfigurationError as err:
        pending = log.pending()
        if not pending:
            raise
        get_logger(__name__, uid="+".join(uids)).warning(
            "%s -- let through until decided epoch %d is committed (only its replay through "
            "this plan can finish it); change the plan after that",
            err,
            pending[0].epoch,
        )
        return
    if run is not None:
        _CHECKED.add((run, uids))


def _query_run(df: DataFrame) -> str | None:
    """This streaming query run's id (None outside a query, and under Spark Connect)."""
    if type(df).__module__.startswith("pyspark.sql.connect."):
        return None
    context = df.sparkSession.sparkContext
    query = context.getLocalProperty("sql.streaming.queryId")
    run = context.getLocalProperty("spark.jobGroup.id")  # the stream's run id
    return None if query is None else f"{query}/{run}"
