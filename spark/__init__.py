"""Spark (PySpark 4) data source and jobs that read and write rocketstore topics through gRPC batch reads."""
