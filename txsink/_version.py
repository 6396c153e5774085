"""The txsink release (one place: the package, savepoints and the CLI read it), and the
versions an internal error names (:class:`~txsink.errors.InternalError`)."""

from __future__ import annotations

__version__ = "0.1.0"

#: The distributions whose APIs txsink calls on every path, as a bug report names them.
_REPORTED = ("pyspark", "pyarrow", "pandas")


def installed_versions() -> dict[str, str]:
    """txsink's, Python's and the installed PySpark's, pyarrow's and pandas' versions, read
    from the installed distributions' metadata (nothing is imported): ``{"txsink":
    "0.1.0", "python": "3.11.7", "pyspark": "3.5.9", ...}``; a missing one is
    ``"not installed"``."""
    import platform
    from importlib import metadata

    found = {"txsink": __version__, "python": platform.python_version()}
    for name in _REPORTED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found
