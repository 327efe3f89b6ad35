"""The stored history a turn reads, kept per session between turns.

Messages are only ever appended (ids rise), so after the first turn of a session only the rows
written since are read and parsed; the cache holds the messages since the last compaction (at
most ``max_recent_messages``) of the most recently used sessions. A turn's own messages join it
once their write committed (``_written``), and while no other connection wrote since (the
version ``turn_start`` read, SQLite's ``PRAGMA data_version``) the next turn reads nothing.
Another process writing to the same database (``parley chat`` beside the gateway) moves that
version: the next read starts after the last id held, whoever wrote the rows.

What the context builder needs of the whole window every turn (the bodies in order, their
tokens in all, where the tool results are) is kept beside the rows and carried forward with
them (``HistoryRows``), so a turn's own cost does not grow with its history: at a few hundred
messages a turn went over each of them four times in Python (bench/RESULTS.md, round fifteen).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agent.fingerprint import DIGEST_BYTES, json_digest, message_json
from gateway.kernel.store import Compaction, Store, StoredMessage

SESSIONS_KEPT = 128
"""Sessions whose history stays in memory (an idle one is read again when it speaks): more
than the chats a busy gateway answers at once, or every turn would read and parse its whole
history again (100 chats in turn evicted each other at 64; bench/)."""
TOKENS_KEPT = 2_000_000
"""And at most this many tokens of history held, all sessions together (~8 MB of text)."""


class HistoryRows(list[StoredMessage]):
    """The rows a session's turn reads (a list, oldest first), with what the context builder
    would otherwise work out from all of them: ``bodies`` (each row's ``body``, in order),
    ``tokens`` (their sum), ``tools`` (the positions of the tool results), ``digests``
    (each body's part of the context's fingerprint, ``agent/fingerprint``, one after
    another: ``DIGEST_BYTES`` each) and ``raw``: the bodies as that fingerprint writes them
    (``message_json``), joined by commas — what a request body says of them, copied from
    here where writing them again walked every message of the window, every turn
    (bench/RESULTS.md, round seventeen). ``starts``: where each body begins, counted from
    the first body ever joined (``raw`` starts at ``starts[0]``: cutting rows off the front
    moves no offset). The digests and the offsets are flat bytes and a machine-integer array,
    not lists of objects: carrying a list forward touches every object in it (a reference
    counted up, then down when the list it replaced goes; a cache miss each when the window
    is cold, as at 100 chats: bench/RESULTS.md, round eighteen). Made here, from rows whose
    figures were carried forward; never changed once made."""

    __slots__ = ("bodies", "digests", "raw", "starts", "tokens", "tools")

    def __init__(self, rows: Iterable[StoredMessage], bodies: list[dict[str, Any]],
                 tokens: int, tools: list[int], digests: bytes, raw: bytes,
                 starts: array[int]) -> None:
        super().__init__(rows)
        self.bodies = bodies
        self.tokens = tokens
        self.tools = tools
        self.digests = digests
        self.raw = raw
        self.starts = starts

    @classmethod
    def of(cls, rows: list[StoredMessage]) -> HistoryRows:
        """The figures worked out from ``rows`` alone."""
        bodies = [m.body for m in rows]
        encoded = [message_json(b) for b in bodies]
        return cls(rows, bodies, sum(m.tokens for m in rows),
                   [i for i, m in enumerate(rows) if m.role == "tool"],
                   b"".join(map(json_digest, encoded)), b",".join(encoded),
                   array("q", _starts(encoded, 0)))

    def extended(self, new: list[StoredMessage]) -> HistoryRows:
        """These rows and then ``new``: only the new rows' figures worked out (each list
        copied once: this runs every turn, over the whole window)."""
        if not new:
            return self
        bodies = [m.body for m in new]
        encoded = [message_json(b) for b in bodies]
        n = len(self)
        joined = b",".join(encoded)
        at = self.starts[0] + len(self.raw) + 1 if n else 0
        out = HistoryRows(self, self.bodies + bodies,
                          self.tokens + sum(m.tokens for m in new),
                          self.tools + [n + i for i, m in enumerate(new) if m.role == "tool"],
                          self.digests + b"".join(map(json_digest, encoded)),
                          self.raw + b"," + joined if n else joined,
                          self.starts + array("q", _starts(encoded, at)))
        list.extend(out, new)  # these rows copied as a block, then the new: not one by one
        return out

    def without(self, cut: int) -> HistoryRows:
        """The rows from ``cut`` on (these same rows when ``cut`` ≤ 0)."""
        if cut <= 0:
            return self
        return HistoryRows(self[cut:], self.bodies[cut:],
                           self.tokens - sum(m.tokens for m in self[:cut]),
                           [i - cut for i in self.tools if i >= cut],
                           self.digests[cut * DIGEST_BYTES:],
                           self.raw[self.starts[cut] - self.starts[0]:] if cut < len(self)
                           else b"", self.starts[cut:])

    def digest(self, i: int) -> bytes:
        """The ``i``-th row's digest."""
        return self.digests[i * DIGEST_BYTES:(i + 1) * DIGEST_BYTES]

    def raw_from(self, i: int) -> bytes:
        """``raw`` of the rows from ``i`` on."""
        return self.raw[self.starts[i] - self.starts[0]:] if i < len(self) else b""


def _starts(encoded: list[bytes], at: int) -> list[int]:
    out = []
    for e in encoded:
        out.append(at)
        at += len(e) + 1
    return out


@dataclass(slots=True)
class _Held:
    start: int
    rows: HistoryRows
    """The window itself, at most the limit: what ``history`` answers, as it is (a session
    with more rows than the limit once held one more, to tell, and answered a copy without
    it on every read: the whole window's bodies, digests and text copied each turn)."""
    more: bool
    """Whether older rows since ``start`` exist than ``rows`` hold (rows are only appended,
    so once true it stays true until a compaction moves ``start``)."""
    version: int | None = None
    """The database's version (``Store.turn_version``) as of which these are all the rows
    there are; None: read what came since, next time."""

    @property
    def tokens(self) -> int:
        return self.rows.tokens


def _row_id(row: StoredMessage) -> int:
    return row.id


class HistoryCache:
    def __init__(self, store: Store, limit: int) -> None:
        self.store = store
        self.limit = limit
        self._held: OrderedDict[int, _Held] = OrderedDict()
        self._tokens = 0
        store.tell_messages_written(self._written)

    async def history(self, session_id: int,
                      compaction: Compaction | None) -> tuple[HistoryRows, bool]:
        """Messages since the last compaction, at most ``limit``; and whether there were
        more (then the session is due for compaction)."""
        start = compaction.first_kept_id if compaction else 0
        version = self.store.turn_version(session_id)
        held = self._held.get(session_id)
        if held is not None and held.start == start and version is not None \
                and held.version == version:
            # nobody else wrote since, and this process's own rows came with their turns
            self._held.move_to_end(session_id)
            return held.rows, held.more
        rows = held.rows if held is not None else None
        more = held.more if held is not None else False
        if held is not None and held.start < start and held.rows and held.rows[0].id <= start:
            # a compaction moved the start on within what is held: those rows are kept, not
            # read and parsed again (and nothing from the new start on is older than them)
            rows, more = held.rows.without(bisect_left(held.rows, start, key=_row_id)), False
        elif held is not None and held.start != start:
            rows = None
        if rows is None:
            # one more than the limit read, only to tell whether there are more
            now = self._capped(start, HistoryRows.of(await self.store.recent_messages(
                session_id, self.limit + 1, from_id=start)), False, version)
        else:
            after = rows[-1].id + 1 if rows else start
            new = await self.store.recent_messages(session_id, self.limit + 1, from_id=after)
            # carried forward: what came added, what left the window taken off
            now = self._capped(start, rows.extended(new), more, version)
        self._hold(session_id, now, held)
        return now.rows, now.more

    def _capped(self, start: int, rows: HistoryRows, more: bool,
                version: int | None) -> _Held:
        """``rows`` held as a window of at most the limit, its oldest rows taken off."""
        if len(rows) > self.limit:
            return _Held(start, rows.without(len(rows) - self.limit), True, version)
        return _Held(start, rows, more, version)

    def _hold(self, session_id: int, now: _Held, held: _Held | None) -> None:
        if held is not None:
            self._tokens -= held.tokens
        self._held[session_id] = now
        self._held.move_to_end(session_id)
        self._tokens += now.tokens
        while len(self._held) > 1 and (len(self._held) > SESSIONS_KEPT
                                       or self._tokens > TOKENS_KEPT):
            self._tokens -= self._held.popitem(last=False)[1].tokens

    def _written(self, session_id: int, rows: list[StoredMessage], version: int) -> None:
        """A turn's messages, committed (``Store.tell_messages_written``) at ``version``:
        added to the rows held when nothing else was written between them (the same version),
        so the next turn reads nothing; otherwise the next turn reads what came since."""
        held = self._held.get(session_id)
        if held is None or held.version is None:
            return
        if held.version != version or not rows or (held.rows and rows[0].id <= held.rows[-1].id):
            held.version = None
            return
        self._hold(session_id, self._capped(held.start, held.rows.extended(rows), held.more,
                                            version), held)
