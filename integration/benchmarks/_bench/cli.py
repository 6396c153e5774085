"""The command line every benchmark shares: its options, and the run from start to report.

A benchmark builds a :class:`BenchParser` (the shared options; it adds its own), and its
``main`` hands :func:`main` that parser, its :class:`~.results.Results` class, the function
that measures and the function that renders; everything around the measuring (the record
of the machine and load, saving the results, ``--render``, the docs, the exit status) is
done here, once.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .env import machine
from .feed import add_feed_option
from .measure import log, uptime
from .report import add_doc_options, publish
from .results import Results

R = TypeVar("R", bound=Results)


@dataclass(frozen=True)
class Server:
    """The option that says where the benchmark's server is, defaulting to its variable."""

    flag: str  # "--dsn"
    env: str  # "TXSINK_PG_DSN"
    what: str  # "DSN", for the error when neither is given
    required: bool = True  # False: the server is optional (e.g. only for an extra option)

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


class BenchParser(argparse.ArgumentParser):
    """The options every benchmark has: ``--rows``, ``--partitions``, ``--repeat``,
    ``--warmup``, ``--feed`` (:mod:`.feed`), ``--writers``, ``--no-extras`` (when it has
    extras), ``--docs`` / ``--no-docs`` / ``--render`` and the server's address (``server``
    None: it needs none);
    :meth:`parse` checks them. ``options`` adds the benchmark's own options (after
    ``--writers``, where ``--help`` lists them)."""

    def __init__(
        self,
        results: type[Results],
        doc: str | None,
        *,
        writers: Sequence[str],
        server: Server | None,
        unit: str = "rows",
        rows: int = 1_000_000,
        partitions: str = "partition counts",
        partitions_default: str = "2,8",
        warmup: int = 1,
        extras: str | None = None,
        options: Callable[[BenchParser], None] | None = None,
    ) -> None:
        super().__init__(
            prog=f"integration/benchmarks/run {results.name}",
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        self.writers = tuple(writers)
        self.server = server
        self.counts: list[str] = []
        self.add_argument("--rows", type=int, default=rows, help=f"{unit} (default {rows})")
        self.add_argument(
            "--partitions",
            default=partitions_default,
            help=f"comma-separated {partitions} (default {partitions_default})",
        )
        self.add_argument("--repeat", type=int, default=1, help="runs per writer (default 1)")
        self.add_argument(
            "--warmup",
            type=int,
            default=warmup,
            help="untimed full-size runs of every writer before the timed ones (default "
            f"{warmup}): the JVM's JIT and the workers' imports are paid before any clock runs",
        )
        add_feed_option(self)
        self.add_argument(
            "--writers", default=",".join(writers), help=f"subset of {','.join(writers)}"
        )
        if options is not None:
            options(self)
        if extras is not None:
            self.add_argument("--no-extras", action="store_true", help=extras)
        add_doc_options(self, results.title)
        if server is not None:  # None: the benchmark needs no server
            self.add_argument(
                server.flag, default=os.environ.get(server.env), help=f"default: ${server.env}"
            )

    def add_count(self, flag: str, default: int, help: str) -> None:
        """An integer option that must be positive (checked with ``--rows`` and others)."""
        self.add_argument(flag, type=int, default=default, help=help)
        self.counts.append(flag)

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        """The options, with ``partitions`` and ``writers`` as lists, checked."""
        args = self.parse_args(argv)
        args.partitions = [int(p) for p in str(args.partitions).split(",") if p.strip()]
        args.writers = [w.strip() for w in str(args.writers).split(",") if w.strip()]
        unknown = set(args.writers) - set(self.writers)
        if unknown:
            self.error(f"unknown writers {sorted(unknown)}; choose from {list(self.writers)}")
        server = self.server
        if (
            server is not None
            and server.required
            and not getattr(args, server.dest)
            and args.render is None
        ):
            self.error(
                f"no {server.what}: set {server.env} (integration/benchmarks/run does) "
                f"or {server.flag}"
            )
        names = ["--rows", "--repeat", *self.counts, "--partitions"]
        counts = [getattr(args, name.removeprefix("--").replace("-", "_")) for name in names[:-1]]
        if args.warmup < 0:
            self.error("--warmup must not be negative")
        if min(counts) < 1 or not args.partitions or min(args.partitions) < 1:
            self.error(f"{', '.join(names[:-1])} and {names[-1]} must be positive")
        return args


def main(
    argv: Sequence[str] | None,
    parser: BenchParser,
    results: type[R],
    measure: Callable[[R, argparse.Namespace], Sequence[str]],
    render: Callable[[R], str],
) -> int:
    """Parse ``argv``; with ``--render`` only re-render saved results, else record the
    machine and load, ``measure`` (which fills the results and returns the void runs'
    messages), save the results, print and publish ``render``'s section. Exit status 1 if
    any run was void."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse(argv)
    if args.render is not None:
        saved = results.load(args.render)
        publish(saved, render(saved), args)
        return 1 if saved.void else 0
    started = time.monotonic()
    res = results.create(args, " ".join(["integration/benchmarks/run", results.name, *argv]))
    res.started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    res.uptime_before = uptime()
    res.machine = machine()
    log(f"start: {res.uptime_before}")
    void = measure(res, args)
    res.uptime_after = uptime()
    res.minutes = (time.monotonic() - started) / 60
    log(f"end: {res.uptime_after}")
    res.void = list(void)
    log(f"results saved in {res.save()} (rerender with --render)")
    publish(res, render(res), args)
    for message in res.void:
        print(message, file=sys.stderr)
    return 1 if res.void else 0
