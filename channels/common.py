"""Pieces every platform adapter needs: keeping bot tokens out of logs and error texts, and
the backoff between reconnects."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class Backoff:
    """Jittered exponential delays, 0.5 s doubling up to 30 s."""

    delay: float = 0.5

    def next(self) -> float:
        value, self.delay = self.delay, min(self.delay * 2, 30.0)
        return value * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self.delay = 0.5


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[token]")
    return text


class SecretFilter(logging.Filter):
    """Rewrites log records that contain a secret (Telegram puts the bot token in every API
    URL; discord.py logs gateway payloads)."""

    def __init__(self, *secrets: str) -> None:
        super().__init__()
        self.secrets = tuple(s for s in secrets if s)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message, self.secrets)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        return True
