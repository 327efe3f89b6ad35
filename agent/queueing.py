"""What happens to messages that arrive while their session is busy (pure functions).

Nothing here drops a message: ``collect`` merges waiting messages into one follow-up turn,
``fold`` squeezes the oldest into a one-line summary when the queue passes its cap, and every
result keeps the stored inbound messages it covers (``sources``) so each is marked answered.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field, replace

from gateway.kernel.events import InboundMessage, lowest_trust


@dataclass(slots=True)
class Work:
    msg: InboundMessage
    """What the turn answers: one message, or several merged into one."""
    sources: list[InboundMessage] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.sources:
            self.sources = [self.msg]


def _line(msg: InboundMessage, group: bool) -> str:
    return f"[{msg.sender_name or msg.sender_id}] {msg.text}" if group else msg.text


def merge(works: list[Work]) -> Work:
    """Several waiting messages → one turn (``collect``), newest message's routing kept and
    the least trusted sender's level (one guest among them makes it a guest's turn)."""
    if len(works) == 1:
        return works[0]
    last = works[-1].msg
    group = any(w.msg.chat_type == "group" for w in works)
    text = "\n\n".join(_line(w.msg, group and not w.msg.senders_inline)
                       for w in works)
    msg = replace(last, text=text, media=tuple(m for w in works for m in w.msg.media),
                  mentioned=any(w.msg.mentioned for w in works),
                  senders_inline=group, trust=lowest_trust(w.msg.trust for w in works))
    return Work(msg, [s for w in works for s in w.sources])


FOLD_ITEM_CHARS = 60
FOLD_LINE_CHARS = 1200


def fold(works: list[Work], cap: int) -> list[Work]:
    """Keep at most ``cap`` waiting turns: the oldest become one line that still says what
    each message was (rebuilt from the originals, so folding twice loses nothing more)."""
    if len(works) <= cap:
        return works
    count = len(works) - cap + 1
    old, rest = works[:count], works[count:]
    sources = [s for w in old for s in w.sources]
    items = [f"{s.sender_name or s.sender_id}: {textwrap.shorten(s.text, FOLD_ITEM_CHARS) or '…'}"
             for s in sources]
    summary, shown = "", 0
    for item in items:
        if len(summary) + len(item) > FOLD_LINE_CHARS:
            break
        summary, shown = f"{summary} | {item}" if summary else item, shown + 1
    if shown < len(items):
        summary += f" | … and {len(items) - shown} more"
    last = old[-1].msg
    msg = replace(last, text=f"[{len(sources)} earlier messages sent while I was busy, folded] "
                             f"{summary}",
                  media=tuple(m for w in old for m in w.msg.media),
                  senders_inline=True, trust=lowest_trust(s.trust for s in sources))
    return [Work(msg, sources), *rest]


def next_batch(waiting: list[Work], mode: str) -> tuple[Work, int]:
    """The next turn from the front of the queue and how many queued items it takes.

    ``followup`` takes one; ``collect`` and ``steer`` take every waiting message up to the
    next command or context-only message, which are always handled on their own.
    """
    first = waiting[0]
    if mode == "followup" or _alone(first):
        return first, 1
    count = 1
    while count < len(waiting) and not _alone(waiting[count]):
        count += 1
    return merge(waiting[:count]), count


def _alone(work: Work) -> bool:
    """Commands and context-only messages (group chatter kept as history) are never merged."""
    return work.msg.is_command or work.msg.context_only
