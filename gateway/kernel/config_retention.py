"""``retention``: how long the database keeps what it no longer needs for a turn (issue 24).

Applied in the background (``gateway/retention.py``) and by ``parley db vacuum``. Raw turns are
only ever removed once a compaction summary covers them (a session's history since its last
summary is never touched), so every turn kept can still be replayed.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ByteSize, Field

from gateway.kernel.config_fields import Duration, Section


class RetentionConfig(Section):
    turns_max_age: Duration = 0.0
    """Summarised turns (messages, snapshots, turn rows) older than this are removed; 0 keeps
    them however old. A turn whose history a kept snapshot still reads stays (replay works for
    every snapshot kept), so set it no lower than ``snapshots_max_age``. Usage records
    (``llm_calls``) always stay."""
    turns_max_per_session: Annotated[ByteSize, Field(ge=0)] = ByteSize(0)
    """A session's stored messages beyond this size lose their oldest summarised turns first;
    0: no cap."""
    snapshots_max_age: Duration = 30 * 86400.0
    """Context snapshots (``parley context``, replay) older than this are removed; 0 keeps
    them. The turns themselves stay."""
    outbox_delivered_max_age: Duration = 24 * 3600.0
    """Delivered replies are kept this long (duplicate protection), then removed; 0 keeps
    them."""
    inbox_done_max_age: Duration = 72 * 3600.0
    """Answered incoming messages are kept this long (a platform resending one is still
    recognised), then removed; 0 keeps them."""
    sweep_every: Duration = Field(3600.0, gt=0)
    """How often the background sweep runs (once soon after the start, too)."""
    batch: int = Field(500, gt=0, le=100_000)
    """Rows removed per transaction: a turn's write never waits behind a long delete."""
