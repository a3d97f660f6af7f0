"""Running the jobs, kept free of Airflow imports at module level: the Airflow REST API client,
submitting Spark jobs (Spark Connect or spark-submit), the Spark node and Spark Connect server
launchers (used by docker-compose and the cluster tests), and helpers the DAGs share.
"""
