"""A JSON object of the state store as a frozen value with typed fields.

:class:`Stored` is the base of the typed states a stage or an audit keeps between runs
(``pipeline.ssbj.state``, ``pipeline.audit_state``). It keeps the object's keys in their
order and the keys this release does not know, so ``from_dict(d).to_dict() == d`` for an
object of any release: a key the object lacks reads as its field's default and stays
absent until :meth:`Stored.updated` sets it (appended after the stored keys, as assigning
a key of a dict did); :meth:`Stored.without` removes one, as ``pop`` did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from functools import cache
from typing import Any, Self

from common.errors import StateStoreError

_BOOKKEEPING = ("stored_keys", "unknown")


def _fields_of(cls: type) -> dict[str, Field[Any]]:
    """The fields of a :class:`Stored` subclass that are keys of its JSON object (cached;
    this plain signature is what mypy accepts where callers pass ``type(self)``)."""
    return _stored_fields(cls)


@cache
def _stored_fields(cls: type) -> dict[str, Field[Any]]:
    return {f.name: f for f in fields(cls) if f.name not in _BOOKKEEPING}


@dataclass(frozen=True)
class Stored:
    """A JSON object of the state store as typed fields (the subclasses' fields), keeping
    which keys the object holds, in their order, and the keys no field knows."""

    # The object's keys, in order: those read, then those set since.
    stored_keys: tuple[str, ...] = field(default=(), kw_only=True, repr=False, compare=False)
    # The values of keys this release does not know, written back as they were read.
    unknown: Mapping[str, Any] = field(default_factory=dict, kw_only=True, repr=False)

    def updated(self, **changes: Any) -> Self:
        """This object with ``changes`` set; a key it did not hold is appended, in the
        order given."""
        known = _fields_of(type(self))
        strange = [name for name in changes if name not in known]
        if strange:
            raise TypeError(f"{type(self).__name__} has no stored field(s) {strange}")
        added = tuple(name for name in changes if name not in self.stored_keys)
        return replace(self, **changes, stored_keys=self.stored_keys + added)

    def without(self, name: str) -> Self:
        """This object without the key ``name``; its field reads as its default again."""
        spec = _fields_of(type(self))[name]
        if spec.default_factory is not MISSING:
            value = spec.default_factory()
        elif spec.default is not MISSING:
            value = spec.default
        else:
            raise ValueError(f"{type(self).__name__}.{name} is always stored")
        kept = tuple(key for key in self.stored_keys if key != name)
        return replace(self, **{name: value}, stored_keys=kept)

    @classmethod
    def _read(cls, raw: Mapping[str, Any], **converted: Any) -> Self:
        known = _fields_of(cls)
        values = {k: v for k, v in raw.items() if k in known}
        values.update(converted)
        missing = [name for name, f in known.items() if name not in values and _required(f)]
        if missing:
            raise StateStoreError(f"the stored {cls.__name__} lacks {missing}: {raw!r}")
        return cls(
            **values,
            stored_keys=tuple(raw),
            unknown={k: v for k, v in raw.items() if k not in known},
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, with the keys of :attr:`stored_keys` in their order."""
        out: dict[str, Any] = {}
        for key in self.stored_keys:
            value = self.unknown[key] if key in self.unknown else getattr(self, key)
            out[key] = _json_of(value)
        return out


def _json_of(value: Any) -> Any:
    """A field's value as the JSON object holds it: a nested object as its dict, a
    sequence as a list."""
    if isinstance(value, Stored):
        return value.to_dict()
    if isinstance(value, tuple | list):  # JSON has lists only
        return [_json_of(item) for item in value]
    return value


def _required(spec: Field[Any]) -> bool:
    return spec.default is MISSING and spec.default_factory is MISSING
