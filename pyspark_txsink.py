"""PySpark's automatic registration of the ``txsink`` Data Source format.

PySpark imports every top-level module named ``pyspark_*`` that ``pkgutil.iter_modules()``
lists, the first time a Python Data Source is used, and registers its ``DefaultSource``
under its ``name()``: with txsink installed, ``df.writeStream.format("txsink")`` works
without ``spark.dataSource.register``. See :mod:`txsink.datasource`.

A wheel installs this file in site-packages. An editable install puts ``pyspark-entry/``
on ``sys.path`` instead, a folder that holds only a link to this file
(``build-backend/txsink_build.py`` says why).
"""

from txsink.datasource import TxsinkDataSource as DefaultSource

__all__ = ["DefaultSource"]
