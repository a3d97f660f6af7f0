"""Tests of the DAGs (DagBag integrity, plans) and the Airflow API client."""
