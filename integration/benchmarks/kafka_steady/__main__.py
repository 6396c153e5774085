"""``python -m benchmarks.kafka_steady`` (what ``integration/benchmarks/run kafka_steady`` runs)."""

import sys
from pathlib import Path

try:
    from benchmarks.kafka_steady.main import main
except ImportError:  # run as a plain script: python integration/benchmarks/kafka_steady
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.kafka_steady.main import main

sys.exit(main())
