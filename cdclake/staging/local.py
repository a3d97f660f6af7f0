"""The staging store in a local folder: durable (fsync of the file and its folder) before a
write returns."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from cdclake.staging.names import CLOCK_FOLDER, SUFFIX, ObjectKey, is_object_name


class LocalStaging:
    """Staging objects in a local folder. Writes are durable before :meth:`put` returns."""

    # The kernel stamps mtimes from a coarse clock (one tick, 1-10 ms, behind the real one).
    MTIME_SLACK_MS = 50

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def uri(self, key: ObjectKey) -> str:
        return (self.root / key.path).as_uri()

    def put(self, key: ObjectKey, data: bytes) -> None:
        """Write atomically and durably: temp file, fsync, rename, fsync the directory."""
        final = self.root / key.path
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{uuid.uuid4().hex}"
        _write_durably(tmp, data)
        os.rename(tmp, final)
        _fsync_dir(final.parent)
        # The hour and day folders may be new too; their entries must survive a crash as well.
        _fsync_dir(final.parent.parent)
        _fsync_dir(final.parent.parent.parent)

    def get(self, key: ObjectKey) -> bytes:
        return (self.root / key.path).read_bytes()

    def put_if_absent(self, path: str, data: bytes) -> bool:
        final = self.root / path
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{uuid.uuid4().hex}"
        _write_durably(tmp, data)
        try:
            # link() fails if the target exists: an atomic, exclusive create of complete content.
            os.link(tmp, final)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        _fsync_dir(final.parent)
        _fsync_dir(final.parent.parent)
        return True

    def read(self, path: str) -> bytes | None:
        try:
            return (self.root / path).read_bytes()
        except FileNotFoundError:
            return None

    def exists(self, path: str) -> bool:
        return (self.root / path).is_file()

    def delete(self, path: str) -> None:
        (self.root / path).unlink(missing_ok=True)

    def remove_folder(self, prefix: str) -> None:
        # Only an empty one. A landing racing this between its mkdir and its write fails
        # retryably, before any ack.
        with contextlib.suppress(OSError):
            (self.root / prefix).rmdir()

    def list_names(self, prefix: str) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.root / prefix) if not n.startswith(".tmp-"))
        except FileNotFoundError:
            return []

    def folders(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_dir())

    def modified_ms(self, path: str) -> int | None:
        try:
            return os.stat(self.root / path).st_mtime_ns // 1_000_000
        except FileNotFoundError:
            return None

    def clock_probe(self) -> int:
        folder = self.root / CLOCK_FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=folder)
        try:
            os.write(fd, b"0")  # stamps the mtime now (no fsync: the probe's time is all it is for)
            return os.fstat(fd).st_mtime_ns // 1_000_000
        finally:
            os.close(fd)
            os.unlink(name)

    def check(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if not os.access(self.root, os.W_OK):
            raise OSError(f"staging folder {self.root} is not writable")

    def tables(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def list(self, table: str, after: str = "") -> Iterator[ObjectKey]:
        """Objects of ``table`` whose name sorts after ``after``, in key order."""
        base = self.root / table
        if not base.is_dir():
            return
        after_day, after_hour = after[:10], after[11:13]
        for day in sorted(d.name for d in base.iterdir() if d.is_dir()):
            if day < after_day:
                continue
            for hour in sorted(h.name for h in (base / day).iterdir() if h.is_dir()):
                if (day, hour) < (after_day, after_hour):
                    continue
                for f in sorted(os.listdir(base / day / hour)):
                    if f.endswith(SUFFIX) and not f.startswith("."):
                        name = f"{day}/{hour}/{f}"
                        if name > after and is_object_name(name):
                            yield ObjectKey(table, name)


def _write_durably(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
