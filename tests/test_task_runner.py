"""The core's TaskRunner: a commit spread over the cluster, or in-process without one."""

from __future__ import annotations

import os
from typing import Any

import pytest

from txsink.contract import local_tasks
from txsink.errors import CommitError


def _pid_twice(x: int) -> tuple[int, int]:
    return x * 2, os.getpid()


def _refuse(x: int) -> None:
    raise CommitError("cannot commit this unit", epoch=x)


def test_local_tasks_run_in_order_in_this_process() -> None:
    assert local_tasks.run(_pid_twice, [1, 2]) == [(2, os.getpid()), (4, os.getpid())]


@pytest.mark.spark
def test_spark_tasks_run_each_item_in_a_task_and_keep_the_order(spark: Any) -> None:
    from txsink.spark.jobs import SparkTaskRunner

    results = SparkTaskRunner(spark).run(_pid_twice, [3, 1, 2])
    assert [value for value, _ in results] == [6, 2, 4]
    assert all(pid != os.getpid() for _, pid in results)  # in Spark's Python workers
    assert SparkTaskRunner(spark).run(_pid_twice, []) == []


@pytest.mark.spark
def test_a_txsink_error_in_a_task_is_raised_on_the_driver_with_its_context(spark: Any) -> None:
    from txsink.spark.jobs import SparkTaskRunner

    # An item's index is no partition of the epoch: the item's function names where it is.
    with pytest.raises(CommitError) as caught:
        SparkTaskRunner(spark).run(_refuse, [7])
    assert str(caught.value) == "[epoch=7] cannot commit this unit"
