"""The fake of DummyChat the contract kit drives (``parley.testing.PlatformFake``)."""

from __future__ import annotations

from typing import Any

from dummychat import PLATFORMS, DummyChatConfig, DummyPlatform


class DummyFake:
    pairing = True
    not_applicable: dict[str, str] = {}

    def __init__(self, platform: str = "kit", *, fresh: bool = True) -> None:
        """``fresh``: a new platform of that name; else the one a running channel made."""
        self.name = platform
        if fresh:
            PLATFORMS[platform] = DummyPlatform()
        self.platform = PLATFORMS[platform]

    def section(self, *, owner: str) -> DummyChatConfig:
        return DummyChatConfig(enabled=True, platform=self.name, allow_from=[owner],
                               max_length=120)

    def attach(self, channel: Any) -> None:
        return None

    def chat_of(self, user: str) -> str:
        return f"dm-{user}"

    async def user_says(self, user: str, text: str) -> None:
        update = self.platform.next_id()
        await self.platform.updates.put((update, user, text))
        while update not in self.platform.handled:
            self.platform.changed.clear()
            await self.platform.changed.wait()

    async def bot_messages(self, chat_id: str, count: int) -> list[str]:
        while len(self.platform.posts[chat_id]) < count:
            self.platform.changed.clear()
            await self.platform.changed.wait()
        return list(self.platform.posts[chat_id])

    async def fail_sends(self) -> None:
        self.platform.refuse = True
