"""Tests of the Debezium adapter (cdclake.debezium): transaction metadata."""
