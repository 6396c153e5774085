"""``python -m txsink.cli``: the ``txsink`` command.

Leaves with ``os._exit`` once every stream and log handler is flushed: Arrow's thread pools
can outlive a short process's last Arrow call and abort it during the interpreter's
teardown (apache/arrow#34314: ``terminate called without an active exception``, exit code
-6, after ``txsink chaos soak`` had printed its whole report). The command's own exit code
is kept; Spark's JVM, if one was started, ends when its parent's pipe closes.
"""

import contextlib
import logging
import os
import sys

from txsink.cli import main

code = main()
logging.shutdown()
for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(OSError, ValueError):  # a reader that stopped early
        stream.flush()
os._exit(code)
