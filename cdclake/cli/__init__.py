"""The ``cdclake`` command: its entry point (:func:`cdclake.cli.main.main`), the SQL shell and reports,
and the Debezium Server configuration tools.
"""
