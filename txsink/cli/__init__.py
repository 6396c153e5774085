"""The ``txsink`` command line: one table of commands.

The core's commands (``status``, ``inspect``, ``check``, ``audit``, ``chaos``, and the
operator commands ``savepoint``, ``state``, ``recover`` and ``abort``) and those connectors register
(``demo``, by the files connector) through :mod:`txsink.registry`.

May import: every room of txsink/ (the top of the order), and a connector only through
the registry. Loading a user's pipeline file (``--pipeline``) is :mod:`txsink.cli.pipeline`.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
from collections.abc import Callable
from typing import NamedTuple

from txsink import registry
from txsink.errors import TxsinkError
from txsink.observe.logs import install_console

__all__ = ["Command", "commands", "exit_after", "log_location_help", "main"]


class Command(NamedTuple):
    """One ``txsink`` subcommand: its help line, its arguments, and what runs it."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def log_location_help(what: str = "the txsink log") -> str:
    """``--log`` help: a path, or a URL of a store some installed connector registers."""
    schemes = sorted(registry.log_store_schemes())
    urls = ", ".join(f"{s}://..." for s in schemes)
    return f"{what}: a local or mounted path{f', or {urls}' if urls else ''}"


def _core() -> dict[str, Command]:
    from txsink.cli import audit, chaos, check, inspect, operate, state, status

    return {
        "status": Command(
            "show the epochs of a txsink log", status.add_arguments, status.status_command
        ),
        "inspect": Command(
            "write an HTML report (and optionally a CSV table) of a txsink log",
            inspect.add_arguments,
            inspect.inspect_command,
        ),
        "check": Command(
            "check a pipeline before it starts: every sink against its target, the log",
            check.add_arguments,
            check.check_command,
        ),
        "savepoint": Command(
            "create or restore a savepoint of the txsink log (and checkpoint)",
            state.add_savepoint_arguments,
            state.savepoint_command,
        ),
        "state": Command(
            "upgrade pipeline state (rename a sink uid)",
            state.add_state_arguments,
            state.state_command,
        ),
        "recover": Command(
            "commit decided epochs and abort lingering transactions, by hand",
            operate.add_recover_arguments,
            operate.recover_command,
        ),
        "abort": Command(
            "abort lingering (undecided) transactions, by hand",
            operate.add_abort_arguments,
            operate.abort_command,
        ),
        "audit": Command(
            "prove that the targets hold what the log decided, epoch by epoch",
            audit.add_arguments,
            audit.audit_command,
        ),
        "chaos": Command(
            "run pipelines under fault plans and verify them (run, soak)",
            chaos.add_arguments,
            chaos.chaos_command,
        ),
    }


def commands() -> dict[str, Command]:
    """Every subcommand: the core's, then each registered connector's (sorted by name)."""
    table = _core()
    for record in registry.connectors().values():
        for name, ref in sorted(record.commands.items()):
            if name in table:
                raise TxsinkError(
                    f"connector {record.name!r} registers command {name!r}, which exists already"
                )
            command = registry.load(ref, record)
            if not isinstance(command, Command):
                raise TxsinkError(f"connector {record.name!r}: {ref} is not a txsink.cli.Command")
            table[name] = command
    return table


def main(argv: list[str] | None = None) -> int:
    """The ``txsink`` command. Output piped into a reader that stops early
    (``txsink status --json | head``) ends the command quietly, as a broken pipe ends
    ``cat``: exit status 141 (128 + SIGPIPE), no traceback."""
    try:
        code = _run(argv)
        sys.stdout.flush()  # inside the try: a buffered tail hits the closed pipe here
    except BrokenPipeError:
        if not _silence_closed_streams():
            raise  # a pipe to something else (a socket, a child) broke: a real error
        return _BROKEN_PIPE_EXIT
    return code


#: What a shell reports for a command a broken pipe killed (128 + SIGPIPE).
_BROKEN_PIPE_EXIT = 128 + 13


def _silence_closed_streams() -> bool:
    """Point stdout and stderr at /dev/null if their reader has gone, so neither the rest of
    the command nor Python's flush at exit writes into the closed pipe; True if one had."""
    closed = False
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
        except (AttributeError, ValueError, OSError):
            continue
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        # The write end of a pipe whose read end is closed polls as POLLERR.
        if any(events & select.POLLERR for _, events in poller.poll(0)):
            closed = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
    return closed


def _run(argv: list[str] | None) -> int:
    table = commands()
    # A connector that cannot be loaded is left out (with its commands); the others work.
    broken = "\n".join(f"  {u.error()}" for u in registry.unloadable().values())
    parser = argparse.ArgumentParser(
        prog="txsink",
        description="exactly-once sinks for Spark",
        epilog=f"not loaded:\n{broken}" if broken else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in table.items():
        command.add_arguments(sub.add_parser(name, help=command.help))
    args = parser.parse_args(argv)
    # The commands print what they did; txsink's own lines only from WARNING up here.
    install_console(default="warning")
    try:
        return table[args.command].run(args)
    except TxsinkError as err:
        print(f"txsink {args.command}: {err}", file=sys.stderr)
        return 1


def exit_after() -> None:
    """The console script ``txsink`` and ``python -m txsink.cli``: :func:`main`, then leave
    with ``os._exit`` once every stream and log handler is flushed. Arrow's thread pools can
    outlive a short process's last Arrow call and abort it during the interpreter's teardown
    (apache/arrow#34314: ``terminate called without an active exception``, exit code -6,
    after ``txsink chaos soak`` had printed its whole report). The command's own exit code
    is kept; Spark's JVM, if one was started, ends when its parent's pipe closes."""
    import contextlib
    import logging

    code = main()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader that stopped early
            stream.flush()
    os._exit(code)
