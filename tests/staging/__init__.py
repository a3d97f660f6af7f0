"""Tests of cdclake.staging: the S3 store, receipts, the store's clock."""
