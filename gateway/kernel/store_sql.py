"""One set of statements, two engines: SQLite (the default, one process) and PostgreSQL
(several processes, ``store_pg``).

Every statement is written once, in SQLite's dialect with ``?`` placeholders, and runs as
written on SQLite: the single-process path pays nothing for PostgreSQL. ``to_postgres``
rewrites it once (cached) for PostgreSQL: ``?`` → ``%s``; ``INSERT OR IGNORE`` →
``ON CONFLICT DO NOTHING``; ``INSERT OR REPLACE`` → an upsert on the table's key; an ``INSERT``
into a table with a generated id gains ``RETURNING`` it (``cursor.lastrowid``). What cannot be
rewritten mechanically is written twice, side by side, with ``twin(sqlite, postgres)``.

A group of tables is a ``TableSet``: its versioned migrations (each with its SQLite DDL and its
PostgreSQL twin), the keys its ``INSERT OR REPLACE`` statements replace on, and its generated
id columns. ``register`` makes a set known to the rewriting and to ``parley db migrate`` /
``parley db copy``; docs/architecture.md ("Adding a table") walks through it.
"""

from __future__ import annotations

import re
from dataclasses import field
from functools import lru_cache
from urllib.parse import urlsplit, urlunsplit

from gateway.kernel.frozen import frozen


@frozen
class Migration:
    """Schema version ``version`` of a table set: the same change in both dialects. Applied
    once per database, in order; recorded in ``schema_versions``."""

    version: int
    sqlite: str
    postgres: str


@frozen
class TableSet:
    name: str
    """The component the tables belong to (``core``, ``pairing``, ``cron``, ...)."""
    migrations: tuple[Migration, ...]
    tables: tuple[str, ...]
    """Its tables, in the order ``parley db copy`` copies them (referenced tables first)."""
    upsert_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """table → the columns ``INSERT OR REPLACE`` replaces on (its primary key)."""
    generated_ids: dict[str, str] = field(default_factory=dict)
    """table → its generated id column (``INTEGER PRIMARY KEY AUTOINCREMENT`` / ``BIGSERIAL``)."""

    @property
    def version(self) -> int:
        return max((m.version for m in self.migrations), default=0)


TABLE_SETS: dict[str, TableSet] = {}
_UPSERT_KEYS: dict[str, tuple[str, ...]] = {}
_GENERATED: dict[str, str] = {}
_TWINS: dict[str, str] = {}


def register(tables: TableSet) -> TableSet:
    """Make a table set known (at import of the module that owns it)."""
    TABLE_SETS[tables.name] = tables
    _UPSERT_KEYS.update(tables.upsert_keys)
    _GENERATED.update(tables.generated_ids)
    to_postgres.cache_clear()
    return tables


def twin(sqlite: str, postgres: str) -> str:
    """A statement whose PostgreSQL form is written by hand (``%s`` placeholders); returns the
    SQLite form, which is what the code runs and passes around."""
    _TWINS[sqlite] = postgres
    to_postgres.cache_clear()
    return sqlite


_INSERT_OR = re.compile(r"^\s*INSERT\s+OR\s+(IGNORE|REPLACE)\s+INTO\s+(\w+)\s*\(([^)]*)\)",
                        re.IGNORECASE)
_INSERT = re.compile(r"^\s*INSERT\s+INTO\s+(\w+)", re.IGNORECASE)


@lru_cache(maxsize=2048)
def to_postgres(sql: str) -> tuple[str, bool]:
    """``sql`` (SQLite) as PostgreSQL, and whether it returns the new row's generated id."""
    hand = _TWINS.get(sql)
    if hand is not None:
        return hand, False
    out = sql.strip().rstrip(";").replace("%", "%%")
    tail = ""
    if m := _INSERT_OR.match(out):
        mode, table, columns = m.group(1).upper(), m.group(2), m.group(3)
        out = "INSERT INTO" + out[m.start(2) - 1:]
        if mode == "IGNORE":
            tail = " ON CONFLICT DO NOTHING"
        else:
            key = _UPSERT_KEYS.get(table)
            if key is None:
                raise KeyError(f"INSERT OR REPLACE INTO {table}: its TableSet names no "
                               "upsert key")
            cols = [c.strip() for c in columns.split(",")]
            sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in cols if c not in key)
            tail = f" ON CONFLICT ({', '.join(key)}) DO " + (f"UPDATE SET {sets}" if sets
                                                           else "NOTHING")
    returning = False
    if (m2 := _INSERT.match(out)) and m2.group(1) in _GENERATED and "RETURNING" not in out:
        tail += f" RETURNING {_GENERATED[m2.group(1)]}"
        returning = True
    return out.replace("?", "%s") + tail, returning


def postgres_ddl(sqlite: str) -> str:
    """SQLite DDL in PostgreSQL's types, for tables whose twin differs only there:
    BIGSERIAL for ``INTEGER PRIMARY KEY AUTOINCREMENT``, BIGINT for INTEGER (64-bit, as
    SQLite's), DOUBLE PRECISION for REAL; ``WITHOUT ROWID`` dropped. Anything more is written
    out by hand beside the SQLite DDL."""
    out = re.sub(r"INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY", sqlite)
    out = re.sub(r"\bINTEGER\b", "BIGINT", out)
    out = re.sub(r"\bREAL\b", "DOUBLE PRECISION", out)
    return re.sub(r"\)\s*WITHOUT ROWID", ")", out, flags=re.IGNORECASE)


def ordered_seq_ddl(table: str, lock: int, notify: str, when: str = "TRUE") -> str:
    """PostgreSQL DDL for a log several processes append to, read by ``seq`` (``after=N``):
    the new row's ``seq`` is taken under an advisory lock held until it commits, so rows become
    visible in ``seq`` order (a reader at N never sees N + 1 before N), and ``NOTIFY notify``
    (the row's chat) when ``when`` holds. An explicit ``seq`` (``parley db copy``) is kept."""
    return f"""
ALTER TABLE {table} ALTER COLUMN seq DROP DEFAULT;
CREATE OR REPLACE FUNCTION {table}_ordered() RETURNS trigger AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({lock});
    IF NEW.seq IS NULL THEN
        NEW.seq := nextval(pg_get_serial_sequence('{table}', 'seq'));
    END IF;
    IF {when} THEN
        PERFORM pg_notify('{notify}', NEW.chat_id);
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE OR REPLACE TRIGGER {table}_ordered BEFORE INSERT ON {table}
    FOR EACH ROW EXECUTE FUNCTION {table}_ordered();
"""


def is_postgres_url(target: object) -> bool:
    """The ``database`` setting names PostgreSQL (``postgresql://`` or ``postgres://``)."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def hide_password(url: str) -> str:
    """The URL as shown in logs, health and errors: no password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
