"""The inbox's cleanup: by age, by total size (oldest first), never a file a pending message
still refers to."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from gateway.inbox_cleanup import InboxCleanup
from gateway.kernel.config_media import InboxConfig
from gateway.kernel.events import InboundMessage, Media
from gateway.kernel.store import Store

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DAY = 86400.0


def received(workspace: Path, rel: str, size: int, days_old: float) -> Path:
    path = workspace / "inbox" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    stamp = NOW.timestamp() - days_old * DAY
    os.utime(path, (stamp, stamp))
    return path


async def test_old_files_go_unless_a_pending_message_uses_them(store: Store,
                                                               tmp_path: Path) -> None:
    old = received(tmp_path, "telegram/1/old.ogg", 10, days_old=40)
    queued = received(tmp_path, "telegram/1/queued.ogg", 10, days_old=40)
    gone_chat = received(tmp_path, "discord/9/a.png", 10, days_old=31)
    fresh = received(tmp_path, "telegram/1/new.pdf", 10, days_old=1)
    await store.inbox_add(InboundMessage(channel="telegram", chat_id="1", sender_id="1",
                                         text="", message_id="m1", media=(
                                             Media(kind="audio", path=str(queued)),)))
    cleanup = InboxCleanup(InboxConfig(max_age=30 * DAY, max_total=0), store,
                           workspace=tmp_path, now=NOW.timestamp)
    swept = await cleanup.sweep_once()
    assert (swept.removed, swept.kept_in_use) == (2, 1)
    assert not old.exists() and not gone_chat.exists()
    assert queued.exists() and fresh.exists()
    assert not (tmp_path / "inbox" / "discord").exists()  # empty folders go too
    [pending] = await store.inbox_pending()
    await store.finish_inbound([pending], [])  # answered: now it may go
    assert (await cleanup.sweep_once()).removed == 1 and not queued.exists()


async def test_the_oldest_go_first_beyond_the_total(store: Store, tmp_path: Path) -> None:
    files = [received(tmp_path, f"local/c/{n}.bin", 100, days_old=10 - n) for n in range(5)]
    cleanup = InboxCleanup(InboxConfig(max_age=0, max_total=250), store, workspace=tmp_path,
                           now=NOW.timestamp)
    swept = await cleanup.sweep_once()
    assert (swept.removed, swept.total) == (3, 200)
    assert [f.exists() for f in files] == [False, False, False, True, True]
