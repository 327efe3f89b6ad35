"""The WebChat conversation log: what each browser chat showed, in its own SQLite table.

The page's history comes from here, not from the agent's session table, because the two answer
different questions: a session is what the model sees (``/new`` starts a fresh one), the log is
what the person saw (their messages as sent, replies, notices, errors), and it must be complete
across ``/new`` and gateway restarts. ``seq`` is one counter for all chats, so it only ever grows
within a chat and ``after=<seq>`` reads on without gaps.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from channels.webchat_frames import AUDIO_TYPES, UPLOAD_TYPES, ImageData
from gateway.kernel.frozen import frozen
from gateway.kernel.store import Store
from gateway.kernel.store_queues import mark_delivered
from gateway.kernel.store_sql import Migration, TableSet, ordered_seq_ddl, register
from gateway.kernel.values import OutboxMark

Role = Literal["user", "assistant"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS webchat_log (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id TEXT NOT NULL,
    role TEXT NOT NULL,
    kind TEXT NOT NULL,
    text TEXT NOT NULL,
    image TEXT,
    media_name TEXT,
    message_id TEXT,
    reply_to TEXT,
    idempotency_key TEXT NOT NULL UNIQUE,
    accepted INTEGER NOT NULL DEFAULT 1,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS webchat_log_chat ON webchat_log(chat_id, seq);
CREATE INDEX IF NOT EXISTS webchat_log_media ON webchat_log(media_name)
    WHERE media_name IS NOT NULL;
"""
SCHEMA_PG = SCHEMA.replace("seq INTEGER PRIMARY KEY AUTOINCREMENT", "seq BIGSERIAL PRIMARY KEY")
"""PostgreSQL's twin: the same table, a BIGSERIAL ``seq``."""
SHARED_PG = ordered_seq_ddl("webchat_log", 19002, "parley_webchat", "NEW.role = 'assistant'")
"""Several processes (issue 19): entries take their ``seq`` under a lock held until they
commit (visible in ``seq`` order), and an answer sends ``NOTIFY parley_webchat`` (its chat):
the process a page's socket is open on pushes it, whichever process wrote it."""
TABLES = register(TableSet("webchat", (Migration(1, SCHEMA, SCHEMA_PG),
                                       Migration(2, "", SHARED_PG)), ("webchat_log",),
                           generated_ids={"webchat_log": "seq"}))

MEDIA_NAME = re.compile(r"[0-9a-f]{32}\.(png|jpg|gif|webp|webm|ogg|m4a|mp3|wav)")
"""The names ``save_image`` gives: nothing else is ever looked up under the media folder."""
_COLS = "seq, chat_id, role, kind, text, image, message_id, reply_to, accepted, created_at"


@frozen
class LogEntry:
    seq: int
    chat_id: str
    role: Role
    kind: str
    text: str
    image: dict[str, Any] | None
    """``{"name", "mime", "size"}`` of a stored image (``"kind": "audio"`` too for a
    recording); ``name`` is served by /api/media."""
    message_id: str | None
    reply_to: str | None
    accepted: bool
    """A user message the bus took; False only between logging and publishing it."""
    created_at: str

    def to_json(self) -> dict[str, Any]:
        """What the page gets; ``pending`` marks a user message the bus has not taken yet (the
        page that sent it keeps it in its outbox and sends it again)."""
        return {"seq": self.seq, "role": self.role, "kind": self.kind, "text": self.text,
                "image": None if is_audio(self.image) else self.image,
                **({"audio": self.image} if is_audio(self.image) else {}),
                "message_id": self.message_id, "reply_to": self.reply_to,
                "created_at": self.created_at, "pending": not self.accepted}


def save_image(image: ImageData, folder: Path) -> dict[str, Any]:
    """Write an upload (an image or a recording) into the chat's inbox ``folder`` under a
    name of ours (blocking; run in a thread)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{uuid.uuid4().hex}{UPLOAD_TYPES[image.mime]}"
    with open(folder / name, "xb") as fh:
        fh.write(image.data)
    saved = {"name": name, "mime": image.mime, "size": len(image.data)}
    return {**saved, "kind": "audio"} if image.mime in AUDIO_TYPES else saved


def is_audio(saved: dict[str, Any] | None) -> bool:
    return bool(saved) and saved.get("kind") == "audio"  # type: ignore[union-attr]


def _entry(row: Any) -> LogEntry:
    image = json.loads(row[5]) if row[5] else None
    return LogEntry(int(row[0]), row[1], row[2], row[3], row[4], image, row[6], row[7],
                    bool(row[8]), row[9])


def user_key(chat_id: str, message_id: str) -> str:
    """The log's idempotency key of a user message: the page's own id for it, per chat."""
    return f"in:{chat_id}:{message_id}"


def writer(*, chat_id: str, role: Role, kind: str, text: str, key: str,
           image: dict[str, Any] | None = None, message_id: str | None = None,
           reply_to: str | None = None, accepted: bool = True,
           created_at: datetime | None = None,
           mark: OutboxMark | None = None) -> Callable[[Any], tuple[LogEntry, bool]]:
    """The log's write of one message (``add``), for a transaction of the caller's (a
    turn's: ``TurnSend``)."""
    created = (created_at or datetime.now(UTC)).astimezone(UTC).isoformat()
    image_json = json.dumps(image, separators=(",", ":")) if image else None
    values = (chat_id, role, kind, text, image_json, image["name"] if image else None,
              message_id, reply_to, key, int(accepted), created)

    def write(db: Any) -> tuple[LogEntry, bool]:
        if mark is not None:
            mark_delivered(db, mark)
        row = db.execute(f"SELECT {_COLS} FROM webchat_log WHERE idempotency_key = ?",
                         (key,)).fetchone()
        if row is not None:
            return _entry(row), False
        seq = db.execute(
            "INSERT INTO webchat_log (chat_id, role, kind, text, image, media_name, "
            "message_id, reply_to, idempotency_key, accepted, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", values).lastrowid
        assert seq is not None
        return LogEntry(int(seq), chat_id, role, kind, text, image, message_id, reply_to,
                        accepted, created), True

    return write


class WebchatLog:
    def __init__(self, store: Store) -> None:
        self._store = store
        self.shared = store.dialect == "postgresql"
        """Other processes answer this log's chats too (``answers_after`` reads them)."""

    async def ensure_schema(self) -> None:
        await self._store.migrate(TABLES)

    async def find(self, key: str) -> LogEntry | None:
        row = await self._store.fetchone(
            f"SELECT {_COLS} FROM webchat_log WHERE idempotency_key = ?", (key,))
        return _entry(row) if row else None

    async def add(self, *, chat_id: str, role: Role, kind: str, text: str, key: str,
                  image: dict[str, Any] | None = None, message_id: str | None = None,
                  reply_to: str | None = None, accepted: bool = True,
                  created_at: datetime | None = None,
                  mark: OutboxMark | None = None) -> tuple[LogEntry, bool]:
        """Log one message once: ``(entry, True)`` when new, the earlier entry and False when
        ``key`` was logged before. ``mark``: the outbox row of the answer marked delivered
        in the same transaction."""
        return await self._store.write(writer(
            chat_id=chat_id, role=role, kind=kind, text=text, key=key, image=image,
            message_id=message_id, reply_to=reply_to, accepted=accepted,
            created_at=created_at, mark=mark))

    async def mark_accepted(self, seq: int) -> None:
        async with self._store.transaction() as db:
            await db.execute("UPDATE webchat_log SET accepted = 1 WHERE seq = ?", (seq,))

    async def history(self, chat_id: str, *, after: int | None = None,
                      before: int | None = None, limit: int) -> tuple[list[LogEntry], bool]:
        """Entries oldest first: those after ``after``, else the newest ``limit`` (before
        ``before`` when given). The flag says whether more follow (``after``) or precede."""
        if after is not None:
            rows = await self._store.fetchall(
                f"SELECT {_COLS} FROM webchat_log WHERE chat_id = ? AND seq > ? "
                "ORDER BY seq LIMIT ?", (chat_id, after, limit + 1))
            more = len(rows) > limit
            return [_entry(r) for r in rows[:limit]], more
        rows = await self._store.fetchall(
            f"SELECT {_COLS} FROM webchat_log WHERE chat_id = ? AND seq < ? "
            "ORDER BY seq DESC LIMIT ?", (chat_id, before or 2**62, limit + 1))
        more = len(rows) > limit
        return [_entry(r) for r in reversed(rows[:limit])], more

    async def answers_after(self, chat_id: str, after: int) -> list[LogEntry]:
        """The chat's answers (assistant entries) past ``after``, oldest first."""
        rows = await self._store.fetchall(
            f"SELECT {_COLS} FROM webchat_log WHERE chat_id = ? AND seq > ? "
            "AND role = 'assistant' ORDER BY seq LIMIT 200", (chat_id, after))
        return [_entry(r) for r in rows]

    async def last_seq(self, chat_id: str) -> int:
        row = await self._store.fetchone(
            "SELECT MAX(seq) FROM webchat_log WHERE chat_id = ?", (chat_id,))
        return int(row[0]) if row and row[0] is not None else 0

    async def image_of(self, chat_id: str, name: str) -> dict[str, Any] | None:
        """The image ``name`` if it belongs to ``chat_id`` (a chat never reads another's)."""
        row = await self._store.fetchone(
            "SELECT image FROM webchat_log WHERE media_name = ? AND chat_id = ? LIMIT 1",
            (name, chat_id))
        return json.loads(row[0]) if row and row[0] else None
