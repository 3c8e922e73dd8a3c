"""Frozen value types for the code that runs before every job: the Slurm hooks' data.

Creating a class with ``@dataclass`` costs 0.5-1.2 ms on CPython 3.11-3.13 (it compiles every
method it writes), and importing ``dataclasses`` (with ``inspect``, ``ast``, ``dis``, ...)
costs as much again: before every job on every node, the Prolog paid about as much for this
as pynvml and the driver cost it. A ``Record`` costs nothing to create.

A subclass names its fields in ``__slots__`` (in order; ``"__dict__"`` among them gives it
room for ``functools.cached_property``, and is no field), annotates them, and writes its own
``__init__`` (so that its defaults are where type checkers and readers look), which stores
them with ``_fill``. Equality, hash, ``repr``, pickling, ``replace`` and ``as_dict`` are the
ones a frozen dataclass has, and are written here once. The modules the hooks import use
``Record`` for their data; ``tests/test_hooks_nvml.py`` checks that they never load
``dataclasses``. Everything else keeps ``@dataclass``.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from typing import Any, NoReturn, Self

__all__ = ["Record"]


class Record:
    """A frozen value with the fields its ``__slots__`` names, compared field by field."""

    __slots__ = ()
    # __slots__ without "__dict__"; set for each class (no ClassVar: typing is not imported,
    # and typing.get_type_hints of a record must not meet the name)
    _fields: tuple[str, ...] = ()

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        slots: tuple[str, ...] = cls.__slots__
        cls._fields = tuple(name for name in slots if name != "__dict__")

    def _fill(self, *values: object) -> None:
        """Store the fields, in ``__slots__`` order (for ``__init__``)."""
        set_field = object.__setattr__
        for name, value in zip(self._fields, values, strict=True):
            set_field(self, name, value)

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self._fields])

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"cannot assign to field {name!r}: {type(self).__name__} is frozen")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"cannot delete field {name!r}: {type(self).__name__} is frozen")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record) or other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({fields})"

    def __reduce__(self) -> tuple[type[Self], tuple[Any, ...]]:
        return (type(self), self._values())  # every __init__ takes its fields in slot order

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` (as ``dataclasses.replace``); TypeError for a name that is
        no field."""
        unknown = set(changes).difference(self._fields)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        values = {name: getattr(self, name) for name in self._fields}
        values.update(changes)
        return type(self)(**values)

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict, records inside it turned into dicts too (as
        ``dataclasses.asdict``)."""
        return {name: _plain(getattr(self, name)) for name in self._fields}


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value.as_dict()
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    return value
