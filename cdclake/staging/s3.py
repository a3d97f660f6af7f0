"""The staging :class:`cdclake.staging.Store` in an S3-compatible object store (AWS S3, SeaweedFS,
MinIO, ...), over boto3.

Object keys are ``<prefix>/<path>`` in one bucket, with the same layout as
:class:`cdclake.staging.LocalStaging`; :mod:`cdclake.staging` still owns naming and ordering.

Exclusive create is a conditional PUT (``If-None-Match: *``). The store must enforce it: AWS S3
does since 2024-08, and SeaweedFS does for single-part PUTs (which is all this module issues:
``put_object`` never switches to multipart). A store that ignores the header would silently
overwrite, so tests/staging/test_s3staging.py checks it against a real server.

One :class:`S3Staging` may be shared by threads: a boto3 *client* is thread-safe (a boto3
session or resource is not, which is why the client is built once, from a private session, in
``__init__`` and nothing else is shared).
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from cdclake.config.settings import SettingsError
from cdclake.staging.names import CLOCK_FOLDER, ObjectKey, parse_name

if TYPE_CHECKING:
    from cdclake.config.settings import Settings

# An outage must surface quickly: the receiver then lands batches in its local spool instead of
# holding producers. With these values a call to a stopped server (connection refused) fails at
# once. A server that accepts connections but never answers costs each attempt the read
# timeout, plus a second for a PUT (botocore waits that long for "100 Continue" before sending the
# body): MAX_ATTEMPTS x (READ_TIMEOUT_S + 1) for a put, MAX_ATTEMPTS x READ_TIMEOUT_S for other
# calls (tried against a SIGSTOPped SeaweedFS).
CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 5.0
MAX_ATTEMPTS = 3
# The receiver calls the store from a thread pool; beyond this many concurrent calls requests
# wait for a connection instead of opening new ones.
MAX_POOL_CONNECTIONS = 32

# Codes by which a conditional create loses. 409 ConditionalRequestConflict is AWS's answer while
# another conditional write to the key is in flight: that one may still fail, so "exists" is not
# certain. The caller must (and receiver/claim.py does) read the object after a False and try
# again if it finds none.
_EXISTS_CODES = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409"})
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


def parse_url(url: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket[/prefix]``; the prefix has no leading/trailing ``/``."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise SettingsError(f"CDCLAKE_STAGING_URL must be s3://bucket[/prefix], got {url!r}")
    return parts.netloc, parts.path.strip("/")


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class S3Staging:
    """Staging objects and receipts under ``s3://<bucket>/<prefix>/``."""

    # LastModified has whole seconds (HTTP dates): the write happened within a second of it.
    MTIME_SLACK_MS = 1000

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        path_style: bool = True,
        access_key: str | None = None,
        secret_key: str | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        read_timeout: float = READ_TIMEOUT_S,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        if bool(access_key) != bool(secret_key):
            raise SettingsError("CDCLAKE_S3_ACCESS_KEY and CDCLAKE_S3_SECRET_KEY must be set together")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._root = f"{self.prefix}/" if self.prefix else ""
        config = Config(
            region_name=region or None,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            # total_max_attempts counts the first try; botocore's max_attempts would not.
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            max_pool_connections=MAX_POOL_CONNECTIONS,
            # Path style: most self-hosted stores have no wildcard DNS for <bucket>.<host>.
            s3={"addressing_style": "path" if path_style else "auto"},
        )
        # Empty keys: boto3's own chain (environment, profile, instance role) decides.
        session = boto3.session.Session(
            aws_access_key_id=access_key or None,
            aws_secret_access_key=secret_key or None,
        )
        self._s3: Any = session.client("s3", endpoint_url=endpoint_url or None, config=config)

    @classmethod
    def from_settings(cls, settings: Settings, url: str | None = None) -> S3Staging:
        """The store at ``url`` (default CDCLAKE_STAGING_URL) with the shared S3 settings."""
        bucket, prefix = parse_url((url or settings.staging_url).replace("s3a://", "s3://", 1))
        return cls(
            bucket,
            prefix,
            endpoint_url=settings.s3_endpoint or None,
            region=settings.s3_region or None,
            path_style=settings.s3_path_style,
            access_key=settings.s3_access_key or None,
            secret_key=settings.s3_secret_key or None,
        )

    def __repr__(self) -> str:
        return f"S3Staging({self.uri_of('')!r})"

    def _key(self, path: str) -> str:
        return self._root + path

    def uri_of(self, path: str) -> str:
        return f"s3://{self.bucket}/{self._key(path)}"

    # ------------------------------------------------------------------------- Store
    def uri(self, key: ObjectKey) -> str:
        return self.uri_of(key.path)

    def put(self, key: ObjectKey, data: bytes) -> None:
        # A PUT is atomic and, once answered 200, as durable as the store makes anything.
        self._s3.put_object(Bucket=self.bucket, Key=self._key(key.path), Body=data)

    def get(self, key: ObjectKey) -> bytes:
        data = self.read(key.path)
        if data is None:
            # As LocalStaging, so callers handle a vanished object the same way for both stores.
            raise FileNotFoundError(self.uri(key))
        return data

    def put_if_absent(self, path: str, data: bytes) -> bool:
        try:
            self._s3.put_object(Bucket=self.bucket, Key=self._key(path), Body=data, IfNoneMatch="*")
        except ClientError as exc:
            if _code(exc) in _EXISTS_CODES:
                return False
            raise
        return True

    def read(self, path: str) -> bytes | None:
        try:
            resp = self._s3.get_object(Bucket=self.bucket, Key=self._key(path))
        except ClientError as exc:
            if _code(exc) in _MISSING_CODES:
                return None
            raise
        with resp["Body"] as body:
            return bytes(body.read())

    def delete(self, path: str) -> None:
        self._s3.delete_object(Bucket=self.bucket, Key=self._key(path))

    def exists(self, path: str) -> bool:
        try:
            self._s3.head_object(Bucket=self.bucket, Key=self._key(path))
        except ClientError as exc:
            # HEAD has no body, so the code is the bare status.
            if _code(exc) in _MISSING_CODES:
                return False
            raise
        return True

    def list_names(self, prefix: str) -> builtins.list[str]:
        base = self._key(prefix)
        names = (key[len(base) :] for key in self._keys(base, direct=True))
        # An empty name is a folder marker some tools create for ``prefix`` itself.
        return sorted(n for n in names if n)

    def folders(self, prefix: str) -> builtins.list[str]:
        base = self._key(prefix)
        return sorted(f[len(base) :].rstrip("/") for f in self._folders(base))

    def remove_folder(self, prefix: str) -> None:
        # Some stores (SeaweedFS) keep a folder once made, listed until its own key is deleted;
        # on AWS this deletes nothing.
        if not any(True for _ in self._keys(self._key(prefix), direct=False)):
            self._s3.delete_object(Bucket=self.bucket, Key=self._key(prefix))

    def modified_ms(self, path: str) -> int | None:
        try:
            head = self._s3.head_object(Bucket=self.bucket, Key=self._key(path))
        except ClientError as exc:
            if _code(exc) in _MISSING_CODES:
                return None
            raise
        return int(head["LastModified"].timestamp() * 1000)

    def clock_probe(self) -> int:
        path = f"{CLOCK_FOLDER}/{uuid.uuid4().hex}"
        self._s3.put_object(Bucket=self.bucket, Key=self._key(path), Body=b"0")
        try:
            stamp = self.modified_ms(path)
        finally:
            self.delete(path)
        if stamp is None:
            raise OSError(f"the clock probe {self.uri_of(path)} vanished before its time was read")
        return stamp

    def check(self) -> None:
        self._s3.head_bucket(Bucket=self.bucket)

    def ensure_bucket(self) -> bool:
        """Create the bucket if it does not exist; True if this call created it."""
        try:
            self._s3.head_bucket(Bucket=self.bucket)
            return False
        except ClientError as exc:
            if _code(exc) not in ("404", "NoSuchBucket", "NotFound"):
                raise
        try:
            self._s3.create_bucket(Bucket=self.bucket)
        except ClientError as exc:
            # Another init (a second replica, a re-run) won the race: the bucket is there.
            if _code(exc) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise
            return False
        return True

    def tables(self) -> builtins.list[str]:
        found = []
        for folder in self._folders(self._root):
            name = folder[len(self._root) :].rstrip("/")
            # Dot folders hold receipts and other bookkeeping, never tables.
            if name and not name.startswith("."):
                found.append(name)
        return sorted(found)

    def list(self, table: str, after: str = "") -> Iterator[ObjectKey]:
        """Objects of ``table`` whose name sorts after ``after``, in key order.

        S3 lists keys in UTF-8 byte order, which for staging names (ASCII) is Python's ``str``
        order, the order :mod:`cdclake.staging` defines.
        """
        base = self._key(f"{table}/")
        start_after = base + after if after else ""
        for key in self._keys(base, direct=False, start_after=start_after):
            name = key[len(base) :]
            try:
                parse_name(name)
            except ValueError:
                continue  # not ours: stray uploads, temp files of other tools
            yield ObjectKey(table, name)

    # ------------------------------------------------------------------------- helpers
    def _pages(self, **kwargs: str) -> Iterator[dict[str, Any]]:
        yield from self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, **kwargs)

    def _keys(self, prefix: str, *, direct: bool, start_after: str = "") -> Iterator[str]:
        """Keys under ``prefix`` in key order; with ``direct``, not those in sub-folders."""
        kwargs = {"Prefix": prefix}
        if direct:
            kwargs["Delimiter"] = "/"
        if start_after:
            kwargs["StartAfter"] = start_after
        for page in self._pages(**kwargs):
            for obj in page.get("Contents", ()):
                yield str(obj["Key"])

    def _folders(self, prefix: str) -> Iterator[str]:
        for page in self._pages(Prefix=prefix, Delimiter="/"):
            for cp in page.get("CommonPrefixes", ()):
                yield str(cp["Prefix"])
