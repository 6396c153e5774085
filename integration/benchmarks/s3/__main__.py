"""``python -m benchmarks.s3`` (what ``integration/benchmarks/run s3`` runs)."""

import sys
from pathlib import Path

try:
    from benchmarks.s3.main import main
except ImportError:  # run as a plain script: python integration/benchmarks/s3
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.s3.main import main

sys.exit(main())
