"""The S3 sink's least IAM rights (``txsink.connectors.s3.grants``) and the page that shows
them: the JSON policy of ``docs/security.md`` is the module's output for the names its
block gives, so the docs grant exactly what the check probes (and what the
``s3_secure`` test server gives its user); the check's refusal is recognised by its code."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from txsink.connectors.s3.access import S3AccessError, refused
from txsink.connectors.s3.grants import LOG_ACTIONS, SINK_ACTIONS, policy, statement

PAGE = Path(__file__).resolve().parent.parent / "docs" / "security.md"
_BLOCK = re.compile(
    r'print\(json\.dumps\(policy\("(.*?)", "(.*?)", log_prefix="(.*?)"\), indent=2\)\)\n```\n\n'
    r"<!-- output -->\n```json\n(.*?)```",
    re.DOTALL,
)


def test_the_pages_policy_is_the_modules_output() -> None:
    blocks = _BLOCK.findall(PAGE.read_text())
    assert len(blocks) == 1
    bucket, prefix, log_prefix, body = blocks[0]
    assert json.loads(body) == policy(bucket, prefix, log_prefix=log_prefix)


def test_every_action_is_in_the_policy_once_and_scoped() -> None:
    doc = policy("b", "p/", "log/")
    actions = [a for s in doc["Statement"] for a in s["Action"]]
    assert sorted(actions) == sorted({a.name for a in SINK_ACTIONS + LOG_ACTIONS})
    for s in doc["Statement"]:
        assert all(r.startswith("arn:aws:s3:::b") for r in s["Resource"])
        assert "*" not in s["Resource"] and "arn:aws:s3:::*" not in s["Resource"]
    listing = statement("s3:ListBucket", "b", ["p/", "log/"])
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["p/*", "log/*"]}}
    assert statement("s3:PutObject", "b", ["p"])["Resource"] == ["arn:aws:s3:::b/p/*"]


def test_without_removes_exactly_the_named_action() -> None:
    for action in SINK_ACTIONS:
        doc = policy("b", "p/", without=[action.name])
        actions = {a for s in doc["Statement"] for a in s["Action"]}
        assert actions == {a.name for a in SINK_ACTIONS} - {action.name}


def _client_error(code: str, status: int) -> Exception:
    from botocore.exceptions import ClientError

    response: Any = {"Error": {"Code": code, "Message": "m"}}
    response["ResponseMetadata"] = {"HTTPStatusCode": status}
    return ClientError(response, "PutObject")


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("AccessDenied", 403, True),
        ("403", 403, True),  # HEAD: no body, the bare status
        ("InvalidAccessKeyId", 403, False),  # bad credentials, not a missing action
        ("SignatureDoesNotMatch", 403, False),
        ("NoSuchBucket", 404, False),
    ],
)
def test_refused_is_a_policy_refusal_only(code: str, status: int, expected: bool) -> None:
    assert refused(_client_error(code, status)) is expected


def test_the_error_carries_the_missing_actions() -> None:
    err = S3AccessError("m", ["s3:GetObject"], sink_uid="u", phase="check", connector="s3")
    assert err.missing == ["s3:GetObject"]
    assert str(err).startswith("[sink_uid=u, phase=check, connector=s3]")
