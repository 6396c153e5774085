"""The feed: the Spark settings that decide how rows reach a writer's tasks, one thing a
benchmark applies to its whole session, so every writer of a run gets the same.

txsink lifts Spark's Arrow batch byte cap (``spark.sql.execution.arrow.maxBytesPerBatch``,
:func:`txsink.spark.versions.arrow_byte_cap_setting`; none on Spark 3.5) for its own
jobs: Spark then cuts the batches handed
to Python by rows only, and the JVM skips measuring every row (about half of its cost of
handing rows over). A baseline that runs ``mapInArrow`` under Spark's default pays that
cost, txsink does not: a comparison that measures the feed, not the writer. Hence two
feeds, chosen with ``--feed``:

``same``      the cap lifted in the session for every writer (txsink then keeps the
              session's value): the writers are compared on the same feed. The default.
``defaults``  every writer as a user gets it out of the box: Spark's defaults for the
              baselines; txsink still lifts its own cap for its own jobs.
"""

from __future__ import annotations

import argparse

from txsink.spark.versions import arrow_byte_cap_setting

#: The value txsink sets for its own jobs (``txsink.spark.jobs``): Spark's check is off at
#: Int.MaxValue. ``integration/test_bench_cpu.py`` checks the two agree.
NO_BYTE_CAP = str(2**31 - 1)

FEEDS = {
    "same": "same feed: Spark's Arrow batch byte cap lifted in the session for every writer",
    "defaults": "Spark defaults: every writer as a user gets it; txsink still lifts the Arrow "
    "batch byte cap for its own jobs, the baselines keep Spark's",
}


def feed_conf(feed: str) -> dict[str, str]:
    """The session settings of ``feed`` (set before the session starts)."""
    if feed == "same":
        setting = arrow_byte_cap_setting()  # Spark 3.5 has no byte cap: nothing to lift
        return {setting: NO_BYTE_CAP} if setting is not None else {}
    if feed == "defaults":
        return {}
    raise ValueError(f"unknown feed {feed!r}: choose from {sorted(FEEDS)}")


def add_feed_option(parser: argparse.ArgumentParser) -> None:
    """``--feed same|defaults`` (see the module's docstring)."""
    parser.add_argument(
        "--feed",
        choices=sorted(FEEDS),
        default="same",
        help="same: Spark's Arrow batch byte cap lifted for every writer (default); "
        "defaults: every writer as a user gets it (txsink still lifts its own cap)",
    )


def feed_note(feed: str) -> str:
    """One line for a report: which feed the run had."""
    return f"Feed: **{FEEDS[feed]}**" + (
        " (`--feed defaults` gives the other report)."
        if feed == "same"
        else " (`--feed same` gives the like-for-like report)."
    )
