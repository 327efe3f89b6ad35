"""Fingerprints of exactly what the model was sent, stored in each context snapshot and
recomputed by a replay (``agent/replay.py``).

Three forms; a fingerprint's own prefix says which one to compute, so a turn stored in any of
them still replays to a match:

- ``"3:"`` (current): the SHA-256 of the messages' own SHA-256 digests, one after another, each
  of a message as orjson writes it with sorted keys (compact). A message's digest does not
  change once it is stored, so a turn hashes only what is new to it: the history's digests
  are carried forward with it (``agent/history.HistoryRows``), the system prompt's is kept
  while its text is the same. Form 2 hashed every byte of the history again each turn (at
  400 messages ~40 µs, the largest part of building a context; bench/RESULTS.md, round
  fifteen).
- ``"2:"``: the SHA-256 of the whole list as orjson writes it with sorted keys (compact).
- the first form, unprefixed: the bare SHA-256 of ``json.dumps(messages, sort_keys=True,
  ensure_ascii=False)``.

A later model call of a turn chains to the first call's fingerprint (``call_hash``) in the
same form.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import orjson

FORM2 = "2:"
FORM3 = "3:"
_SORTED = orjson.OPT_SORT_KEYS
DIGEST_BYTES = 32
"""A message's digest (SHA-256): the history carries them back to back
(``HistoryRows.digests``)."""


def message_json(message: dict[str, Any]) -> bytes:
    """A message as its form-3 digest hashes it (sorted keys, compact): also what the
    request body says of it, for the history the turns carry (``agent/history.py``)."""
    return orjson.dumps(message, option=_SORTED)


def json_digest(encoded: bytes) -> bytes:
    """The ``message_digest`` of the message ``encoded`` is the ``message_json`` of."""
    return hashlib.sha256(encoded).digest()


def message_digest(message: dict[str, Any]) -> bytes:
    """One message's part of a form-3 fingerprint."""
    return json_digest(message_json(message))


def digests_hash(digests: Iterable[bytes]) -> str:
    """The form-3 fingerprint of the messages whose ``message_digest``s these are, in order
    (an item may hold several digests back to back: they are joined)."""
    return FORM3 + hashlib.sha256(b"".join(digests)).hexdigest()


def context_hash(messages: list[dict[str, Any]], *, like: str | None = None) -> str:
    """The fingerprint of ``messages``; ``like``: a stored fingerprint whose form to use."""
    if like is None or like.startswith(FORM3):
        return digests_hash([message_digest(m) for m in messages])
    if like.startswith(FORM2):
        return FORM2 + hashlib.sha256(orjson.dumps(messages, option=_SORTED)).hexdigest()
    return _first_form(messages)


def call_hash(base: str, added: list[dict[str, Any]], shortened: dict[int, Any]) -> str:
    """A later call's fingerprint: the first call's (``base``), the messages the turn added
    since, and the earlier messages the loop replaced (by position); in ``base``'s form."""
    data = {"base": base, "added": added,
            "shortened": [[i, shortened[i]] for i in sorted(shortened)]}
    for form in (FORM3, FORM2):
        if base.startswith(form):
            return form + hashlib.sha256(orjson.dumps(data, option=_SORTED)).hexdigest()
    return _first_form(data)


def _first_form(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=False)
                          .encode()).hexdigest()
