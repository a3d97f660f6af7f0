"""Configuration: the one front door (settings: keyword arguments over
``CDCLAKE_*`` variables over defaults),
per-table options, and owner-only secret files. Imports only :mod:`cdclake.contracts`.
"""
