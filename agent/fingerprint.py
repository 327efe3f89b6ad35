"""Fingerprints of exactly what the model was sent, stored in each context snapshot and
recomputed by a replay (``agent/replay.py``).

Two forms. The current one, ``"2:"`` and the SHA-256 of the messages as orjson writes them
with sorted keys (compact), costs a few microseconds for a whole history. Snapshots written
before it hold the first form, the bare SHA-256 of ``json.dumps(messages, sort_keys=True,
ensure_ascii=False)``; a fingerprint's own form says which one to compute, so an old turn
still replays to a match. A later model call of a turn chains to the first call's
fingerprint (``call_hash``) in the same form.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson

FORM2 = "2:"
_SORTED = orjson.OPT_SORT_KEYS


def context_hash(messages: list[dict[str, Any]], *, like: str | None = None) -> str:
    """The fingerprint of ``messages``; ``like``: a stored fingerprint whose form to use."""
    if like is not None and not like.startswith(FORM2):
        return _first_form(messages)
    return FORM2 + hashlib.sha256(orjson.dumps(messages, option=_SORTED)).hexdigest()


def call_hash(base: str, added: list[dict[str, Any]], shortened: dict[int, Any]) -> str:
    """A later call's fingerprint: the first call's (``base``), the messages the turn added
    since, and the earlier messages the loop replaced (by position); in ``base``'s form."""
    data = {"base": base, "added": added,
            "shortened": [[i, shortened[i]] for i in sorted(shortened)]}
    if base.startswith(FORM2):
        return FORM2 + hashlib.sha256(orjson.dumps(data, option=_SORTED)).hexdigest()
    return _first_form(data)


def _first_form(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=False)
                          .encode()).hexdigest()
