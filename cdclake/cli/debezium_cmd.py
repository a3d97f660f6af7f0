"""``cdclake debezium``: write Debezium Server's ``application.properties`` for one database.

The properties come from :func:`cdclake.debezium.config.properties` (what the Debezium Server
tests run on) with the recommended sink settings, and are written owner-only (0600: they hold the
database password and the producer token). Secrets are read from an environment variable or a
file, never from the command line, which ``ps`` shows to every user; they are never printed.
The matching ``[tables.<name>] key = [...]`` lines for CDCLAKE_TABLE_CONFIG go to stdout, or to
``--table-config``. With ``--discover`` the keys (and, with ``--no-schemas``, the column types)
are read from the database itself (:mod:`cdclake.debezium.discover`): Debezium's HTTP sink never
sends the record key, so this is how the receiver learns a primary key without being told.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cdclake.config.secretfile import write_private
from cdclake.config.settings import Settings
from cdclake.debezium import config as dc
from cdclake.debezium.discover import DiscoveryError, discover

DEFAULT_PORTS = {"postgres": 5432, "mariadb": 3306, "mysql": 3306}
PASSWORD_ENV = "CDCLAKE_DB_PASSWORD"
# debezium_config's parameter -> the flag that sets it, so errors name what the user typed.
FLAGS = {
    "kind": "KIND",
    "host": "--host",
    "port": "--port",
    "user": "--user",
    "name": "--database",
    "tables": "--table",
    "keys": "--key",
    "server_id": "--server-id",
    "slot": "--slot",
    "publication": "--publication",
    "receiver_url": "--receiver-url",
    "batch_max_size": "--batch-max-size",
    "retries": "--retries",
    "retry_interval_ms": "--retry-interval-ms",
    "token": "--token-file/--token-env",
    "http_port": "--http-port",
    "schemas": "--no-schemas",
}
NAME_FLAG = "--name"  # the `name` of properties(), not Database.name (--database)

HELP = """\
Secrets never go on the command line: the database password is read from the environment
variable --password-env (default CDCLAKE_DB_PASSWORD) or from --password-file, the producer
token from --token-env or --token-file (`cdclake init` writes one to default.token beside
CDCLAKE_TOKENS_FILE). One trailing newline of a file is dropped.

example:
  CDCLAKE_DB_PASSWORD=... cdclake debezium postgres --host db.internal --user dbz \\
      --database shop --table public.customers --table public.order_lines \\
      --discover --token-file .cdclake/receiver/default.token \\
      --receiver-url http://127.0.0.1:8090 -o debezium-server/config/application.properties \\
      --table-config tables.toml

Then run Debezium Server in the folder holding config/ (docs/debezium.md: "From PostgreSQL or MariaDB with
Debezium Server").
"""


class UsageError(RuntimeError):
    """A flag's value breaks a rule; the message names the flag."""


# Long: argparse declarations, one per flag, grouped as `--help` shows them.
def add_parser(sub: Any) -> None:
    d = sub.add_parser(
        "debezium",
        help="write Debezium Server's application.properties (0600) for a database -> the receiver",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # `--password` must not pass for `--password-file`
    )
    d.add_argument("kind", metavar="KIND", choices=sorted(DEFAULT_PORTS), help="postgres, mariadb or mysql")
    db = d.add_argument_group("database")
    db.add_argument("--host", default="127.0.0.1", help="database host (default 127.0.0.1)")
    db.add_argument("--port", type=int, help="default 5432 (postgres), 3306 (mariadb, mysql)")
    db.add_argument("--user", required=True, help="the replication user")
    db.add_argument(
        "--database", required=True, help="postgres: the database; mariadb/mysql: the one holding the tables"
    )
    db.add_argument(
        "--table",
        action="append",
        required=True,
        metavar="SCHEMA.TABLE",
        help="a table to capture (repeat, or comma-separate); mariadb/mysql: DATABASE.TABLE",
    )
    db.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="SCHEMA.TABLE=COL[,COL...]",
        help="the table's row-key columns (its primary key) when not just `id`; repeat per table",
    )
    db.add_argument(
        "--discover",
        action="store_true",
        help="ask the database for each table's primary key (and, with --no-schemas, its column types); "
        "--key still wins",
    )
    pw = db.add_mutually_exclusive_group()
    pw.add_argument(
        "--password-env", metavar="VAR", help=f"environment variable with the password (default {PASSWORD_ENV})"
    )
    pw.add_argument("--password-file", type=Path, metavar="PATH", help="file holding the password")
    db.add_argument(
        "--server-id", type=int, default=5400, help="mariadb/mysql: this replica's unique id (default 5400)"
    )
    db.add_argument("--slot", default="cdclake", help="postgres: replication slot (default cdclake)")
    db.add_argument("--publication", default="cdclake", help="postgres: publication (default cdclake)")
    rc = d.add_argument_group("receiver")
    rc.add_argument("--receiver-url", help="the receiver's base URL (default from CDCLAKE_RECEIVER_HOST/_PORT)")
    tok = rc.add_mutually_exclusive_group()
    tok.add_argument("--token-env", metavar="VAR", help="environment variable with the producer token")
    tok.add_argument("--token-file", type=Path, metavar="PATH", help="file holding the producer token")
    rc.add_argument("--name", help="Debezium's topic.prefix, the source id without tokens (default: --database)")
    rc.add_argument(
        "--batch-max-size",
        type=int,
        default=dc.BATCH_MAX_SIZE,
        help=f"events per request (default {dc.BATCH_MAX_SIZE})",
    )
    rc.add_argument(
        "--retries", type=int, default=dc.RETRIES, help="attempts per request, then Debezium stops (default 360)"
    )
    rc.add_argument(
        "--retry-interval-ms",
        type=int,
        default=dc.RETRY_INTERVAL_MS,
        help="fixed pause between attempts (default 5000)",
    )
    rc.add_argument(
        "--no-schemas",
        action="store_true",
        help="send events without the Connect schema (smaller posts); types then come from the table "
        "config's `types` (--discover writes them)",
    )
    out = d.add_argument_group("output")
    out.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("config/application.properties"),
        help="the properties file, written 0600 (default config/application.properties)",
    )
    out.add_argument("--state-dir", type=Path, help="offsets (and schema history): default data/ beside config/")
    out.add_argument(
        "--http-port", type=int, default=dc.DEFAULT_HTTP_PORT, help="Debezium's own HTTP port (default 8089)"
    )
    out.add_argument(
        "--table-config", type=Path, metavar="PATH", help="write the key TOML there (a new file) instead of stdout"
    )


# ----------------------------------------------------------------------------- secrets


def _read_secret_file(path: Path, flag: str) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{flag} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{flag} {path}: not UTF-8 text") from None
    # `echo secret > file` adds one newline; anything else is part of the secret.
    text = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    if not text:
        raise UsageError(f"{flag} {path}: the file is empty")
    return text


def _read_secret_env(var: str, flag: str, env: Mapping[str, str]) -> str:
    value = env.get(var)
    if not value:
        state = "is empty" if value == "" else "is not set"
        raise UsageError(f"{flag}: environment variable {var} {state} (secrets never come from the command line)")
    return value


def password(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    if args.password_file is not None:
        return _read_secret_file(args.password_file, "--password-file")
    if args.password_env is not None:
        return _read_secret_env(args.password_env, "--password-env", env)
    return _read_secret_env(PASSWORD_ENV, f"--password-env (default {PASSWORD_ENV}) or --password-file", env)


def token(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    if args.token_file is not None:
        return _read_secret_file(args.token_file, "--token-file")
    if args.token_env is not None:
        return _read_secret_env(args.token_env, "--token-env", env)
    return None


# ----------------------------------------------------------------------------- parsing


def tables(values: Sequence[str]) -> tuple[str, ...]:
    out = [t.strip() for v in values for t in v.split(",")]
    if any(not t for t in out):
        raise UsageError(f"--table: an empty table name in {list(values)}")
    if len(set(out)) < len(out):
        raise UsageError(f"--table: a table named twice in {out}")
    return tuple(out)


def keys(values: Sequence[str]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for v in values:
        table, sep, cols = v.partition("=")
        if not sep or not table.strip() or not cols.strip():
            raise UsageError(f"--key {v!r}: expected SCHEMA.TABLE=COL[,COL...]")
        if table.strip() in out:
            raise UsageError(f"--key: {table.strip()!r} given twice")
        out[table.strip()] = tuple(c.strip() for c in cols.split(","))
    return out


def state_dir(args: argparse.Namespace) -> Path:
    """``--state-dir``, else ``data/`` beside the ``config/`` folder holding the output (Debezium
    Server's working directory), else beside the output; absolute, so it does not depend on
    where Debezium is started."""
    given: Path | None = args.state_dir
    if given is not None:
        return given.resolve()
    folder = Path(args.output).resolve().parent
    return (folder.parent if folder.name == "config" else folder) / "data"


# ----------------------------------------------------------------------------- the command


def _flagged(exc: dc.ConfigError) -> UsageError:
    return UsageError(f"{FLAGS.get(exc.setting, exc.setting)}: {exc.rule}")


def build(args: argparse.Namespace, settings: Settings, env: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """The properties and the key TOML the arguments ask for; UsageError naming the flag."""
    caps = tables(args.table)
    row_keys = keys(args.key)
    name = args.name if args.name is not None else args.database
    db = dc.Database(
        args.kind,
        args.host,
        args.port if args.port is not None else DEFAULT_PORTS[args.kind],
        args.user,
        password(args, env),
        args.database,
        caps,
        server_id=args.server_id,
        slot=args.slot,
        publication=args.publication,
    )
    sink = dc.Sink(
        args.receiver_url or settings.receiver_url,
        batch_max_size=args.batch_max_size,
        retries=args.retries,
        retry_interval_ms=args.retry_interval_ms,
        token=token(args, env),
        schemas=not args.no_schemas,
    )
    types: dict[str, dict[str, str]] = {}
    if args.discover:
        try:
            found = discover(db)
        except DiscoveryError as exc:
            raise UsageError(f"--discover: {exc}") from None
        row_keys = found.keys | row_keys
        types = found.types if args.no_schemas else {}
    try:
        props = dc.properties(db, sink, name=name, state_dir=state_dir(args), keys=row_keys, http_port=args.http_port)
        return props, dc.key_toml(db, row_keys, types)
    except dc.ConfigError as exc:
        if exc.setting == "name":
            flag = NAME_FLAG if args.name is not None else f"{NAME_FLAG} (default --database)"
            raise UsageError(f"{flag}: {exc.rule}") from None
        raise _flagged(exc) from None


def _header(args: argparse.Namespace) -> str:
    return (
        "Written by `cdclake debezium` (cdclake/debezium/config.py). Holds the database password\n"
        "and the producer token: keep it owner-only (0600). Sink settings: docs/debezium.md, From PostgreSQL\n"
        f"or MariaDB with Debezium Server. Source: {args.kind}."
    )


def _write_table_config(path: Path, text: str) -> None:
    # A new file only: merging into an existing table config (TOML allows each [tables.x] once)
    # is left to the person who owns it.
    try:
        with path.open("x", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise UsageError(f"--table-config {path}: {exc.strerror}") from None


def run(args: argparse.Namespace, settings: Settings, env: Mapping[str, str] | None = None) -> int:
    props, toml = build(args, settings, os.environ if env is None else env)
    toml = "# CDCLAKE_TABLE_CONFIG: the row key of each captured table (cdclake debezium)\n" + toml
    if args.no_schemas and not args.discover:
        _note("--no-schemas without --discover: column types are inferred from values unless `types` are set")
    if args.table_config is not None and args.table_config.exists():
        raise UsageError(
            f"--table-config {args.table_config}: exists; leave the flag out to print the lines and merge them"
        )
    try:
        write_private(args.output, dc.render(props, header=_header(args)))
        Path(props["debezium.source.offset.storage.file.filename"]).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--output {args.output}: {exc.strerror}") from None
    # Notes go to stderr, so stdout is the TOML alone (`> tables.toml` works).
    # The token is a static header, added by an InsertHeader transform (cdclake.debezium.config).
    with_token = any(k.startswith("debezium.transforms.") and v == "Authorization" for k, v in props.items())
    tok = "with a producer token" if with_token else "without a producer token"
    _note(f"wrote {args.output} (0600): {args.kind} -> {props['debezium.sink.http.url']} {tok}")
    if not with_token and settings.tokens_file is not None:
        _note("CDCLAKE_TOKENS_FILE is set: a receiver with tokens refuses posts without one (--token-file)")
    if args.table_config is None:
        print(toml, end="")
        return 0
    _write_table_config(args.table_config, toml)
    _note(f"wrote {args.table_config}: the receiver's CDCLAKE_TABLE_CONFIG (merge it if it has one)")
    return 0


def _note(message: str) -> None:
    print(f"[cdclake] {message}", file=sys.stderr)
