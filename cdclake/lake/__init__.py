"""Access to the lake: the Iceberg catalog (pyiceberg), the Spark catalog configuration, table
health, table locks, what staging may be cleaned, and ``cdclake init``. Heavy backends are
imported inside functions.
"""
