"""cdclake: the shared contracts of the CDC-to-Iceberg pipeline.

Holds the CDC event and batch types, the staging layout, the watermark format and the settings.
The receiver, the Spark jobs and the DAGs import this package; it imports none of them, and its
heavy backends (pyspark, pyiceberg) are imported lazily inside the functions that need them.
"""

__version__ = "0.1.0"
