"""Tests of cdclake.contracts and cdclake.config: events, names, column types, Debezium envelopes, table options."""
