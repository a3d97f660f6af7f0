"""cdclake: the shared contracts of the CDC-to-Iceberg pipeline.

Holds the CDC event and batch types, the staging layout, the watermark format and the settings,
and what the two services (receiver, REST catalog) share: metrics, JSON logs, connection limits.
The services, the Spark jobs and the DAGs import this package; it imports none of them (the CLI
starts the REST catalog from inside ``cdclake.cli.rest``; tests/test_import_graph.py), and its
heavy backends (pyspark, pyiceberg) are imported lazily inside the functions that need them.
"""

__version__ = "0.1.0"
