-- Second database for Airflow's metadata; the Iceberg SQL catalog uses the default "cdclake" one.
CREATE DATABASE airflow OWNER cdclake;
