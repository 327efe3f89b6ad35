"""A context snapshot as stored (issue 24): what is the same turn after turn — the system
layers' names and hashes, the trust, the model, the channel's hints — is one "frame" text,
stored once per distinct content in ``layer_texts`` (by hash) like the layer texts themselves;
the row keeps what is the turn's own. The inbound message inside it leaves out the fields that
hold their default. Reading (``store_snapshots``) puts the frame back: every reader sees the
snapshot exactly as the turn built it.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
import zlib
from typing import Any, cast

import orjson

from gateway.kernel.events import InboundMessage

FRAME = "frame"
"""The key naming the frame's hash in a stored snapshot."""
RUNTIME_TIME = "runtime_time"
"""The runtime block's time, when ``texts.runtime`` names its template (``join_time``)."""
_TIME = "\nTime: "
_CLOCK = re.compile(r"\d\d:\d\d(:\d\d)?")
TIME_MARK = "\x1e"
"""Where a runtime block's template had its time (the record separator: no text has it, and
PostgreSQL takes it in text, unlike NUL)."""
FRAME_TOP = ("session_key", "trust", "model", "owner_files", "memory_scopes",
             "max_context_tokens")
FRAME_INPUTS = ("snippet_cap", "hints", "tools_tokens", "model", "chat_prompt")
FRAME_INBOUND = ("channel", "chat_id", "sender_id", "sender_name", "trust")
"""The inbound message's fields that are the same for every turn of one sender in one chat."""
TURN_LAYERS = frozenset({"summary", "history", "runtime", "user"})
"""Layers whose tokens change turn by turn; the others' (system files, tools) are the frame's."""
_DEFAULTS: dict[str, Any] = {
    f.name: list(f.default) if isinstance(f.default, tuple) else f.default
    for f in dataclasses.fields(InboundMessage) if f.default is not dataclasses.MISSING}
_DEFAULTS.update({f.name: f.default_factory() for f in dataclasses.fields(InboundMessage)
                  if f.default_factory in (dict, list)})
"""The inbound message's fields that have a fixed default, as JSON holds them."""


def _dump(data: Any) -> str:
    """Sorted keys, compact (the same text ``json.dumps`` wrote before orjson did it)."""
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode()


_LEFT_OUT: dict[str, dict[str, Any]] = {
    "": {"trimmed": [], "bootstrap_cuts": []},
    "sources": {"compaction": None, "images": 0, "memory_recalled": 0},
    "inputs": {"compaction_id": None, "recall": None},
}
"""Values most turns have, left out of the row; the frame lists which keys the snapshot has."""
_CALL_DEFAULTS: dict[str, Any] = {"added": 0, "shortened": []}


def _lean(inbound: dict[str, Any]) -> dict[str, Any]:
    defaults = _DEFAULTS
    return {k: v for k, v in inbound.items() if k not in defaults or defaults[k] != v}


_TEMPLATES: dict[str, str] = {}
"""Runtime templates' hashes by text: a chat's template is the same turn after turn."""


def _template_hash(template: str) -> str:
    digest = _TEMPLATES.get(template)
    if digest is None:
        if len(_TEMPLATES) >= 256:
            _TEMPLATES.clear()
        digest = _TEMPLATES[template] = hashlib.sha256(template.encode()).hexdigest()
    return digest


def fold(snapshot: dict[str, Any], texts: dict[str, str] | None
         ) -> tuple[dict[str, Any], dict[str, str]]:
    """(the row's snapshot, the texts to store by hash, the frame among them)."""
    row = snapshot.copy()
    frame: dict[str, Any] = {"top": {k: row.pop(k) for k in FRAME_TOP if k in row}}
    layers = row.get("layers")
    if isinstance(layers, dict):
        # pairs: the frame's JSON sorts keys, the layers' order is the prompt's
        turn = TURN_LAYERS
        frame["layers"] = [[k, None if k in turn else v] for k, v in layers.items()]
        row["layers"] = {k: v for k, v in layers.items() if k in turn}
    inputs = row.get("inputs")
    if isinstance(inputs, dict):
        frame["inputs"] = {k: inputs[k] for k in FRAME_INPUTS if k in inputs}
        own = row["inputs"] = inputs.copy()
        for k in FRAME_INPUTS:
            own.pop(k, None)
        if isinstance(inputs.get("inbound"), dict):
            inbound = _lean(inputs["inbound"])
            frame["inbound"] = {k: inbound.pop(k) for k in FRAME_INBOUND if k in inbound}
            own["inbound"] = inbound
    named = row.get("texts")
    stored = dict(texts) if texts else {}
    if isinstance(named, dict) and "system" in named:
        frame["system"] = named["system"]
        own_texts = row["texts"] = named.copy()
        del own_texts["system"]
        runtime = own_texts.get("runtime")
        if isinstance(runtime, str) and runtime in stored \
                and (split := split_time(stored[runtime])) is not None:
            # the template once (by its hash), the time in the row
            template, when = split
            shared = _template_hash(template)
            del stored[runtime]
            stored[shared] = template
            own_texts["runtime"] = shared
            row[RUNTIME_TIME] = when
    present = {}
    for where, defaults in _LEFT_OUT.items():
        part: dict[str, Any] | None = row if not where else row.get(where)
        if isinstance(part, dict):
            if where and snapshot.get(where) is part:  # the row's own copy: the snapshot
                part = row[where] = dict(cast(dict[str, Any], part))  # itself stays whole
            keys = present[where] = [k for k in defaults if k in part]
            for k in keys:
                if part[k] == defaults[k]:
                    del part[k]
    frame["defaults"] = present
    calls = row.get("calls")
    if isinstance(calls, list) and calls and all(
            isinstance(c, dict) and "added" in c and "shortened" in c and "tools" in c
            for c in calls):
        tools = calls[0]["tools"]
        frame["calls"] = {"tools": tools}
        usual = {**_CALL_DEFAULTS, "tools": tools}
        row["calls"] = [{k: v for k, v in c.items() if not (k in usual and usual[k] == v)}
                        for c in calls]
    text = _dump(frame)
    digest = hashlib.sha256(text.encode()).hexdigest()
    row[FRAME] = digest
    stored[digest] = text
    return row, stored


def split_time(text: str) -> tuple[str, str] | None:
    """(template, time) of a runtime block: the time of day on its ``Time:`` line changes
    every second, the rest (the date too) hardly ever, so the template is stored once and each
    turn keeps only ``HH:MM:SS``. None for a text without that line (or too short to be worth
    it)."""
    at = text.find(_TIME)
    if at < 0 or TIME_MARK in text or len(text) < 120:
        return None
    start = at + len(_TIME)
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    clock = _CLOCK.search(text, start, end)
    if clock is None:
        return None
    return text[:clock.start()] + TIME_MARK + text[clock.end():], clock.group()


def join_time(template: str, when: str | None) -> str:
    """``split_time`` undone (a text stored whole, ``when`` None, is returned as it is)."""
    if when is None:
        return template
    return template.replace(TIME_MARK, when, 1)


def frames_of(rows: list[dict[str, Any]]) -> list[str]:
    return [r[FRAME] for r in rows if isinstance(r.get(FRAME), str)]


def expand(row: dict[str, Any], frames: dict[str, str]) -> dict[str, Any]:
    """The snapshot as the turn built it (a row without a frame is returned as it is; one
    whose frame is missing keeps what it has)."""
    digest = row.pop(FRAME, None)
    text = frames.get(digest) if isinstance(digest, str) else None
    if text is None:
        return row
    frame = json.loads(text)
    out = {**frame.get("top", {}), **row}
    if "layers" in frame:  # the turn's order, the turn's values
        own = row.get("layers") or {}
        out["layers"] = {k: own.get(k, v) for k, v in frame["layers"]}
    if isinstance(row.get("inputs"), dict):
        inputs = {**frame.get("inputs", {}), **row["inputs"]}
        if isinstance(inputs.get("inbound"), dict):
            inputs["inbound"] = {**_DEFAULTS, **frame.get("inbound", {}), **inputs["inbound"]}
        out["inputs"] = inputs
    if "system" in frame:
        out["texts"] = {"system": frame["system"], **(row.get("texts") or {})}
    for where, keys in (frame.get("defaults") or {}).items():
        part = out if not where else out.get(where)
        if isinstance(part, dict):
            for k in keys:
                if k not in part:
                    part[k] = copy.deepcopy(_LEFT_OUT[where][k])
    if isinstance(frame.get("calls"), dict) and isinstance(out.get("calls"), list):
        tools = frame["calls"].get("tools")
        out["calls"] = [{"added": 0, "shortened": [], "tools": tools, **c}
                        if isinstance(c, dict) else c for c in out["calls"]]
    return out


# -- what the row's own columns hold ----------------------------------------------------------

COLUMNS = ("turn_id", "hash", "total_tokens")
"""Kept in ``context_snapshots``' columns (``turn_id``, ``context_hash``, ``total_tokens``),
so not again in its JSON."""


def without_columns(snapshot: dict[str, Any], turn_id: str) -> dict[str, Any]:
    """The JSON a row of ``turn_id`` stores: no copy of its columns, and a model call whose
    fingerprint is the turn's own (a plain turn's only call) without it."""
    top = snapshot.get("hash")
    row = {k: v for k, v in snapshot.items()
           if k not in COLUMNS or (k == "turn_id" and v != turn_id)}
    calls = row.get("calls")
    if isinstance(calls, list) and top is not None:
        row["calls"] = [{k: v for k, v in c.items() if k != "hash"}
                        if isinstance(c, dict) and c.get("hash") == top else c for c in calls]
    return row


def with_columns(row: dict[str, Any], turn_id: str, context_hash: str,
                 total_tokens: int) -> dict[str, Any]:
    """``without_columns`` undone (a row stored whole before it is returned as it is)."""
    if "hash" in row:
        return row
    out = {"turn_id": turn_id, "hash": context_hash, "total_tokens": total_tokens, **row}
    if "turn_id" in row:  # a snapshot naming another turn than its row's: its own order
        out = {"turn_id": row["turn_id"], **out}
    calls = out.get("calls")
    if isinstance(calls, list):
        out["calls"] = [c if not isinstance(c, dict) or "hash" in c
                        else {**c, "hash": context_hash} for c in calls]
    return out



# -- the row's JSON packed (SQLite) -------------------------------------------------------------

PACKED_V1 = 1
"""The first byte of a packed row: which dictionary it was packed with. A dictionary never
changes once rows use it; a better one is a new version, and every version stays readable."""
_DICTIONARIES = {PACKED_V1: (
    b'"shortened":[],"added":0,"tools":"compaction":null,"images":0,"memory_recalled":0,'
    b'"recall":null,"compaction_id":null,"trimmed":[],"bootstrap_cuts":[],"tool_calls":'
    b'"reply_to":"thread_id":"media":[],"turn_id":"hash":"2:'
    b'{"layers":{"summary":0,"history":,"runtime":,"user":},'
    b'"sources":{"history_available":,"history_kept":,"skills":},'
    b'"texts":{"runtime":""},"inputs":{"inbound":{"text":"","message_id":"",'
    b'"received_at":"2026-01-01T00:00:00.000000+00:00"},"history_ids":[1,],"kept_ids":[1,]},'
    b'"calls":[{}],"frame":""}')}
PACKED_V2 = 2
_DICTIONARIES[PACKED_V2] = _DICTIONARIES[PACKED_V1] + (
    b'"runtime_time":"2026-01-01 00:00:00 UTC (UTC+0000), Wednesday","frame":""}')
PACKED_V3 = 3
_DICTIONARIES[PACKED_V3] = _DICTIONARIES[PACKED_V1] + b'"runtime_time":"00:00:00","frame":""}'
"""What most rows share, for zlib to refer to: the keys in their usual order (the most
common last, nearest), so a row stores little more than its values. Version 2 added the
runtime block's time (``RUNTIME_TIME``) as a whole line's value, version 3 as the time of day
it is now."""


def pack(text: str) -> bytes:
    """A row's JSON as SQLite stores it: deflated against a preset dictionary (a plain
    turn's 520 bytes take ~200; ~7 µs). PostgreSQL keeps the text (it reads it as JSON)."""
    packer = zlib.compressobj(6, zlib.DEFLATED, -11, 4, zlib.Z_DEFAULT_STRATEGY,
                              _DICTIONARIES[PACKED_V3])
    return bytes((PACKED_V3,)) + packer.compress(text.encode()) + packer.flush()


def unpack(stored: str | bytes) -> str:
    """``pack`` undone; a row stored as text (older, or PostgreSQL's) is returned as it is."""
    if isinstance(stored, str):
        return stored
    unpacker = zlib.decompressobj(-11, _DICTIONARIES[stored[0]])
    return (unpacker.decompress(stored[1:]) + unpacker.flush()).decode()


def history_from(stored: str | bytes | None) -> int | None:
    """The first history message id a stored row names (what retention must keep)."""
    if stored is None:
        return None
    ids = json.loads(unpack(stored)).get("inputs", {}).get("history_ids")
    return int(ids[0]) if isinstance(ids, list) and ids else None
