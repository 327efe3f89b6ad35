"""Retention and size of the database (issue 24): what ``retention`` removes, and the figures
``parley db stats`` shows.

Plain functions over one ``sqlite3.Connection``, or PostgreSQL's connection of the same shape
(``store_pg.SyncConnection``: statements in SQLite's dialect, rewritten; ``twin`` where they
differ): the gateway runs them as short write transactions through ``Store._write``
(``gateway/retention.py``: a batch per transaction, so a turn's write never waits long; on
PostgreSQL in the process holding the schedules' leader lease), ``parley db`` on a connection of
its own. New queries only, over the existing tables; nothing here is on a turn's path.

What may go, and what never does:

- delivered ``outbox`` rows and answered (``done``) ``inbox`` rows past their age (pending,
  dead and unanswered rows stay);
- ``context_snapshots`` past their age (the turns stay; ``parley context`` says a turn has no
  snapshot);
- a session's raw turns (``messages`` with their search entries, ``turns`` and their snapshots)
  past their age or beyond a size per session, oldest first, and only those a compaction summary
  already covers (ids below the session's last ``first_kept_id``): what a turn reads is never
  touched. ``llm_calls`` (the usage ledger) always stay;
- ``layer_texts`` no kept snapshot names, directly or through a text it names, once untouched
  for ``TEXTS_GRACE`` (``sweep_texts``).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from gateway.kernel.config_retention import RetentionConfig
from gateway.kernel.snapshot_frame import history_from, unpack
from gateway.kernel.store_db import Database
from gateway.kernel.store_search import delete_rows
from gateway.kernel.store_sql import twin

Removed = dict[str, int]


@dataclass
class Policy:
    """Ages in seconds, sizes in bytes; 0 means keep."""

    turns_max_age: float = 0.0
    turns_max_per_session: int = 0
    snapshots_max_age: float = 0.0
    outbox_delivered_max_age: float = 0.0
    inbox_done_max_age: float = 0.0
    batch: int = 500


@dataclass
class Pass:
    """One run over every rule; ``removed`` counts rows per table, ``more`` says a rule
    stopped at its batch and has more to remove."""

    removed: Removed = field(default_factory=dict)
    more: bool = False

    def add(self, table: str, n: int) -> None:
        if n:
            self.removed[table] = self.removed.get(table, 0) + n


def _cutoff(now: datetime, seconds: float) -> str:
    return (now - timedelta(seconds=seconds)).isoformat()


def _postgres(conn: Any) -> bool:
    """The connection is PostgreSQL's (``store_pg.SyncConnection``), not SQLite's."""
    return not isinstance(conn, sqlite3.Connection)


def _ids(conn: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> list[int]:
    return [int(r[0]) for r in conn.execute(sql, params)]


def _delete_ids(conn: sqlite3.Connection, table: str, column: str,
                ids: list[int] | list[str]) -> int:
    if not ids:
        return 0
    if _postgres(conn):  # one statement text whatever the count (an array, not N marks)
        return int(conn.execute(f"DELETE FROM {table} WHERE {column} = ANY(?)",
                                (list(ids),)).rowcount)
    marks = ",".join("?" * len(ids))
    return conn.execute(f"DELETE FROM {table} WHERE {column} IN ({marks})", ids).rowcount


def prune_queues(conn: sqlite3.Connection, policy: Policy, now: datetime) -> Pass:
    """Delivered outbox rows and answered inbox rows past their age, one batch each."""
    done = Pass()
    if policy.outbox_delivered_max_age > 0:
        ids = _ids(conn, "SELECT id FROM outbox WHERE status = 'delivered' AND delivered_at < ? "
                   "ORDER BY id LIMIT ?",
                   (_cutoff(now, policy.outbox_delivered_max_age), policy.batch))
        done.add("outbox", _delete_ids(conn, "outbox", "id", ids))
        done.more |= len(ids) == policy.batch
    if policy.inbox_done_max_age > 0:
        ids = _ids(conn, "SELECT id FROM inbox WHERE status = 'done' AND done_at < ? "
                   "ORDER BY id LIMIT ?", (_cutoff(now, policy.inbox_done_max_age), policy.batch))
        done.add("inbox", _delete_ids(conn, "inbox", "id", ids))
        done.more |= len(ids) == policy.batch
    return done


def prune_snapshots(conn: sqlite3.Connection, policy: Policy, now: datetime) -> Pass:
    done = Pass()
    if policy.snapshots_max_age > 0:
        key = "seq" if _postgres(conn) else "rowid"  # PostgreSQL has no rowid
        ids = _ids(conn, f"SELECT {key} FROM context_snapshots WHERE created_at < ? "
                   f"ORDER BY {key} LIMIT ?", (_cutoff(now, policy.snapshots_max_age),
                                               policy.batch))
        done.add("context_snapshots", _delete_ids(conn, "context_snapshots", key, ids))
        done.more = len(ids) == policy.batch
    return done


_SUMMARISED = ("SELECT c.session_id, MAX(c.first_kept_id) FROM compactions c "
               "GROUP BY c.session_id")
_TURNS = twin("SELECT m.turn_id, MAX(m.id), MAX(m.created_at), SUM(LENGTH(m.body)), "
              "s.detail FROM messages m "  # packed (snapshot_frame.pack): read here
              "LEFT JOIN context_snapshots s ON s.turn_id = m.turn_id "
              "WHERE m.session_id = ? GROUP BY m.turn_id ORDER BY MIN(m.id)",
              "SELECT m.turn_id, MAX(m.id), MAX(m.created_at), SUM(LENGTH(m.body)), "
              "MIN((s.detail::jsonb #>> '{inputs,history_ids,0}')::bigint) FROM messages m "
              "LEFT JOIN context_snapshots s ON s.turn_id = m.turn_id "
              "WHERE m.session_id = %s GROUP BY m.turn_id ORDER BY MIN(m.id)")


def _remove_turns(conn: sqlite3.Connection, turns: list[str], done: Pass) -> None:
    """Turns with their messages, search entries and snapshots."""
    if not turns:
        return
    if _postgres(conn):
        ids = _ids(conn, "SELECT id FROM messages WHERE turn_id = ANY(?)", (turns,))
        done.add("message_search_plain", _delete_ids(conn, "message_search_plain", "id", ids))
    else:
        marks = ",".join("?" * len(turns))
        ids = _ids(conn, f"SELECT id FROM messages WHERE turn_id IN ({marks})", tuple(turns))
        if conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'message_text'").fetchone():
            # told each text it indexed, while the messages are still there to say it
            done.add("message_text", delete_rows(conn, turns))
        else:  # a SQLite without FTS5 trigrams: the plain table
            done.add("message_search_plain", _delete_ids(conn, "message_search_plain", "id", ids))
    done.add("messages", _delete_ids(conn, "messages", "id", ids))
    done.add("context_snapshots", _delete_ids(conn, "context_snapshots", "turn_id", turns))
    done.add("turns", _delete_ids(conn, "turns", "id", turns))


def _removable(rows: list[tuple[str, int, str, int, int | None]], first_kept: int,
               cutoff: str | None, cap: int, left: int) -> list[str]:
    """The oldest turns that may go: summarised (below ``first_kept``), past ``cutoff`` or
    beyond ``cap`` bytes, and read by no turn that stays (each snapshot names the first
    message its history read: a turn kept must replay as it was sent)."""
    later_start = [0] * (len(rows) + 1)  # the least history start of the turns after i
    least = first_kept
    for i in range(len(rows) - 1, -1, -1):
        later_start[i + 1] = least
        start = rows[i][4]
        if start is not None:
            least = min(least, int(start))
    total = sum(r[3] or 0 for r in rows)
    best = 0  # the longest prefix that may go whole (no turn after it reads into it)
    for i, (_, last_id, created, size, _) in enumerate(rows):
        old = cutoff is not None and created < cutoff
        if last_id >= first_kept or not (old or (cap > 0 and total > cap)):
            break
        total -= size or 0
        if last_id < later_start[i + 1]:
            best = i + 1
            if best >= left:  # a batch's worth (more than one only when no smaller prefix may go)
                break
    return [r[0] for r in rows[:best]]


def prune_turns(conn: sqlite3.Connection, policy: Policy, now: datetime) -> Pass:
    """Summarised turns past ``turns_max_age``, or beyond ``turns_max_per_session`` (oldest
    first), a batch in all."""
    done = Pass()
    if policy.turns_max_age <= 0 and policy.turns_max_per_session <= 0:
        return done
    cutoff = _cutoff(now, policy.turns_max_age) if policy.turns_max_age > 0 else None
    left = policy.batch
    for session_id, first_kept in conn.execute(_SUMMARISED).fetchall():
        if left <= 0:
            done.more = True
            break
        rows = [(*r[:4], r[4] if r[4] is None or isinstance(r[4], int) else history_from(r[4]))
                for r in conn.execute(_TURNS, (session_id,)).fetchall()]
        turns = _removable(rows, int(first_kept), cutoff, policy.turns_max_per_session, left)
        _remove_turns(conn, turns, done)
        left -= len(turns)
        done.more |= left <= 0
    return done


def prune_once(conn: sqlite3.Connection, policy: Policy, now: datetime) -> Pass:
    """Every rule once, one batch each."""
    out = Pass()
    for rule in (prune_queues, prune_snapshots, prune_turns):
        part = rule(conn, policy, now)
        for table, n in part.removed.items():
            out.add(table, n)
        out.more |= part.more
    return out


# -- layer texts --------------------------------------------------------------------------------

TEXTS_GRACE = 86400.0
"""Seconds a layer text stays after it was last written (``touched_at``) even when no kept
snapshot names it: far longer than ``store_snapshots.TOUCH_EVERY``, so a text a turn names
without writing it again (its writer remembers it as stored) is never removed under it."""
_HASH = re.compile(r"[0-9a-f]{64}")
"""A content hash as snapshots and frames name texts. Anything of that shape in a snapshot or
a text it names counts as named: keeping a text by mistake costs bytes, losing one a replay."""


def _chunks(values: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(values), size):
        yield values[start:start + size]


def _texts_of(conn: sqlite3.Connection, hashes: list[str]) -> list[tuple[str, str]]:
    if _postgres(conn):
        return conn.execute("SELECT hash, text FROM layer_texts WHERE hash = ANY(?)",
                            (hashes,)).fetchall()
    return conn.execute(f"SELECT hash, text FROM layer_texts WHERE hash IN "
                        f"({','.join('?' * len(hashes))})", hashes).fetchall()


def named_texts(conn: sqlite3.Connection, page: int = 500) -> set[str]:
    """Every text hash the kept snapshots name: in their rows, and in the texts those name (a
    frame names the system layers and the tool list; an older runtime block, its template).
    Read a page at a time, outside any transaction: what a turn writes meanwhile names texts it
    touched, which ``TEXTS_GRACE`` keeps."""
    key = "seq" if _postgres(conn) else "rowid"
    named: set[str] = set()
    last = -1
    while True:
        rows = conn.execute(f"SELECT {key}, detail FROM context_snapshots WHERE {key} > ? "
                            f"ORDER BY {key} LIMIT ?", (last, page)).fetchall()
        for _, detail in rows:
            named.update(_HASH.findall(unpack(detail)))
        if len(rows) < page:
            break
        last = rows[-1][0]
    todo = sorted(named)
    while todo:
        found: list[str] = []
        for part in _chunks(todo, page):
            for _, text in _texts_of(conn, part):
                found.extend(h for h in _HASH.findall(text) if h not in named)
        named.update(found)
        todo = sorted(set(found))
    return named


def unnamed_texts(conn: sqlite3.Connection, named: set[str], now: datetime,
                  grace: float = TEXTS_GRACE) -> list[str]:
    """The texts ``sweep_texts`` may remove: untouched for ``grace`` and not in ``named``."""
    rows = conn.execute("SELECT hash FROM layer_texts WHERE touched_at < ?",
                        (_cutoff(now, grace),)).fetchall()
    return [r[0] for r in rows if r[0] not in named]


def delete_texts(conn: sqlite3.Connection, hashes: list[str], now: datetime,
                 grace: float = TEXTS_GRACE) -> int:
    """Remove ``hashes`` that are still untouched for ``grace`` (one batch)."""
    cutoff = _cutoff(now, grace)
    if _postgres(conn):
        return int(conn.execute("DELETE FROM layer_texts WHERE hash = ANY(?) AND touched_at < ?",
                                (hashes, cutoff)).rowcount)
    return conn.execute(f"DELETE FROM layer_texts WHERE hash IN ({','.join('?' * len(hashes))})"
                        " AND touched_at < ?", (*hashes, cutoff)).rowcount


def sweep_texts(conn: sqlite3.Connection, policy: Policy, now: datetime) -> Pass:
    """The layer texts no kept snapshot names, untouched for ``TEXTS_GRACE``, on one
    connection (``parley db vacuum``: every batch at once)."""
    done = Pass()
    for part in _chunks(unnamed_texts(conn, named_texts(conn), now), policy.batch):
        done.add("layer_texts", delete_texts(conn, part, now))
    return done


# -- figures ----------------------------------------------------------------------------------

COUNTED = ("sessions", "messages", "turns", "llm_calls", "context_snapshots", "layer_texts",
           "compactions", "inbox", "outbox")


def table_sizes(conn: sqlite3.Connection) -> dict[str, int]:
    """Bytes per table, its indexes included (SQLite's ``dbstat``), or {} without it."""
    try:
        rows = conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall()
        owners = dict(conn.execute(
            "SELECT name, tbl_name FROM sqlite_schema WHERE type IN ('table', 'index')"
        ).fetchall())
    except sqlite3.Error:
        return {}
    out: dict[str, int] = {}
    for name, size in rows:
        owner = owners.get(name, name)
        out[owner] = out.get(owner, 0) + int(size)
    return out


def _rows(conn: Any, tables: Any) -> dict[str, int]:
    return {t: int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in tables}


def _tail(conn: Any) -> dict[str, Any]:
    return {"delivered_outbox": int(conn.execute(
                "SELECT COUNT(*) FROM outbox WHERE status = 'delivered'").fetchone()[0]),
            "oldest_snapshot": conn.execute(
                "SELECT MIN(created_at) FROM context_snapshots").fetchone()[0]}


def stats_postgres(conn: Any) -> dict[str, Any]:
    """``stats`` on PostgreSQL: the database's size, each table's with its indexes and TOAST
    (``pg_total_relation_size``); free space is PostgreSQL's own (no free-page count)."""
    total = int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])
    sizes = {str(name): int(size) for name, size in conn.execute(
        "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = current_schema() AND c.relkind = 'r'")}
    rows = _rows(conn, [t for t in COUNTED if t in sizes])
    used, turns = sum(sizes.values()), rows.get("turns", 0)
    return {"bytes": total, "used_bytes": used, "free_bytes": None, "rows": rows,
            "table_bytes": sizes, "bytes_per_turn": round(used / turns) if turns else None,
            **_tail(conn)}


def stats(conn: sqlite3.Connection) -> dict[str, Any]:
    """What ``parley db stats`` shows: pages, free pages, rows and bytes per table, and
    bytes per stored turn."""
    if _postgres(conn):
        return stats_postgres(conn)
    page = int(conn.execute("PRAGMA page_size").fetchone()[0])
    pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
    free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    rows: dict[str, int] = {}
    for table in COUNTED:
        try:
            rows[table] = int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
        except sqlite3.OperationalError:
            continue
    used = (pages - free) * page
    turns = rows.get("turns", 0)
    return {"bytes": pages * page, "used_bytes": used, "free_bytes": free * page,
            "rows": rows, "table_bytes": table_sizes(conn),
            "bytes_per_turn": round(used / turns) if turns else None, **_tail(conn)}


def policy_of(config: RetentionConfig) -> Policy:
    return Policy(turns_max_age=config.turns_max_age,
                  turns_max_per_session=int(config.turns_max_per_session),
                  snapshots_max_age=config.snapshots_max_age,
                  outbox_delivered_max_age=config.outbox_delivered_max_age,
                  inbox_done_max_age=config.inbox_done_max_age, batch=config.batch)


async def prune_store(db: Database, policy: Policy, now: datetime) -> Pass:
    """One batch of every rule in one short write transaction of the gateway's connection
    (the same lock as a turn's writes: a turn waits at most for one batch)."""
    return await db._write(lambda conn: prune_once(conn, policy, now), slow=True)


async def sweep_texts_store(db: Database, policy: Policy, now: datetime) -> list[str]:
    """``sweep_texts`` in the gateway: the snapshots read on the database's thread with no
    lock held (a turn never waits for it), the texts removed a batch per short transaction.
    The hashes removed."""
    named = await db.read_alone(named_texts)
    gone = await db.read_alone(lambda conn: unnamed_texts(conn, named, now))
    removed: list[str] = []
    for part in _chunks(gone, policy.batch):
        if await db._write(partial(delete_texts, hashes=part, now=now), slow=True):
            removed.extend(part)  # (a text touched meanwhile stays: forgetting it is harmless)
    return removed


async def stats_store(db: Database) -> dict[str, Any]:
    """``stats`` over the gateway's own connection (how ``parley db stats`` reads
    PostgreSQL)."""
    return await db._write(stats, slow=True)
