"""``@frozen``: the project's immutable value classes (events, rows, settings read once).

A frozen dataclass sets each field in ``__init__`` through ``object.__setattr__``, about
1,250 machine instructions a field; a turn builds ~170 such fields (an inbound message has 21),
~6 % of a turn's own work (issue 24). So the class is built two ways:

- checked (``PARLEY_CHECKED_FROZEN=1``, which ``tests/conftest.py`` sets for the whole suite
  and the gateways it starts): ``dataclass(frozen=True, slots=True)``, any assignment after
  construction raises ``FrozenInstanceError``;
- otherwise: the same slotted dataclass, not frozen at run time (fields set by plain slot
  stores), with the same ``__eq__`` and the same field-based ``__hash__``.

The type checker sees a frozen dataclass either way (``dataclass_transform``), so an
assignment is a type error; and the test suite runs every path it covers with the checked
build, so an assignment that slipped past the types fails there. Never rely on mutating one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import Field, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda decorator: decorator

T = TypeVar("T", bound=type)

CHECKED = os.environ.get("PARLEY_CHECKED_FROZEN", "") not in ("", "0")
"""Build the classes frozen at run time too (the test suite sets it)."""


@overload
def frozen(cls: T, /) -> T: ...


@overload
def frozen(*, slots: bool = True, kw_only: bool = False) -> Callable[[T], T]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
def frozen(cls: Any = None, /, *, slots: bool = True, kw_only: bool = False) -> Any:
    """``@dataclass(frozen=True, slots=True)``; ``kw_only`` as ``dataclass``'s."""

    def build(cls: type) -> type:
        if CHECKED:
            return dataclass(cls, frozen=True, slots=slots, kw_only=kw_only)
        return dataclass(cls, slots=slots, kw_only=kw_only, unsafe_hash=True)

    return build if cls is None else build(cls)
