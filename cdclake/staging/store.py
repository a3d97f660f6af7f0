"""What a staging store does: the :class:`Store` protocol the local and the S3 store implement."""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from typing import Protocol

from cdclake.staging.names import ObjectKey


class Store(Protocol):
    """Where staging objects and receipts live: :class:`LocalStaging` or ``cdclake.staging.s3``
    (the configured one: :func:`cdclake.staging.stores.open_store`).

    Paths are relative to the store's root and use ``/``. ``put`` and ``put_if_absent`` return
    only once the data is durable.
    """

    def uri(self, key: ObjectKey) -> str: ...
    def put(self, key: ObjectKey, data: bytes) -> None: ...
    def get(self, key: ObjectKey) -> bytes: ...
    def tables(self) -> builtins.list[str]: ...
    def list(self, table: str, after: str = "") -> Iterator[ObjectKey]: ...
    def put_if_absent(self, path: str, data: bytes) -> bool:
        """Create ``path`` durably unless it exists; False (and nothing written) if it does."""
        ...

    def read(self, path: str) -> bytes | None:
        """Content of ``path``, or None if it does not exist."""
        ...

    def exists(self, path: str) -> bool: ...
    def delete(self, path: str) -> None:
        """Remove ``path`` if it exists (staging clean-up)."""
        ...

    def list_names(self, prefix: str) -> builtins.list[str]:
        """Names (not paths) of the objects directly under folder ``prefix`` (ends with ``/``), sorted."""
        ...

    def folders(self, prefix: str) -> builtins.list[str]:
        """Names of the folders directly under folder ``prefix`` (ends with ``/``), sorted."""
        ...

    def remove_folder(self, prefix: str) -> None:
        """Remove folder ``prefix`` (ends with ``/``) if it is empty (clean-up of a forgotten
        producer's receipts)."""
        ...

    def check(self) -> None:
        """Raise if the store cannot be reached (readiness)."""
        ...

    MTIME_SLACK_MS: int
    """How far a modification time may be from the instant of the write (resolution, coarse clocks)."""

    def modified_ms(self, path: str) -> int | None:
        """When ``path`` was written, in the store's clock; None if it does not exist."""
        ...

    def clock_probe(self) -> int:
        """Write a probe object under :data:`CLOCK_FOLDER` and return its modification time in
        the store's clock (ms); the probe is removed. See :mod:`cdclake.staging.clock`."""
        ...
