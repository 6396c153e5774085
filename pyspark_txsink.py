"""PySpark's automatic registration of the ``txsink`` Data Source format.

PySpark imports every installed top-level module named ``pyspark_*`` the first time a
Python Data Source is used, and registers its ``DefaultSource`` under its ``name()``: with
txsink installed, ``df.writeStream.format("txsink")`` works without
``spark.dataSource.register``. See :mod:`txsink.datasource`.
"""

from txsink.datasource import TxsinkDataSource as DefaultSource

__all__ = ["DefaultSource"]
