"""PySpark jobs. Each module exposes ``main(spark, argv)`` wiring pure DataFrame transforms."""
