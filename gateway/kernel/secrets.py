"""The gateway's secrets, and one way to keep them out of everything it writes.

The composition root registers every secret once at start (``SECRETS.add_config``: the
config's keys, tokens and header values, and the environment's secret-looking variables).
``SECRETS.redact`` then replaces each, and its common encodings (base64 at every alignment,
URL-safe base64, hex, percent-encoding), wherever text leaves the gateway: log records (a
filter on the root handlers), tool results, replies and notices, and context snapshots. The
exec sandbox keeps the environment and the config out of a command's reach in the first place;
this is the second line, for whatever still finds a way.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, SecretStr

MIN_SECRET_LEN = 8
"""Shorter values are not masked: they would blank out ordinary words and numbers."""
MARK = "[redacted]"

_SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASS\b|_PW\b|^PW_|CREDENTIAL|AUTH(?!OR)|COOKIE|SESSION"
    r"|PRIVATE|DSN|SIGNATURE|SALT",
    re.IGNORECASE)  # AUTH but not GIT_AUTHOR_NAME
_SECRET_PREFIXES = ("AWS_", "GITHUB_", "HF_", "AZURE_", "GOOGLE_", "OPENAI_", "ANTHROPIC_")
_SECRET_NAMES = frozenset({"DATABASE_URL", "PGPASSWORD", "REDIS_URL"})


def is_secret_name(name: str) -> bool:
    """Whether a variable or config key of this name holds a secret (``*_KEY``, ``*_TOKEN``,
    ``*_PW``, ``PASSWORD``, ``DATABASE_URL``, ...)."""
    upper = name.upper()
    return (upper in _SECRET_NAMES or upper.startswith(_SECRET_PREFIXES)
            or _SECRET_NAME.search(upper) is not None)


def encodings(secret: str) -> set[str]:
    """The forms a secret may take in text: itself, its base64 (standard and URL-safe, at
    each of the three alignments it can have inside a longer encoded stream), hex and
    percent-encoding. An encoded form shorter than the secret's own length is skipped."""
    raw = secret.encode()
    forms = {secret, raw.hex(), raw.hex().upper(), quote(secret, safe="")}
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw).decode()
        # Characters touched by the padding bytes or the unknown tail are not fixed.
        start = (shift * 4 + 2) // 3 if shift else 0
        end = len(raw) + shift
        stable = encoded[start:(end * 4) // 3]
        for form in (stable, stable.replace("+", "-").replace("/", "_")):
            if len(form) >= MIN_SECRET_LEN:
                forms.add(form)
    return {f for f in forms if len(f) >= MIN_SECRET_LEN}


class Secrets:
    """Secret values and their encodings, matched by one compiled pattern (longest first)."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._matcher: tuple[re.Pattern[str], tuple[str, ...]] | None = None
        """The pattern and the forms it matches, swapped as one (``add`` may run on a
        thread while another redacts)."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._values)

    def add(self, *values: str | None) -> None:
        new = {v for v in values if v and len(v) >= MIN_SECRET_LEN} - self._values
        if not new:
            return
        with self._lock:
            self._values |= new
            forms = sorted({f for v in self._values for f in encodings(v)}, key=len,
                           reverse=True)
            self._matcher = (re.compile("|".join(re.escape(f) for f in forms)), tuple(forms))

    def add_env(self, environ: Mapping[str, str] | None = None) -> None:
        """The values of the environment's secret-looking variables."""
        environ = os.environ if environ is None else environ
        self.add(*(v for k, v in environ.items() if is_secret_name(k)))

    def add_config(self, config: BaseModel) -> None:
        """Every ``SecretStr`` of a config, and every value whose key names a secret
        (``api_key``, header and environment entries such as ``Authorization``)."""
        self.add(*_config_secrets(config))

    def redact(self, text: str) -> str:
        """``text`` with every secret form replaced. Most texts hold none: a substring test
        per form (C's fast search) says so ~4x sooner than the pattern, which tries its
        alternatives at nearly every position (the forms start with any letter or digit)."""
        matcher = self._matcher
        if matcher is None or not text:
            return text
        pattern, forms = matcher
        for form in forms:
            if form in text:
                return pattern.sub(MARK, text)
        return text

    def redact_data(self, data: Any) -> Any:
        """``redact`` over the strings of JSON-like data (dicts, lists)."""
        if isinstance(data, str):
            return self.redact(data)
        if isinstance(data, dict):
            return {k: self.redact_data(v) for k, v in data.items()}
        if isinstance(data, list):
            return [self.redact_data(v) for v in data]
        return data

    def clear(self) -> None:
        """Forget every secret (tests)."""
        with self._lock:
            self._values.clear()
            self._matcher = None


def _config_secrets(node: Any, name: str = "") -> Iterable[str]:
    if isinstance(node, SecretStr):
        yield node.get_secret_value()
    elif isinstance(node, BaseModel):
        for field in type(node).model_fields:
            yield from _config_secrets(getattr(node, field), field)
    elif isinstance(node, Mapping):
        secret_map = name in ("headers", "env")
        for key, value in node.items():
            if isinstance(value, str):
                if secret_map and (is_secret_name(str(key)) or str(key).lower() ==
                                   "authorization") or is_secret_name(str(key)):
                    yield value
            else:
                yield from _config_secrets(value, str(key))
    elif isinstance(node, (list, tuple)):
        for item in node:
            yield from _config_secrets(item, name)
    elif isinstance(node, str) and name and is_secret_name(name):
        yield node


class RedactingFilter(logging.Filter):
    """Rewrites a log record (message, arguments, traceback) that holds a secret; put on a
    handler, it sees every record that handler writes, whichever library logged it."""

    def __init__(self, secrets: Secrets) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        if not len(self.secrets):
            return True
        message = record.getMessage()
        cleaned = self.secrets.redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.secrets.redact(record.exc_text)
        return True


SECRETS = Secrets()
"""The process's secrets: registered by the composition root, read wherever text leaves."""


def register_secrets(config: BaseModel, environ: Mapping[str, str] | None = None) -> None:
    """What the composition root calls once a config is loaded: its secrets and the
    environment's, into ``SECRETS``."""
    SECRETS.add_config(config)
    SECRETS.add_env(environ)
