"""The embedded deployment's state is its owner's alone: folders 0700, files 0600, whatever the
umask.

The state folder (``CDCLAKE_HOME``: staging, warehouse, the catalog and Airflow databases, logs,
secrets) and the local folders the settings put elsewhere hold every landed event and every
table's rows. Three things make them private, because each writer decides modes its own way:

* :func:`owner_only`: umask 077 while ``cdclake up`` / ``demo`` / ``init`` run, and for every
  process the stack starts (``subprocess.Popen(umask=)``): what honours the umask (Python,
  SQLite, the JVM's plain files) creates 0600 / 0700.
* Writers that set modes explicitly are told so: Airflow's task logs
  (:data:`AIRFLOW_LOG_MODES`; 0664 / 0775 by default) and Hadoop's local file system, which
  Spark and Iceberg write the warehouse with (``fs.permissions.umask-mode``, default 022:
  :func:`hadoop_conf_dir`).
* :func:`make_private`: the folders made 0700 and what is already in them tightened, so a state
  folder made before (or by hand) is private from the next start on.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from cdclake.config.settings import Settings

UMASK = 0o077
AIRFLOW_LOG_MODES = {
    "AIRFLOW__LOGGING__FILE_TASK_HANDLER_NEW_FOLDER_PERMISSIONS": "0o700",
    "AIRFLOW__LOGGING__FILE_TASK_HANDLER_NEW_FILE_PERMISSIONS": "0o600",
}
CORE_SITE = """<?xml version="1.0"?>
<!-- Written by cdclake (cdclake/config/private.py): Hadoop's local file system sets each file's mode
     itself, from this umask (default 022: world-readable warehouse files). -->
<configuration>
  <property><name>fs.permissions.umask-mode</name><value>077</value></property>
</configuration>
"""


@contextlib.contextmanager
def owner_only() -> Iterator[None]:
    """Files this process creates meanwhile are 0600, folders 0700 (and children inherit it)."""
    old = os.umask(UMASK)
    try:
        yield
    finally:
        os.umask(old)


def _sqlite_file(url: str) -> Path | None:
    return Path(url.split("sqlite:///", 1)[1]) if url.startswith("sqlite:///") else None


def private_folders(settings: Settings) -> list[Path]:
    """The folders that are the deployment's own: the state folder and the local ones the
    settings put elsewhere (staging, spool, a ``file://`` warehouse)."""
    out = [settings.home, settings.spool_dir]
    if not settings.staging_url:
        out.append(settings.staging_dir)
    if settings.warehouse.startswith("file://"):
        out.append(Path(settings.warehouse[len("file://") :]))
    return [p.resolve() for p in out]


def shared(folder: Path) -> bool:
    """A folder that is not the deployment's to close even if a setting names it: the file
    system's root, the user's home, or one others share (the sticky bit: /tmp)."""
    if folder in (Path(folder.anchor), Path.home().resolve()):
        return True
    return folder.is_dir() and bool(folder.stat().st_mode & stat.S_ISVTX)


def make_private(settings: Settings, airflow_db_url: str | None = None) -> None:
    """Create the deployment's folders 0700 and tighten what they hold; the SQLite databases
    (catalog, Airflow) too, wherever they are (their folder is left alone outside ours)."""
    folders = [f for f in private_folders(settings) if not shared(f)]
    with owner_only():
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            tighten(folder)
    for url in (settings.catalog_db_url, airflow_db_url or settings.airflow_db_url):
        db = _sqlite_file(url)
        if db is not None and not any(db.resolve().is_relative_to(f) for f in folders):
            for path in (db, *(db.with_name(db.name + s) for s in ("-journal", "-wal", "-shm"))):
                if path.exists() and not path.is_symlink():
                    path.chmod(stat.S_IMODE(path.stat().st_mode) & ~UMASK)


def tighten(root: Path) -> None:
    """Take group's and others' bits off ``root`` and everything below it (links not followed:
    what one points to is not ours to change)."""

    def one(path: str) -> None:
        st = os.lstat(path)
        if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & UMASK:
            os.chmod(path, stat.S_IMODE(st.st_mode) & ~UMASK)

    one(str(root))
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            with contextlib.suppress(FileNotFoundError):  # a writer's temporary file, gone meanwhile
                one(os.path.join(folder, name))


def hadoop_conf_dir(settings: Settings) -> Path:
    """A Hadoop configuration folder with :data:`CORE_SITE`, for ``HADOOP_CONF_DIR``."""
    folder = settings.home / "spark" / "hadoop-conf"
    with owner_only():
        folder.mkdir(parents=True, exist_ok=True)
        site = folder / "core-site.xml"
        if not site.exists() or site.read_text() != CORE_SITE:
            site.write_text(CORE_SITE)
    return folder
