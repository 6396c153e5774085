"""The HTML report in a real browser: headless Chromium (Debian's ``chromium`` package).

What a person sees is what counts: Chromium must parse the page into the expected
sections (``--dump-dom``) and paint it (``--screenshot``). The log is a real one, written
by the coordinator over the files sink (partition tasks run in-process, no Spark): a
crash after a decision, and an aborted pre-commit.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from tests.chromium import CHROMIUM, run_chromium
from tests.memsink import batches_for, memory_precommit
from txsink import Coordinator
from txsink.errors import EpochAbortedError, InjectedFault
from txsink.ops.report import render_report
from txsink.protocol.faults import FaultPlan

pytestmark = pytest.mark.browser

EPOCHS = 4
SECTIONS = ("summary", "timeline", "latency", "pending", "voided", "lingering", "sinks")


def _chromium() -> Path:
    if CHROMIUM.exists():
        return CHROMIUM
    reason = f"{CHROMIUM} is missing: apt-get install chromium (Debian's package)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI installs it, so this is a broken CI image", pytrace=False)
    pytest.skip(reason)


def build_log(workdir: Path) -> Path:
    """Four epochs of the files sink; epoch 1 crashes after its decision (the restart's
    recovery commits it), epoch 2's first pre-commit fails (its round 0 is voided)."""
    from txsink.connectors.files import FilesSink

    plan = FaultPlan.parse(
        "after_decision:raise@1,before_precommit:raise@2#1", str(workdir / "faults")
    )

    def start() -> Coordinator:
        sink = FilesSink(workdir / "output", uid="events", format="jsonl")
        return Coordinator([sink], log=str(workdir / "txlog"), app_id="browser-app", faults=plan)

    coordinator, epoch, restarts = start(), 0, 0
    while epoch < EPOCHS:
        try:
            coordinator.run_epoch(
                epoch, memory_precommit(batches_for(epoch, 2, 50)), app_id="browser-app"
            )
            epoch += 1
        except (InjectedFault, EpochAbortedError):
            coordinator, restarts = start(), restarts + 1
    assert restarts == 2 and len(plan.fired()) == 2
    return workdir / "txlog"


def _run(args: list[str], profile: Path) -> bytes:
    return run_chromium([*args], profile)


@pytest.fixture
def report(tmp_path: Path) -> Path:
    _chromium()
    page = tmp_path / "report.html"
    page.write_text(render_report(build_log(tmp_path), title="Browser check"), encoding="utf-8")
    return page


def test_chromium_parses_every_section(report: Path, tmp_path: Path) -> None:
    dom = _run(["--dump-dom", report.as_uri()], tmp_path / "profile-dom").decode()
    for section in SECTIONS:
        assert f'id="{section}"' in dom, section
    for epoch in range(EPOCHS):
        assert f"epoch {epoch}: committed" in dom
    assert "round 0 voided: pre-commit failed" in dom
    assert "<h1>Browser check</h1>" in dom


def test_chromium_paints_the_report(report: Path, tmp_path: Path) -> None:
    png = tmp_path / "report.png"
    _run(
        [f"--screenshot={png}", "--window-size=1280,1400", report.as_uri()],
        tmp_path / "profile-shot",
    )
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1280, 1400)
    assert len(data) > 10_000, f"a {len(data)}-byte screenshot is blank or nearly"
