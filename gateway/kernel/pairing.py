"""Pairing: how a stranger becomes someone the bot serves, with the owner's say-so.

A channel under ``dm_policy: pairing`` asks ``request()`` for a code when an unknown user
writes; the user is told the code and the owner runs ``parley pairing approve CHANNEL CODE``
(another process, same SQLite database). Channels check ``is_approved()`` on the next message,
so an approval takes effect without a restart.

Codes: 8 characters from an alphabet without look-alikes (no 0/O, 1/I/L), valid one hour, at
most three pending per channel so a flood of strangers cannot fill the table. A user who asks
again while their code is valid gets the same code.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from gateway.kernel.frozen import frozen
from gateway.kernel.store import Store
from gateway.kernel.store_sql import Migration, TableSet, register

__all__ = ["ALPHABET", "CODE_LENGTH", "Approval", "PairingCode", "PairingFull", "PairingStore",
           "normalize_code"]

ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 8
CODE_TTL_SECONDS = 3600.0
MAX_PENDING = 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pairing_codes (
    channel TEXT NOT NULL,
    code TEXT NOT NULL,
    user_id TEXT NOT NULL,
    user_name TEXT,
    chat_id TEXT,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (channel, code)
);
CREATE UNIQUE INDEX IF NOT EXISTS pairing_codes_user ON pairing_codes(channel, user_id);
CREATE TABLE IF NOT EXISTS pairing_approvals (
    channel TEXT NOT NULL,
    user_id TEXT NOT NULL,
    user_name TEXT,
    approved_at REAL NOT NULL,
    PRIMARY KEY (channel, user_id)
);
"""
_SCHEMA_PG = _SCHEMA.replace("REAL", "DOUBLE PRECISION")
"""PostgreSQL's twin: the same tables, times as DOUBLE PRECISION (seconds since the epoch)."""
TABLES = register(TableSet(
    "pairing", (Migration(1, _SCHEMA, _SCHEMA_PG),), ("pairing_codes", "pairing_approvals"),
    upsert_keys={"pairing_approvals": ("channel", "user_id")}))


class PairingFull(Exception):
    """``MAX_PENDING`` codes of other users are still waiting for the owner on this channel."""


@frozen
class PairingCode:
    channel: str
    code: str
    user_id: str
    user_name: str | None
    chat_id: str | None
    created_at: float
    expires_at: float
    new: bool = False
    """True when this request created the code (False: the user's still valid code)."""


@frozen
class Approval:
    channel: str
    user_id: str
    user_name: str | None
    approved_at: float


def normalize_code(code: str) -> str:
    """What the owner typed → the stored form: case and separators do not matter."""
    return "".join(ch for ch in code.upper() if ch.isalnum())


def _new_code() -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(CODE_LENGTH))


_CODE_COLS = "channel, code, user_id, user_name, chat_id, created_at, expires_at"


class PairingStore:
    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time,
                 ttl: float = CODE_TTL_SECONDS, max_pending: int = MAX_PENDING) -> None:
        """``clock`` is wall-clock seconds: codes are shared with another process (the CLI)."""
        self._store = store
        self._clock = clock
        self._ttl = ttl
        self._max_pending = max_pending
        self._ready = False

    async def setup(self) -> None:
        if not self._ready:
            await self._store.migrate(TABLES)
            self._ready = True

    async def is_approved(self, channel: str, user_id: str) -> bool:
        await self.setup()
        row = await self._store.fetchone(
            "SELECT 1 FROM pairing_approvals WHERE channel = ? AND user_id = ?",
            (channel, user_id))
        return row is not None

    async def request(self, channel: str, user_id: str, *, user_name: str | None = None,
                      chat_id: str | None = None) -> PairingCode:
        """The user's valid code, or a new one; ``PairingFull`` when too many are pending."""
        await self.setup()
        now = self._clock()
        async with self._store.transaction() as db:
            await db.execute("DELETE FROM pairing_codes WHERE expires_at <= ?", (now,))
            async with db.execute(f"SELECT {_CODE_COLS} FROM pairing_codes "
                                  "WHERE channel = ? AND user_id = ?", (channel, user_id)) as cur:
                row = await cur.fetchone()
            if row is not None:
                return PairingCode(*row)
            async with db.execute("SELECT COUNT(*) FROM pairing_codes WHERE channel = ?",
                                  (channel,)) as cur:
                count = await cur.fetchone()
            if count is not None and count[0] >= self._max_pending:
                raise PairingFull(f"{count[0]} pairing codes are already pending on {channel}")
            while True:
                code = _new_code()
                async with db.execute("SELECT 1 FROM pairing_codes WHERE channel = ? AND "
                                      "code = ?", (channel, code)) as cur:
                    if await cur.fetchone() is None:
                        break
            created = PairingCode(channel, code, user_id, user_name, chat_id, now,
                                  now + self._ttl, new=True)
            await db.execute(f"INSERT INTO pairing_codes ({_CODE_COLS}) VALUES (?, ?, ?, ?, ?, "
                             "?, ?)", (channel, code, user_id, user_name, chat_id, now,
                                       created.expires_at))
        return created

    async def approve(self, channel: str, code: str) -> Approval | None:
        """Approve the user a valid ``code`` belongs to; None when no such code is pending."""
        await self.setup()
        now = self._clock()
        wanted = normalize_code(code)
        async with self._store.transaction() as db:
            async with db.execute(
                    "SELECT user_id, user_name FROM pairing_codes WHERE channel = ? AND code = ? "
                    "AND expires_at > ?", (channel, wanted, now)) as cur:
                row = await cur.fetchone()
            if row is None:
                return None
            user_id, user_name = row
            await db.execute("INSERT OR REPLACE INTO pairing_approvals (channel, user_id, "
                             "user_name, approved_at) VALUES (?, ?, ?, ?)",
                             (channel, user_id, user_name, now))
            await db.execute("DELETE FROM pairing_codes WHERE channel = ? AND user_id = ?",
                             (channel, user_id))
        return Approval(channel, user_id, user_name, now)

    async def revoke(self, channel: str, user_id: str) -> bool:
        """Withdraw ``user_id``'s approval; False when there was none."""
        await self.setup()
        async with self._store.transaction() as db:
            cur = await db.execute("DELETE FROM pairing_approvals WHERE channel = ? AND "
                                   "user_id = ?", (channel, user_id))
            return cur.rowcount > 0

    async def pending(self, channel: str | None = None) -> list[PairingCode]:
        await self.setup()
        where, params = self._where(channel)
        rows = await self._store.fetchall(
            f"SELECT {_CODE_COLS} FROM pairing_codes WHERE expires_at > ? {where} "
            "ORDER BY created_at", (self._clock(), *params))
        return [PairingCode(*r) for r in rows]

    async def approvals(self, channel: str | None = None) -> list[Approval]:
        await self.setup()
        where, params = self._where(channel)
        rows = await self._store.fetchall(
            "SELECT channel, user_id, user_name, approved_at FROM pairing_approvals "
            f"WHERE 1 = 1 {where} ORDER BY approved_at", params)
        return [Approval(*r) for r in rows]

    @staticmethod
    def _where(channel: str | None) -> tuple[str, tuple[str, ...]]:
        return ("AND channel = ?", (channel,)) if channel else ("", ())
