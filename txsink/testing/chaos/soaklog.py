"""A soak's results file: one JSON line per finished plan, appended as plans end.

What makes a long soak resumable (:func:`~txsink.testing.chaos.soak.soak` with ``results=``):
a run that is interrupted (a reboot, a session's end) loses at most the plans that were
running; the next run with the same file and settings reads which plan indices are in it
and runs the others. Lines of several soaks (other seeds or settings) may share a file:
each line carries its soak's settings, and a soak only counts its own.

:func:`summary` tallies a file (every soak in it, or those matching a filter) into the
tables of ``docs/reliability.md``; ``txsink chaos tally FILE`` prints them.
"""

from __future__ import annotations

import json
import os
import statistics
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["done_indices", "read", "settings_line", "summary"]


def settings_line(**settings: Any) -> dict[str, Any]:
    """The settings that identify a soak (JSON-normalised, so they compare equal after a
    round trip through the file)."""
    loaded: dict[str, Any] = json.loads(json.dumps(settings, sort_keys=True))
    return loaded


def read(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every complete line of the file (a line cut short by a crash is skipped)."""
    try:
        with open(path) as f:
            for raw in f:
                try:
                    line = json.loads(raw)
                except json.JSONDecodeError:
                    continue
                if isinstance(line, dict) and "report" in line:
                    yield line
    except FileNotFoundError:
        return


def done_indices(path: str | os.PathLike[str], settings: Mapping[str, Any]) -> set[int]:
    """The plan indices of the soak with these ``settings`` that the file holds."""
    return {int(line["index"]) for line in read(path) if line.get("soak") == dict(settings)}


def _pct(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]:.1f} s"


def _mode_of(fault: str) -> str:
    """``after_decision:kill-target=postgres@1`` -> ``kill-target``."""
    mode = fault.split("@", 1)[0].split("#", 1)[0].split("*", 1)[0].partition(":")[2]
    return mode.partition("=")[0] or "raise"


def summary(path: str | os.PathLike[str]) -> str:
    """Markdown tables: the totals, then per fault mode, then per server killed."""
    lines = list(read(path))
    if not lines:
        return f"no soak results in {os.fspath(path)}"
    reports = [line["report"] for line in lines]
    recovery = [s for r in reports for s in r.get("recovery_seconds", []) if s is not None]
    fired = sum(int(r.get("faults_fired", 0)) for r in reports)
    planned = sum(int(r.get("faults_planned", 0)) for r in reports)
    connectors = sorted({c for line in lines for c in line["soak"].get("connectors", [])})
    seeds = sorted({int(line["soak"]["seed"]) for line in lines})
    out = [
        "| plans | seeds | connectors | restarts | faults fired | servers killed | violations "
        "| recovery median | recovery p90 | recovery max |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| {len(reports)} | {', '.join(map(str, seeds))} | {', '.join(connectors)} "
        f"| {sum(int(r.get('restarts', 0)) for r in reports)} | {fired} / {planned} "
        f"| {sum(len(r.get('target_kills', [])) for r in reports)} "
        f"| **{sum(int(r.get('violations', 0)) for r in reports)}** "
        f"| {f'{statistics.median(recovery):.1f} s' if recovery else '-'} "
        f"| {_pct(recovery, 0.9)} | {_pct(recovery, 1.0)} |",
        "",
        "| fault mode | faults drawn | plans failed |",
        "|---|---:|---:|",
    ]
    modes: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for r in reports:
        drawn = {_mode_of(f) for f in (r.get("plan") or "").split(",") if f}
        for f in (r.get("plan") or "").split(","):
            if f:
                modes[_mode_of(f)] += 1
        disturbance = str(r.get("disturbance") or "")
        if disturbance:  # `second-driver@0+1.5s`, `poison=kafka@1#3:131072B`: a row each
            kind = disturbance.split("@", 1)[0].split("=", 1)[0]
            modes[kind] += 1
            drawn.add(kind)
        for mode in drawn:
            failed[mode] += 0 if r.get("ok") else 1
    out += [f"| `{m}` | {n} | {failed[m]} |" for m, n in sorted(modes.items())]
    kills: Counter[str] = Counter()
    causes: Counter[tuple[str, str]] = Counter()
    for r in reports:
        for kill in r.get("target_kills", []):
            name, _, rest = kill.partition(" killed by ")
            kills[name] += 1
            causes[(name, "a timer" if rest.startswith("timer") else "a crash point")] += 1
    if kills:
        out += ["", "| server killed | kills | at a crash point | at a random moment |"]
        out += ["|---|---:|---:|---:|"]
        out += [
            f"| {n} | {k} | {causes[(n, 'a crash point')]} | {causes[(n, 'a timer')]} |"
            for n, k in sorted(kills.items())
        ]
    return "\n".join(out)
