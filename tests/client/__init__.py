"""Tests of the producer SDK against a real receiver."""
