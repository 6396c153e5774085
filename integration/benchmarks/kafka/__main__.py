"""``python -m benchmarks.kafka`` (what ``integration/benchmarks/run kafka`` runs)."""

import sys
from pathlib import Path

try:
    from benchmarks.kafka.main import main
except ImportError:  # run as a plain script: python integration/benchmarks/kafka
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.kafka.main import main

sys.exit(main())
