"""Immutable, picklable, hashable mapping used inside frozen value objects, and enum coercion (internal)."""
from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, NoReturn, TypeVar

__all__ = ["FrozenDict", "freeze_mapping", "enum_member"]

K = TypeVar("K")
V = TypeVar("V")
E = TypeVar("E", bound=Enum)


def enum_member(cls: type[E], value: object, what: str) -> E:
    """``value`` (a member or its string value, as read from JSON) as a member of ``cls``; a ValueError naming
    ``what`` and the allowed values otherwise."""
    try:
        return cls(value)
    except ValueError:
        allowed = tuple(m.value for m in cls)
        raise ValueError(f"{what} must be one of {allowed}, got {value!r}") from None


class FrozenDict(dict):  # type: ignore[type-arg]
    """A ``dict`` that refuses mutation (so frozen dataclasses are frozen all the way down).

    It is a real ``dict`` subclass: ``json.dumps`` and ``==`` with plain dicts work unchanged.
    """

    __slots__ = ()

    def _immutable(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(f"{type(self).__name__} is immutable")

    __setitem__ = _immutable
    __delitem__ = _immutable
    __ior__ = _immutable
    clear = _immutable
    pop = _immutable
    popitem = _immutable
    setdefault = _immutable
    update = _immutable

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        import copy

        return type(self)({copy.deepcopy(k, memo): copy.deepcopy(v, memo) for k, v in self.items()})

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"


def freeze_mapping(value: Mapping[Any, Any] | None) -> FrozenDict:
    """A FrozenDict copy of ``value`` (None -> empty)."""
    if isinstance(value, FrozenDict):
        return value
    return FrozenDict(value or {})
