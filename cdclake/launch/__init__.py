"""Process launchers, kept free of Airflow imports: submitting a Spark job (Spark Connect or
spark-submit), the Spark node and the Spark Connect servers' command lines (docker-compose, the
embedded stack and the cluster tests run them).
"""
