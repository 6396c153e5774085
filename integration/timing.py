"""Where a suite's time goes: ``python integration/timing.py [integration/.work/junit.xml]``.

``./dev test`` writes every test's time to ``integration/.work/junit.xml``; this prints the
time per file and the slowest tests, so a change that makes the default suite slower is
seen by its file, not only in the total (docs/testing.md, "Where the time goes").
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent / ".work" / "junit.xml"


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT
    cases = ET.parse(path).getroot().iter("testcase")
    per_file: dict[str, float] = defaultdict(float)
    tests: list[tuple[float, str]] = []
    for case in cases:
        seconds = float(case.get("time") or 0)
        module = (case.get("classname") or "").replace(".", "/")
        per_file[module] += seconds
        tests.append((seconds, f"{module}::{case.get('name')}"))
    total = sum(per_file.values())
    print(f"{len(tests)} tests, {total / 60:.1f} min in tests\n\nper file (top 25):")
    for name, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {seconds:7.0f} s  {100 * seconds / total:4.1f}%  {name}")
    print("\nslowest tests (top 25):")
    for seconds, name in sorted(tests, reverse=True)[:25]:
        print(f"  {seconds:7.0f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
