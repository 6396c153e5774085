"""The txsink release (one place: the package, savepoints and the CLI read it)."""

__version__ = "0.1.0"
