"""The query engine behind ``POST /v1/query``, ``/v1/query/plan`` and ``cdclake sql``: statement
text (splitting, ``AS OF``), which statements are read-only queries (Spark's own plan), the tables
a statement reads, a statement's deadline and byte cap, its confined Spark Connect session, and
the query API's own Spark Connect server. Spark is imported inside functions.
"""
