"""The Airflow side, kept free of Airflow imports at module level: the Airflow REST API client,
the auth manager's narrowed receiver login, the staging Asset the receiver announces and
``cdc_apply`` is scheduled on, and helpers the DAGs share.
"""
