"""Every Kafka error code txsink names exists in the installed confluent-kafka.

A name the client does not define (``_MSG_SIZE_TOO_LARGE`` once) made ``has_code`` raise
``AttributeError`` while telling a commit's failure: a retryable error then failed the
query instead of being tried again. ``has_code`` now skips unknown names; this test keeps
the lists honest, so a skipped name is never one we rely on.
"""

from __future__ import annotations

import ast
from pathlib import Path

from confluent_kafka import KafkaError

from txsink.connectors.kafka.clients import errors

ROOT = Path(__file__).resolve().parents[1] / "connectors" / "kafka"


def _named_codes() -> set[str]:
    """Every string literal passed to ``has_code``/``error_code`` or listed in a tuple of
    code names in the Kafka connector's sources."""
    names: set[str] = set()
    for path in ROOT.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
                "has_code",
                "error_code",
            ):
                names |= {str(a.value) for a in node.args if isinstance(a, ast.Constant)}
    for value in vars(errors).values():
        if isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
            names |= {v for v in value if v.lstrip("_").isupper()}
    return names


def test_every_code_name_exists_in_the_installed_client() -> None:
    named = _named_codes()
    assert {"MSG_SIZE_TOO_LARGE", "_FENCED", "_TIMED_OUT"} <= named  # the scan sees them
    missing = sorted(n for n in named if not hasattr(KafkaError, n))
    assert not missing, f"KafkaError has no {missing}: use the names it defines"


def test_a_retriable_commit_failure_is_retryable_not_an_attribute_error() -> None:
    err = KafkaError(KafkaError._TRANSPORT, "broker down", retriable=True)
    assert not errors.has_code(err, *errors.PERMANENT)
    assert errors.has_code(err, "NO_SUCH_NAME_IN_ANY_CLIENT", "_TRANSPORT")
