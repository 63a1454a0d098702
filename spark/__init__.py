"""Spark (PySpark 4) data source and jobs that read and write rocketstore topics through gRPC batch reads.

    from rocketstore.spark import register
    register(spark)                      # the "rocketstore" format, with filter pushdown on
    df = spark.read.format("rocketstore").option("endpoint", "127.0.0.1:8081").option("topic", "T").load()

Importing this package does not import PySpark; ``register`` and ``RocketStoreDataSource`` do.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RocketStoreDataSource", "register"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import datasource

        return getattr(datasource, name)
    raise AttributeError(name)
