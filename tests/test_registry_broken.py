"""A registered connector that cannot be loaded breaks only itself.

A distribution is installed here for real, as ``importlib.metadata`` finds one (a
``*.dist-info`` folder on ``sys.path`` with ``METADATA`` and ``entry_points.txt``): it
registers a connector whose module is gone, as an editable install of a deleted checkout
does (``No module named 'txsink_sqlite'``), and one whose record is not a ``Connector``.
Every path that reaches connectors through the registry is asked for another connector
(the Data Source's options, the log store, the CLI's table, the testing adapters) and
works; asked for the broken one, it fails with the entry point, the distribution and the
import error.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from txsink import cli, registry
from txsink.datasource.options import parse_options
from txsink.errors import ConfigurationError, LogError
from txsink.protocol.log import open_log
from txsink.testing.adapter import adapter

MISSING = "txsink_gone_checkout_module"


@pytest.fixture
def broken_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A distribution ``gone-connectors 0.3`` on ``sys.path`` registering ``gone`` (its
    module does not exist) and ``notarecord`` (an object that is not a Connector)."""
    info = tmp_path / "site" / "gone_connectors-0.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gone-connectors\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(
        f"[{registry.GROUP}]\ngone = {MISSING}.plugin:CONNECTOR\nnotarecord = json:dumps\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    registry._scan.cache_clear()
    yield info
    registry._scan.cache_clear()


@pytest.mark.usefixtures("broken_distribution")
def test_only_the_broken_connector_fails_and_its_error_says_why() -> None:
    assert "gone" in registry.unloadable() and "notarecord" in registry.unloadable()
    assert "files" in registry.connectors() and "gone" not in registry.connectors()
    assert registry.connector("files").name == "files"
    with pytest.raises(ConfigurationError) as caught:
        registry.connector("gone")
    text = str(caught.value)
    assert f"'gone = {MISSING}.plugin:CONNECTOR'" in text, text  # the entry point
    assert "gone-connectors 0.3" in text, text  # its distribution
    assert f"ModuleNotFoundError: No module named '{MISSING}'" in text, text  # the cause
    assert "reinstall gone-connectors" in text, text  # the fix
    with pytest.raises(ConfigurationError, match=r"it is a function, not a txsink\.registry"):
        registry.connector("notarecord")
    with pytest.raises(ConfigurationError, match="registered but broken: gone, notarecord"):
        registry.connector("nope")


@pytest.mark.usefixtures("broken_distribution")
def test_the_data_source_log_cli_and_testing_paths_work_for_the_others(tmp_path: Path) -> None:
    config = parse_options(
        {"connector": "files", "path": str(tmp_path / "out"), "uid": "o", "log": str(tmp_path)}
    )
    assert config.sink.uid == "o"
    with pytest.raises(ConfigurationError, match=f"No module named '{MISSING}'"):
        parse_options({"connector": "gone", "uid": "o", "log": str(tmp_path)})
    assert open_log(tmp_path / "log").committed(0) is None
    with pytest.raises(LogError, match=f"no store is registered for scheme 'gone'.*{MISSING}"):
        open_log("gone://bucket/log")
    assert "status" in cli.commands()
    assert adapter("files") is not None


@pytest.mark.usefixtures("broken_distribution")
def test_the_cli_runs_and_its_help_names_what_was_not_loaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The command runs (and answers about the log, not about the registry).
    assert cli.main(["status", "--log", str(tmp_path / "log")]) == 1
    assert capsys.readouterr().err.startswith("txsink status: no txsink log at ")
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    help_text = capsys.readouterr().out
    assert "not loaded:" in help_text and f"No module named '{MISSING}'" in help_text
