"""Immutable, picklable, hashable mapping used inside frozen value objects (internal)."""
from __future__ import annotations

from typing import Any, Mapping, NoReturn, TypeVar

__all__ = ["FrozenDict", "freeze_mapping"]

K = TypeVar("K")
V = TypeVar("V")


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

    def __copy__(self) -> "FrozenDict":
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> "FrozenDict":
        import copy

        return type(self)({copy.deepcopy(k, memo): copy.deepcopy(v, memo) for k, v in self.items()})

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"


def freeze_mapping(value: Mapping[Any, Any] | None) -> FrozenDict:
    """A FrozenDict copy of ``value`` (None -> empty)."""
    if isinstance(value, FrozenDict):
        return value
    return FrozenDict(value or {})
