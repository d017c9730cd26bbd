"""``quick_init``: a faster ``__init__`` for a frozen, slotted dataclass made on a hot path.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (the
class refuses plain assignment), which finds the field's slot by name on every call.
The one given here calls each slot's descriptor directly, found once: the same object,
about twice as fast to make (0.5 us instead of 0.9 for five fields). The Raft core makes
several such objects per proposal (an entry, the proposal, its acceptance, the hard
state, a persisted report). Equality, hashing, ``repr`` and immutability are the
dataclass's own; only ``__init__`` is replaced, with the same parameters, and it calls
``__post_init__`` when the class has one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def quick_init(cls: type[T]) -> type[T]:
    """``cls``, a frozen slotted dataclass whose fields are all positional and required,
    with the faster ``__init__``."""
    params = getattr(cls, "__dataclass_params__", None)
    assert params is not None and params.frozen and "__slots__" in cls.__dict__, cls
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    for field in fields:
        assert field.init and not field.kw_only, (cls, field.name)
        assert field.default is dataclasses.MISSING, (cls, field.name)
        assert field.default_factory is dataclasses.MISSING, (cls, field.name)
    names = [field.name for field in fields]
    namespace: dict[str, Any] = {f"_set_{name}": cls.__dict__[name].__set__ for name in names}
    lines = [f"def __init__(self, {', '.join(names)}):"]
    lines += [f"    _set_{name}(self, {name})" for name in names]
    if hasattr(cls, "__post_init__"):
        lines.append("    self.__post_init__()")
    exec("\n".join(lines), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


__all__ = ["quick_init"]
