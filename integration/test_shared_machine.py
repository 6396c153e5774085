"""Two checkouts' services and test sessions on one machine (docs/testing.md, "Running two
suites on one machine"): ports are claimed machine-wide, the Kafka proxy's advertised port
included, and the leak check sees only its own session's temporary folders.

No server is started here: the port choices are the harness's own (the real starts are
exercised by ``integration/two_suites.py``, which runs two suites with their own servers).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import leaks
import pytest
from _services import common
from _services.common import StartReport, choose_port, claim_ports, free_port, release_ports
from _services.kafka import Kafka


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private build cache (where claims live) and two work folders, ``a`` and ``b``."""
    monkeypatch.setenv("TXSINK_SERVICES_CACHE", str(tmp_path / "cache"))
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    return tmp_path


def _in(monkeypatch: pytest.MonkeyPatch, work: Path) -> None:
    monkeypatch.setattr(common, "WORK_DIR", work)


def test_a_port_claimed_by_another_checkout_is_never_chosen(
    machine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A port nothing binds (like the Kafka proxy's advertised one): free for everybody.
    default = free_port()
    _in(monkeypatch, machine / "a")
    assert choose_port(default, None, set()) == default
    _in(monkeypatch, machine / "b")
    assert choose_port(default, None, set()) != default
    assert choose_port(default, default, set()) != default, "not even as b's last port"
    _in(monkeypatch, machine / "a")
    assert choose_port(default, default, set()) == default, "its own claim: kept on restart"

    # b says so when it finds a server of its own on a port a claimed first.
    _in(monkeypatch, machine / "b")
    assert claim_ports({default}) == [f"port {default} is also claimed by {machine / 'a'}"]

    # a's services purged: its claim goes; a checkout deleted: its claims go too.
    _in(monkeypatch, machine / "a")
    release_ports({default})
    _in(monkeypatch, machine / "b")
    assert choose_port(default, None, set()) == default
    (machine / "b").rmdir()
    _in(monkeypatch, machine / "a")
    assert choose_port(default, None, set()) == default


def test_two_kafkas_advertise_different_proxy_ports(
    machine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = []
    for name in ("a", "b"):
        _in(monkeypatch, machine / name)
        state: dict[str, object] = {}
        Kafka().assign_ports(state, set(), StartReport("kafka", {}))
        chosen.append(state)
    ports = [{k: v for k, v in s.items() if k.endswith("port")} for s in chosen]
    assert set(ports[0].values()).isdisjoint(ports[1].values()), ports


def test_the_leak_check_sees_only_this_sessions_temp_folders() -> None:
    mine = Path(tempfile.gettempdir())
    assert mine.name.startswith(f"txsink-session-{os.getpid()}-"), "no temp folder of its own"
    before = leaks.snapshot()
    other = mine.parent / f"txsink-cds-{os.urandom(4).hex()}"  # another session's build
    own = mine / "txsink-made-here"
    other.mkdir()
    own.mkdir()
    try:
        found = leaks.check(before, grace_s=0).temp
    finally:
        other.rmdir()
        own.rmdir()
    assert found == [str(own)]
