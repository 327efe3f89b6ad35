"""Which channels are installed: every class registered under the ``parley.channels`` entry
point group, the built-in ones (``pyproject.toml``) and any plugin package's alike.

A channel class has a ``name`` (its entry point's name and its ``channels.<name>`` config
key), a ``config_model`` (the pydantic model of that section, with an ``enabled`` flag) and a
classmethod ``from_deps(deps) -> Channel`` (``channels/base.py`` ``ChannelPlugin``). Listing
the installed channels reads the packages' metadata only; a channel's module is imported when
its section is validated or it is started.
"""

from __future__ import annotations

import logging
from importlib.metadata import EntryPoint, entry_points
from typing import Any

_log = logging.getLogger(__name__)

GROUP = "parley.channels"


class ChannelPluginError(Exception):
    """An installed channel that cannot be loaded or is not a channel class."""


def installed() -> dict[str, EntryPoint]:
    """The installed channels by name, sorted; a name registered twice keeps the first."""
    out: dict[str, EntryPoint] = {}
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        if ep.name in out and out[ep.name].value != ep.value:
            _log.warning("channel %r is registered twice (%s and %s); using the first",
                         ep.name, out[ep.name].value, ep.value)
        out.setdefault(ep.name, ep)
    return out


def names() -> list[str]:
    return list(installed())


def load(name: str, entry: EntryPoint | None = None) -> Any:
    """The channel class registered as ``name``; ``ChannelPluginError`` saying why not."""
    entry = entry or installed().get(name)
    if entry is None:
        raise ChannelPluginError(f"no channel {name!r} is installed (installed channels: "
                                 f"{', '.join(names()) or 'none'})")
    try:
        cls = entry.load()
    except Exception as exc:
        raise ChannelPluginError(f"channel {name!r} ({entry.value}) cannot be loaded: "
                                 f"{type(exc).__name__}: {exc}") from exc
    missing = [a for a in ("name", "config_model", "from_deps") if not hasattr(cls, a)]
    if missing:
        raise ChannelPluginError(f"channel {name!r} ({entry.value}) is not a channel class: "
                                 f"it has no {', '.join(missing)}")
    if cls.name != name:
        raise ChannelPluginError(f"channel {name!r} ({entry.value}) calls itself {cls.name!r}; "
                                 "the entry point's name and the class's name must match")
    return cls
