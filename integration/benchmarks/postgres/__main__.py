"""``python -m benchmarks.postgres`` (what ``integration/benchmarks/run postgres`` runs)."""

import sys
from pathlib import Path

try:
    from benchmarks.postgres.main import main
except ImportError:  # run as a plain script: python integration/benchmarks/postgres
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.postgres.main import main

sys.exit(main())
