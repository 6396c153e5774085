"""Headless Debian Chromium for the report's browser test and the docs screenshot.

The flags are what this machine's closed network needs: without the background-networking
ones, Chromium keeps trying to reach Google's hosts at every start.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def run_chromium(args: list[str], profile: Path, timeout: float = 120) -> bytes:
    """Run Chromium headless with a fresh profile folder; its stdout (``--dump-dom``)."""
    done = subprocess.run(
        [str(CHROMIUM), *HEADLESS_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"chromium exited with {done.returncode}: "
            + done.stderr.decode(errors="replace")[-2000:]
        )
    return done.stdout
