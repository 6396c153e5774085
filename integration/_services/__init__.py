"""Local real-service harness for txsink integration tests (see docs/testing.md)."""
