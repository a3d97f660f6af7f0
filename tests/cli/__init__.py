"""Tests of the cdclake command: SQL shell and reports, the Debezium tools."""
