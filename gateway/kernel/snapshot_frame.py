"""A context snapshot as stored (issue 24): what is the same turn after turn — the system
layers' names and hashes, the trust, the model, the channel's hints — is one "frame" text,
stored once per distinct content in ``layer_texts`` (by hash) like the layer texts themselves;
the row keeps what is the turn's own. The inbound message inside it leaves out the fields that
hold their default. Reading (``store_snapshots``) puts the frame back: every reader sees the
snapshot exactly as the turn built it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from gateway.kernel.events import InboundMessage

FRAME = "frame"
"""The key naming the frame's hash in a stored snapshot."""
FRAME_TOP = ("session_key", "trust", "model", "owner_files", "memory_scopes",
             "max_context_tokens")
FRAME_INPUTS = ("snippet_cap", "hints", "tools_tokens", "model", "chat_prompt")
TURN_LAYERS = frozenset({"summary", "history", "runtime", "user"})
"""Layers whose tokens change turn by turn; the others' (system files, tools) are the frame's."""
_DEFAULTS: dict[str, Any] = {
    f.name: list(f.default) if isinstance(f.default, tuple) else f.default
    for f in dataclasses.fields(InboundMessage) if f.default is not dataclasses.MISSING}
_DEFAULTS.update({f.name: f.default_factory() for f in dataclasses.fields(InboundMessage)
                  if f.default_factory in (dict, list)})
"""The inbound message's fields that have a fixed default, as JSON holds them."""


def _dump(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _lean(inbound: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in inbound.items() if k not in _DEFAULTS or _DEFAULTS[k] != v}


def fold(snapshot: dict[str, Any], texts: dict[str, str] | None
         ) -> tuple[dict[str, Any], dict[str, str]]:
    """(the row's snapshot, the texts to store by hash, the frame among them)."""
    frame: dict[str, Any] = {"top": {k: snapshot[k] for k in FRAME_TOP if k in snapshot}}
    row = {k: v for k, v in snapshot.items() if k not in FRAME_TOP}
    layers = snapshot.get("layers")
    if isinstance(layers, dict):
        # pairs: the frame's JSON sorts keys, the layers' order is the prompt's
        frame["layers"] = [[k, None if k in TURN_LAYERS else v] for k, v in layers.items()]
        row["layers"] = {k: v for k, v in layers.items() if k in TURN_LAYERS}
    inputs = snapshot.get("inputs")
    if isinstance(inputs, dict):
        frame["inputs"] = {k: inputs[k] for k in FRAME_INPUTS if k in inputs}
        row["inputs"] = {k: v for k, v in inputs.items() if k not in FRAME_INPUTS}
        if isinstance(inputs.get("inbound"), dict):
            row["inputs"]["inbound"] = _lean(inputs["inbound"])
    named = snapshot.get("texts")
    if isinstance(named, dict) and "system" in named:
        frame["system"] = named["system"]
        row["texts"] = {k: v for k, v in named.items() if k != "system"}
    text = _dump(frame)
    digest = hashlib.sha256(text.encode()).hexdigest()
    row[FRAME] = digest
    return row, {**(texts or {}), digest: text}


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
            inputs["inbound"] = {**_DEFAULTS, **inputs["inbound"]}
        out["inputs"] = inputs
    if "system" in frame:
        out["texts"] = {"system": frame["system"], **(row.get("texts") or {})}
    return out
