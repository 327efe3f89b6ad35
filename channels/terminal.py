"""The terminal channel behind ``parley chat``: same bus, agent and session store as the gateway.

Replies are rendered as markdown with rich (``--plain``: as they are, never wrapped, so a pipe
gets the text unchanged). ``ask()`` sends one message and waits for its answer, which is all
``parley chat -m`` needs.

The interactive loop reads lines with prompt_toolkit on a terminal: line editing, Up/Down
through a history kept in a file, and anything printed (log lines included) shown above the
prompt rather than over it. While a turn runs a spinner turns; Ctrl-C stops the turn as
``/stop`` does, and at the prompt a second Ctrl-C in a row leaves. Without a terminal (a pipe)
it reads plain lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markdown import Markdown
from rich.text import Text

from channels.base import ChannelBase, ChannelStatus
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import TerminalChannelConfig
from gateway.kernel.events import InboundMessage, OutboundMessage
from gateway.kernel.values import ChannelHints, Delivery

_log = logging.getLogger(__name__)

FINAL_KINDS = frozenset({"reply", "error", "notice"})
EXIT_WORDS = frozenset({"/exit", "/quit", ":q", "exit", "quit"})
PROMPT = "you › "


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
        """What the agent sent, always as text: never read as Rich markup, and plain output
        is never hard-wrapped (a pipe gets each line as the model wrote it)."""
        if msg.kind == "progress":
            self.console.print(Text(f"… {msg.text}", style="dim"), soft_wrap=not self.markdown)
        elif msg.kind == "error":
            self.console.print(Text(msg.text, style="bold red"), soft_wrap=not self.markdown)
        elif self.markdown:
            self.console.print(Markdown(msg.text))
        else:
            self.console.print(msg.text, markup=False, highlight=False, soft_wrap=True)

    def _inbound(self, text: str) -> InboundMessage:
        return InboundMessage(channel=self.name, chat_id=self.config.chat_id,
                              sender_id=self.config.sender_id, sender_name="terminal user",
                              text=text, kind="command" if text.startswith("/") else "user",
                              trust="owner")

    async def ask(self, text: str, *, wait: float | None = None) -> OutboundMessage:
        """Send one message as the terminal user and wait for the answer to it."""
        msg = self._inbound(text)
        fut: asyncio.Future[OutboundMessage] = asyncio.get_running_loop().create_future()
        self._waiters[msg.message_id] = fut
        await self.bus.publish_inbound(msg)
        try:
            return await asyncio.wait_for(fut, wait)
        finally:
            self._waiters.pop(msg.message_id, None)

    async def turn(self, text: str) -> bool:
        """Ask ``text`` with a spinner; Ctrl-C meanwhile sends ``/stop``. True if stopped."""
        interrupted = asyncio.Event()
        answer = asyncio.ensure_future(self.ask(text))
        with _on_sigint(interrupted.set), self.console.status("thinking…", spinner="dots"):
            stop = asyncio.ensure_future(interrupted.wait())
            await asyncio.wait([answer, stop], return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
        if answer.done():
            answer.result()
            return False
        answer.cancel()  # the stopped turn sends no answer of its own: /stop's notice says it
        await asyncio.gather(answer, return_exceptions=True)
        await self.ask("/stop")
        return True

    async def interactive(self, *, history: Path | None = None, input: Any = None,
                          output: Any = None) -> None:
        """Read lines until EOF, /exit or two Ctrl-C at the prompt, answering each in turn.
        ``input``/``output`` are prompt_toolkit's (tests pass a pipe); without them a
        terminal gets prompt_toolkit and anything else plain lines."""
        self.console.print(Text.assemble(("Parley", "bold"), " — type a message, /help for "
                                         "commands, /exit to leave; Ctrl-C stops an answer."))
        if input is None and not (sys.stdin.isatty() and sys.stdout.isatty()):
            await self._plain_loop()
            return
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.patch_stdout import patch_stdout

        if history is not None:
            history.parent.mkdir(parents=True, exist_ok=True)
        session: PromptSession[str] = PromptSession(
            history=FileHistory(str(history)) if history else InMemoryHistory(),
            input=input, output=output)
        interrupts = 0
        while True:
            try:
                with patch_stdout(raw=True):
                    line = await session.prompt_async(PROMPT)
            except KeyboardInterrupt:
                interrupts += 1
                if interrupts >= 2:
                    return
                self.console.print(Text("(Ctrl-C again or /exit to leave)", style="dim"))
                continue
            except EOFError:
                return
            interrupts = 0
            if await self._handle(line):
                return

    async def _plain_loop(self) -> None:
        while True:
            try:
                line = await asyncio.to_thread(input, PROMPT)
            except EOFError:
                self.console.print()
                return
            if await self._handle(line):
                return

    async def _handle(self, line: str) -> bool:
        """Answer one line; True when it asks to leave."""
        text = line.strip()
        if not text:
            return False
        if text.lower() in EXIT_WORDS:
            return True
        await self.turn(text)
        return False


@contextlib.contextmanager
def leaving() -> Iterator[None]:
    """Around the shutdown after the person chose to leave: one stray Ctrl-C (a key held a
    moment too long) does not turn a clean exit into an interrupted one; a second aborts."""
    presses = 0

    def pressed() -> None:
        nonlocal presses
        presses += 1
        if presses >= 2:
            raise KeyboardInterrupt

    with _on_sigint(pressed):
        yield


@contextlib.contextmanager
def _on_sigint(callback: Any) -> Iterator[None]:
    """Ctrl-C calls ``callback`` instead of interrupting the program, inside the block."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, callback)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)
