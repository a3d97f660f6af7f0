"""The Airflow Asset the receiver updates after landings; ``cdc_apply`` is scheduled on it."""

ASSET_URI = "cdclake://staging"
ASSET_NAME = "cdclake_staging"
