"""End-to-end tests on the embedded stack: receiver, Airflow, Spark, Iceberg, Debezium Server, a browser."""
