"""Configuration: the one front door (settings: file, then ``CDCLAKE_*`` env, then arguments),
per-table options, and owner-only secret files. Imports only :mod:`cdclake.contracts`.
"""
