"""cdclake: the shared layer of the CDC-to-Iceberg pipeline, in sub-packages that depend one way.

``contracts`` (wire types) <- ``config`` <- ``staging`` <- ``lake`` <- ``query`` <- ``launch`` <-
``dev`` <- ``cli``; ``debezium`` (the Debezium adapter) stands on ``contracts`` and ``config``,
``orchestration`` (the Airflow side) and ``lakehouse`` (the Lakehouse page) on ``lake`` and below,
``service`` (what the two HTTP services share) on ``contracts`` and ``config`` only, ``client`` (the
producer SDK) on ``contracts`` alone. ARCHITECTURE.md draws the layers and
tests/project/test_import_graph.py enforces them. The services, the Spark jobs and the DAGs import this
package, never ``dev`` or ``cli``; it imports none of them (the CLI starts the REST catalog from
inside ``cdclake.cli.main.rest``). Heavy backends (pyspark, pyiceberg, boto3) are imported lazily
inside the functions that need them.
"""

__version__ = "0.1.0"
