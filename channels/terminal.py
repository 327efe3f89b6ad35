"""The terminal channel behind ``parley chat``: same bus, agent and session store as the gateway.

Replies are rendered as markdown with rich. ``ask()`` sends one message and waits for its
answer, which is all ``parley chat -m`` needs; the interactive loop reads lines in a thread so
the event loop keeps running turns meanwhile.
"""

from __future__ import annotations

import asyncio
import logging

from rich.console import Console
from rich.markdown import Markdown

from channels.base import ChannelBase, ChannelStatus
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import TerminalChannelConfig
from gateway.kernel.events import InboundMessage, OutboundMessage
from gateway.kernel.values import ChannelHints, Delivery

_log = logging.getLogger(__name__)

FINAL_KINDS = frozenset({"reply", "error", "notice"})
EXIT_WORDS = frozenset({"/exit", "/quit", ":q", "exit", "quit"})


class TerminalChannel(ChannelBase):
    name = "terminal"
    hints = ChannelHints(markup="Markdown (rendered in a terminal)",
                         etiquette="One person at a keyboard; keep answers readable in a "
                                   "terminal.")

    def __init__(self, config: TerminalChannelConfig, bus: MessageBus, *,
                 console: Console | None = None, markdown: bool = True) -> None:
        self.config = config
        self.bus = bus
        self.console = console or Console()
        self.markdown = markdown
        self._waiters: dict[str, asyncio.Future[OutboundMessage]] = {}
        self._running = False

    async def start(self) -> None:
        self._running = True

    async def stop(self) -> None:
        self._running = False
        for fut in self._waiters.values():
            if not fut.done():
                fut.cancel()
        self._waiters.clear()

    def status(self) -> ChannelStatus:
        return ChannelStatus(running=self._running, detail={"chat_id": self.config.chat_id})

    async def send(self, msg: OutboundMessage) -> Delivery:
        self.show(msg)
        if msg.kind in FINAL_KINDS and msg.reply_to in self._waiters:
            fut = self._waiters.pop(msg.reply_to)
            if not fut.done():
                fut.set_result(msg)
        return Delivery(ok=True)

    def show(self, msg: OutboundMessage) -> None:
        if msg.kind == "progress":
            self.console.print(f"[dim]… {msg.text}[/dim]")
        elif msg.kind == "error":
            self.console.print(f"[bold red]{msg.text}[/bold red]", highlight=False)
        elif self.markdown:
            self.console.print(Markdown(msg.text))
        else:
            self.console.print(msg.text, markup=False, highlight=False)

    async def ask(self, text: str, *, wait: float | None = None) -> OutboundMessage:
        """Send one message as the terminal user and wait for the answer to it."""
        msg = InboundMessage(channel=self.name, chat_id=self.config.chat_id,
                             sender_id=self.config.sender_id, sender_name="terminal user",
                             text=text, kind="command" if text.startswith("/") else "user",
                             trust="owner")
        fut: asyncio.Future[OutboundMessage] = asyncio.get_running_loop().create_future()
        self._waiters[msg.message_id] = fut
        await self.bus.publish_inbound(msg)
        try:
            return await asyncio.wait_for(fut, wait)
        finally:
            self._waiters.pop(msg.message_id, None)

    async def interactive(self) -> None:
        """Read lines until EOF or /exit, answering each in turn."""
        self.console.print("[bold]Parley[/bold] — type a message, /help for commands, "
                           "/exit to leave.")
        while True:
            try:
                line = await asyncio.to_thread(input, "you › ")
            except EOFError:
                self.console.print()
                return
            text = line.strip()
            if not text:
                continue
            if text.lower() in EXIT_WORDS:
                return
            with self.console.status("thinking…", spinner="dots"):
                await self.ask(text)
