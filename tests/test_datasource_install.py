"""``format("txsink")`` after every install: PySpark's lookup sees ``pyspark_txsink``.

PySpark lists top-level ``pyspark_*`` modules with ``pkgutil.iter_modules()`` in a fresh
Python worker. The wheel and the editable wheel are built here with the project's own build
backend (as pip builds them), unpacked as a site folder (``site.addsitedir`` reads their
``.pth`` files as a venv's start does), and listed the way that lookup lists them. The whole
path through Spark runs in README.md's Data Source block (tests/test_docs.py, in the venv
that ``./dev`` installs editable). Where the format is missing anyway, txsink's commands say
the one line that registers it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from txsink.runner import FATAL_EXIT

ROOT = Path(__file__).resolve().parents[1]

_LIST = """
import importlib.util, json, os, pkgutil, site, sys
site.addsitedir(sys.argv[1])
spec = importlib.util.find_spec("pyspark_txsink")
print(json.dumps({
    "modules": sorted(m.name for m in pkgutil.iter_modules()),
    "origin": spec and os.path.realpath(spec.origin),
}))
"""


def _build(kind: str, out: Path, project: Path = ROOT) -> Path:
    """``build_wheel`` or ``build_editable`` of ``project``, by the backend its
    pyproject.toml names (as pip builds it)."""
    system = tomllib.loads((project / "pyproject.toml").read_text())["build-system"]
    paths = [str(project / p) for p in system.get("backend-path", [])]
    code = (
        "import importlib, sys; sys.path[:0] = sys.argv[4:]; "
        "backend = importlib.import_module(sys.argv[1]); "
        "print(getattr(backend, 'build_' + sys.argv[2])(sys.argv[3]))"
    )
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-c", code, system["build-backend"], kind, str(out), *paths],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / proc.stdout.strip().splitlines()[-1]


def _listed(wheel: Path, tmp_path: Path) -> dict[str, object]:
    """The wheel unpacked as a site folder, listed by a Python that sees nothing else."""
    site_dir = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site_dir)
    proc = subprocess.run(
        [sys.executable, "-S", "-c", _LIST, str(site_dir)],
        cwd=tmp_path,  # not the repository: "-c" puts the working folder on sys.path
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    listed: dict[str, object] = json.loads(proc.stdout)
    return listed


def test_the_editable_install_lists_pyspark_txsink_and_nothing_else(tmp_path: Path) -> None:
    wheel = _build("editable", tmp_path / "dist")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        pth = archive.read("txsink_pyspark_entry.pth").decode()
        record = archive.read(next(n for n in names if n.endswith(".dist-info/RECORD")))
    assert Path(pth.strip()) == ROOT / "pyspark-entry"
    assert b"\ntxsink_pyspark_entry.pth,sha256=" in record
    # The folder on sys.path holds the module only: no top-level connectors, tests...
    assert sorted(os.listdir(ROOT / "pyspark-entry")) == ["pyspark_txsink.py"]
    listed = _listed(wheel, tmp_path)
    modules = listed["modules"]
    assert isinstance(modules, list)
    assert "pyspark_txsink" in modules
    assert not {"connectors", "tests", "integration", "conftest"} & set(modules)
    assert listed["origin"] == str((ROOT / "pyspark_txsink.py").resolve())


def test_the_wheel_lists_pyspark_txsink_from_its_root(tmp_path: Path) -> None:
    # Built from a copy of what an sdist holds: setuptools' build/ stays out of the repository.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "MANIFEST.in", "pyspark_txsink.py"):
        shutil.copy2(ROOT / name, source / name)
    for name in ("txsink", "connectors", "build-backend", "pyspark-entry"):
        ignored = shutil.ignore_patterns("__pycache__", "*.egg-info")
        shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=ignored)
    wheel = _build("wheel", tmp_path / "dist", project=source)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "pyspark_txsink.py" in names
    assert not [n for n in names if n.endswith(".pth")]
    listed = _listed(wheel, tmp_path)
    modules = listed["modules"]
    assert isinstance(modules, list) and "pyspark_txsink" in modules
    assert listed["origin"] == str((tmp_path / "site" / "pyspark_txsink.py").resolve())


JOB = """
import os, sys
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession


def main():
    spark = SparkSession.builder.master("local[1]").getOrCreate()
    (spark.range(3).write.format("txsink").option("connector", "files")
        .option("path", "out").option("uid", "u").option("log", "log")
        .option("app_id", "a").save())


def pipeline():
    main()
"""


@pytest.mark.spark_line("4")  # Spark 3.5 has no Python Data Source: tests/test_spark_versions.py
@pytest.mark.parametrize(
    "command",
    [
        ["-m", "txsink.runner", "job.py:main"],
        ["-m", "txsink.cli", "check", "--pipeline", "job.py:pipeline", "--schema", "id long"],
    ],
    ids=["chaos-runner", "check"],
)
def test_a_missing_format_is_answered_with_the_line_that_registers_it(
    tmp_path: Path, command: list[str]
) -> None:
    """Spark's lookup fails (a ``pyspark_txsink`` that cannot be imported shadows the
    installed one), so Spark says ``DATA_SOURCE_NOT_FOUND`` for ``txsink``: txsink's line
    gives the fix."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "pyspark_txsink.py").write_text("raise ImportError('hidden by the test')\n")
    (tmp_path / "job.py").write_text(JOB)
    env = {**os.environ, "PYTHONPATH": str(shadow), "PYSPARK_PYTHON": sys.executable}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    proc = subprocess.run(
        [sys.executable, *command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    # The runner's child says a restart cannot help (the restarting parent stops there).
    assert proc.returncode == (FATAL_EXIT if "txsink.runner" in command else 1), proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("txsink")]
    assert said, proc.stderr[-3000:]
    assert "DATA_SOURCE_NOT_FOUND" in said[-1]
    assert "txsink.datasource.register(spark)" in said[-1]
