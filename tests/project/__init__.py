"""Tests of the project itself: import graph and layers, sizes, ARCHITECTURE.md, packaging."""
