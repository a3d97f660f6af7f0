"""Files that hold secrets (passwords, tokens, credentials) exist only with mode 0600.

Each is written to a temporary file created 0600 (``os.open`` with the mode: the umask can only
take bits away) and renamed over its place, so no reader ever sees a partial file or one readable
by others, whatever the umask, and a crash leaves no half-written secret behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path

MODE = 0o600


def private_temp(path: Path, text: str) -> Path:
    """``text`` in a new owner-only file beside ``path`` (for the caller to rename or delete)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, MODE)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``, owner-only."""
    tmp = private_temp(path, text)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def create_private(path: Path, make: Callable[[], str]) -> bool:
    """Write ``make()`` to ``path`` unless it exists; True if this call created it. Two processes
    racing both call ``make``, one file wins and neither sees the other's half."""
    if path.exists():
        return False
    tmp = private_temp(path, make())
    try:
        os.link(tmp, path)  # fails if path appeared meanwhile: never overwrites
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink()


def read_or_create(path: Path, make: Callable[[], str]) -> str:
    create_private(path, make)
    return path.read_text().strip()
