"""txsink's build backend: setuptools', plus one line for the editable wheel.

PySpark finds ``format("txsink")`` by listing top-level ``pyspark_*`` modules with
``pkgutil.iter_modules()``, in a fresh Python worker. A wheel puts ``pyspark_txsink.py`` in
site-packages, where that listing sees it. An editable install of this project cannot: its
package-dir mapping (``txsink.connectors`` lives in ``connectors/``) makes setuptools serve
every module through an import hook on ``sys.meta_path``, which ``pkgutil`` does not list
(setuptools issue 3548), and a plain path ``.pth`` for the repository root would also
install top-level ``connectors``, ``tests`` and ``integration``. So the editable wheel gets
one more ``.pth`` naming ``pyspark-entry/``, a folder that holds nothing but a link to
``pyspark_txsink.py`` (the module stays at the root, where the wheel's build finds it: a
``package-dir`` for ``""`` would also put setuptools' egg-info in that folder, a second
``txsink`` distribution on ``sys.path``). Every other hook is setuptools' own, unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (
    build_sdist,
    build_wheel,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

#: The folder that holds a link to ``pyspark_txsink.py`` and nothing else.
ENTRY_DIR = Path(__file__).resolve().parent.parent / "pyspark-entry"
#: The added ``.pth``: a path line, which ``site`` puts on ``sys.path`` at every start.
PTH_NAME = "txsink_pyspark_entry.pth"


def build_editable(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    """setuptools' editable wheel, with :data:`PTH_NAME` added (PEP 660 hook)."""
    name: str = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    add_file(Path(wheel_directory, name), PTH_NAME, f"{ENTRY_DIR}\n".encode())
    return name


def add_file(wheel: Path, name: str, content: bytes) -> None:
    """Add ``name`` at the root of ``wheel`` and to its RECORD (hash and size, as the
    wheel format requires), by writing the archive again beside it and replacing it."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    tmp = wheel.with_name(wheel.name + ".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        records = [i for i in src.infolist() if i.filename.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise RuntimeError(f"{wheel.name}: expected one RECORD, found {len(records)}")
        for info in src.infolist():
            data = src.read(info)
            if info is records[0]:
                data = data.rstrip(b"\n") + f"\n{name},sha256={digest},{len(content)}\n".encode()
                dst.writestr(name, content)
            dst.writestr(info, data)
    os.replace(tmp, wheel)
