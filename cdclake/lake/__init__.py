"""Access to the lake: the Iceberg catalog (pyiceberg), the Spark catalog configuration and the
Connect servers' scheduler pools, table health and freshness, table locks and places, what staging
may be cleaned, the quarantine, the change history read in commit order, and ``cdclake init``.
Heavy backends are imported inside functions.
"""
