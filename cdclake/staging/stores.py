"""The configured staging store: :func:`open_store`.

Kept apart from :mod:`cdclake.staging` (the layout and the local store) so that the S3 backend,
which builds on that layout, is imported by neither side of it: ``staging.s3`` imports
the layout, this module imports both, and nothing imports this module back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdclake.staging.local import LocalStaging
from cdclake.staging.store import Store

if TYPE_CHECKING:
    from cdclake.config.settings import Settings


def open_store(settings: Settings) -> Store:
    """The configured store. The S3 backend (boto3) is imported only when it is configured."""
    if settings.staging_url.startswith("s3://"):
        from cdclake.staging.s3 import S3Staging

        return S3Staging.from_settings(settings)
    return LocalStaging(settings.staging_dir)
