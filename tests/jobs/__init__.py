"""Tests of the Spark jobs (spark_jobs/) on real Spark and Iceberg, against the reference model."""
