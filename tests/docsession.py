"""The interpreter a page's python blocks share (started by :mod:`tests.docblocks`).

``python docsession.py FD``: reads one JSON request per line on stdin (``code``, padded
with newlines so tracebacks name the page's own lines; ``file``, the page), runs it in
one ``__main__`` namespace, and answers one JSON line on the file descriptor ``FD``: the
traceback or ``null``, and what the block printed on ``sys.stdout``. The block's output
also goes on to this process's stdout (the page's log). Only the standard library here.
"""

from __future__ import annotations

import contextlib
import io
import json
import linecache
import os
import sys
import traceback
from typing import Any


class _Tee(io.TextIOBase):
    def __init__(self, *streams: Any) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def main() -> None:
    answers = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    sys.argv = [""]
    sys.path[0] = ""  # as `python -c`: the working directory comes first
    scope: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    for line in sys.stdin:
        request = json.loads(line)
        printed = io.StringIO()
        error = None
        try:
            source, name = request["code"], request["file"]
            linecache.cache[name] = (len(source), None, source.splitlines(True), name)
            code = compile(source, name, "exec")
            with contextlib.redirect_stdout(_Tee(sys.stdout, printed)):
                exec(code, scope)
        except BaseException:
            error = traceback.format_exc()
        sys.stdout.flush()
        answers.write(json.dumps({"error": error, "stdout": printed.getvalue()}) + "\n")


if __name__ == "__main__":
    main()
