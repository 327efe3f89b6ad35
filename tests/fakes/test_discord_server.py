"""The fake Discord behaves like Discord where our channel depends on it, seen through the real
discord.py (its REST client, gateway websocket, rate limiter and error mapping)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Iterator

import pytest
import yarl

from channels.discord_convert import discord  # imports discord.py without its audioop warning
from tests.fakes.discord_server import FakeDiscord

Route = discord.http.Route
DiscordWebSocket = discord.gateway.DiscordWebSocket
ADA_ID, GUILD_ID, GENERAL_ID = 310000000000001001, 320000000000005000, 330000000000006000


class Recorder(discord.Client):
    def __init__(self) -> None:
        intents = discord.Intents.none()
        intents.guilds = intents.guild_messages = intents.dm_messages = True
        intents.message_content = True
        super().__init__(intents=intents)
        self.messages: asyncio.Queue[discord.Message] = asyncio.Queue()
        self.connected = asyncio.Event()

    async def on_connect(self) -> None:
        self.connected.set()

    async def on_message(self, message: discord.Message) -> None:
        await self.messages.put(message)


@pytest.fixture
async def dc() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(heartbeat_interval=0.2) as server:
        server.user(ADA_ID, "ada", global_name="Ada")
        guild = server.guild(GUILD_ID, "Guild")
        server.text_channel(guild, GENERAL_ID, "general")
        yield server


@pytest.fixture
def pointed(dc: FakeDiscord) -> Iterator[None]:
    """discord.py's REST base and gateway are class attributes: set, then restored."""
    base, gateway = Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    Route.BASE = dc.api_base
    DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(dc.gateway_url)
    yield
    Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = base, gateway


@pytest.fixture
async def client(dc: FakeDiscord, pointed: None) -> AsyncIterator[Recorder]:
    bot = Recorder()
    await bot.login(dc.token)
    task = asyncio.create_task(bot.connect(), name="test-discord-connect")
    await asyncio.wait_for(bot.connected.wait(), 5)
    yield bot
    await bot.close()
    await asyncio.wait_for(task, 5)
    ready = getattr(bot._connection, "_ready_task", None)
    if ready is not None:
        ready.cancel()


def general(client: discord.Client) -> discord.PartialMessageable:
    return client.get_partial_messageable(GENERAL_ID)


async def test_login_and_a_wrong_token(dc: FakeDiscord, pointed: None) -> None:
    bot = Recorder()
    with pytest.raises(discord.LoginFailure):
        await bot.login("wrong")
    await bot.close()
    good = Recorder()
    await good.login(dc.token)
    assert good.user is not None and good.user.name == "parley"
    assert good.application_id is not None
    await good.close()


async def test_handshake_compression_guilds_and_heartbeats(dc: FakeDiscord,
                                                           client: Recorder) -> None:
    assert "compress=zlib-stream" in dc.gateway_urls[0]  # zlib frames, as Discord sends them
    assert dc.identifies[0]["token"] == dc.token
    guild = client.get_guild(GUILD_ID)
    assert guild is not None and guild.get_channel(GENERAL_ID) is not None
    assert guild.me is not None and guild.self_role is not None
    await dc.wait_for(lambda: dc.heartbeats >= 2)
    assert client.latency < 1.0  # acknowledged


async def test_message_create_validation_and_edit(dc: FakeDiscord, client: Recorder) -> None:
    with pytest.raises(discord.HTTPException) as empty:
        await general(client).send("   ")
    assert empty.value.code == 50006
    with pytest.raises(discord.HTTPException) as long:
        await general(client).send("x" * 2001)
    assert long.value.code == 50035 and "2000 or fewer" in str(long.value)
    sent = await general(client).send("x" * 2000)
    with pytest.raises(discord.HTTPException) as edit:
        await sent.edit(content="y" * 2001)
    assert edit.value.code == 50035
    await sent.edit(content="fixed")
    [record] = dc.sent_to(GENERAL_ID)
    assert record.content == "fixed" and record.edits == ["x" * 2000]
    with pytest.raises(discord.NotFound):
        await client.get_partial_messageable(1).send("nowhere")


async def test_nonce_returns_the_message_already_created(dc: FakeDiscord,
                                                         client: Recorder) -> None:
    first = await general(client).send("once", nonce="n-1")
    again = await general(client).send("once", nonce="n-1")
    assert first.id == again.id and len(dc.sent_to(GENERAL_ID)) == 1


async def test_rate_limit_is_waited_out_by_the_library(dc: FakeDiscord,
                                                       client: Recorder) -> None:
    dc.fail_next("create_message", 429, retry_after=0.3)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await general(client).send("after the wait")
    assert loop.time() - started >= 0.25
    assert [s.content for s in dc.sent_to(GENERAL_ID)] == ["after the wait"]


async def test_files_both_ways_and_typing(dc: FakeDiscord, client: Recorder) -> None:
    await general(client).typing()
    assert dc.typing == [GENERAL_ID]
    await general(client).send(file=discord.File(io.BytesIO(b"data"), filename="a.txt"))
    assert dc.sent_to(GENERAL_ID)[0].files == [("a.txt", b"data")]
    channel = dc.channels[GENERAL_ID]
    dc.post(channel, dc.users[ADA_ID], "see file", attachments=(("b.bin", b"\x00\x01",
                                                                 "application/octet-stream"),))
    message = await asyncio.wait_for(client.messages.get(), 5)
    while message.author.bot:  # our own upload comes back over the gateway first
        message = await asyncio.wait_for(client.messages.get(), 5)
    [attachment] = message.attachments
    assert attachment.size == 2 and await attachment.read() == b"\x00\x01"


async def test_a_dropped_connection_resumes_with_what_it_missed(dc: FakeDiscord,
                                                                client: Recorder) -> None:
    await dc.drop_gateway()
    dc.post(dc.channels[GENERAL_ID], dc.users[ADA_ID], "while you were away")
    message = await asyncio.wait_for(client.messages.get(), 5)
    assert message.content == "while you were away"
    assert len(dc.resumes) == 1 and dc.replayed == 1 and len(dc.identifies) == 1


async def test_history_after_a_message(dc: FakeDiscord, client: Recorder) -> None:
    channel, ada = dc.channels[GENERAL_ID], dc.users[ADA_ID]
    first = dc.post(channel, ada, "one")
    for text in ("two", "three"):
        dc.post(channel, ada, text)
    found = [m.content async for m in general(client).history(
        after=discord.Object(int(first["id"])), oldest_first=True)]
    assert found == ["two", "three"]


async def test_a_refused_privileged_intent_closes_with_4014(dc: FakeDiscord,
                                                            pointed: None) -> None:
    dc.privileged_intents = False
    bot = Recorder()
    await bot.login(dc.token)
    with pytest.raises(discord.PrivilegedIntentsRequired):
        await asyncio.wait_for(bot.connect(), 5)
    await bot.close()

