"""Tests of the Iceberg REST catalog, from pyiceberg, Spark and DuckDB."""
