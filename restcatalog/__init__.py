"""Iceberg REST catalog over the pipeline's SQL catalog: any engine attaches by URL.

``python -m restcatalog`` serves it on CDCLAKE_REST_HOST:CDCLAKE_REST_PORT (127.0.0.1:8181).
"""
