"""``python -m txsink.cli``: the ``txsink`` command (see :func:`txsink.cli.exit_after`)."""

from txsink.cli import exit_after

exit_after()
