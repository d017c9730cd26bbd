"""The values that cross between nodes, checked against their types' annotations.

Rule: the annotations of a frozen dataclass that travels between nodes are walked once,
when its ``Shape`` is made (at import), into one converter per field. A converter takes
the field's value as msgpack gives it back, or as typed code built it, and returns the
field's value, or raises ``WireError``. ``engine.runtime.wire`` rebuilds every dataclass
it decodes through its shape, by keyword; ``engine.runtime.routing.check_call`` checks a
call that did not cross the wire with the same shapes. ``Shape.build`` is generated per
type (as ``dataclasses`` generates ``__init__``) with the simple tests written inline:
decoding with every check costs no more than decoding without them did.

What an annotation admits:

* ``int``: an int, never a bool, within the field's bounds (none unless given);
  ``float``: a finite float, or an int (never a bool; a duration built from whole
  numbers); ``bool``, ``str``, ``bytes``, ``None``: exactly that type;
* a ``NewType`` as its supertype; an ``IntEnum`` as one of its members, or an int that
  is the value of one; a ``Literal`` as one of its values, of the same type;
* ``list[X]`` as a list, ``tuple[X, ...]`` as a list or a tuple, ``dict[K, V]`` as a
  dict, each item admitted by ``X`` (``K``, ``V``); a union as any of its members;
* a dataclass with a shape as an instance of exactly that class: one that crossed the
  wire was built through its own shape first (msgpack decodes the innermost first);
* ``object`` as a scalar (``None``, bool, int, float, str, bytes): whose meaning the
  receiver checks (the values of a policy change).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from engine.errors import WireError

Convert = Callable[[Any], Any]
Bounds = tuple[int, int]

_SCALARS = (type(None), bool, int, float, str, bytes)


class Shape:
    """How to rebuild and check one dataclass: its fields' names and converters."""

    __slots__ = ("build", "cls", "fields", "name")

    def __init__(self, cls: type[Any], fields: tuple[tuple[str, Convert], ...]) -> None:
        self.cls = cls
        self.name = cls.__name__
        self.fields = fields
        self.build: Callable[[object], Any] = _fast_build(self)
        """An instance from its field values in field order (as they travel), or
        ``WireError``: ``build_checked``, with the checks that have one written inline."""

    def build_checked(self, values: object) -> Any:
        """``build`` one converter call at a time: the error names the field."""
        fields = self.fields
        if type(values) is not list or len(values) != len(fields):
            got = len(values) if type(values) is list else type(values).__name__
            raise WireError(f"{self.name}: {got} fields, expected {len(fields)}")
        kwargs = {}
        for (name, convert), value in zip(fields, values, strict=True):
            try:
                kwargs[name] = convert(value)
            except WireError as e:
                raise WireError(f"{self.name}.{name}: {e.detail}") from None
        return self.cls(**kwargs)

    def check(self, value: object) -> None:
        """``value`` is an instance whose every field its converter admits unchanged."""
        if type(value) is not self.cls:
            raise WireError(f"not a {self.name}: {type(value).__name__}")
        for name, convert in self.fields:
            field = getattr(value, name)
            try:
                converted = convert(field)
            except WireError as e:
                raise WireError(f"{self.name}.{name}: {e.detail}") from None
            if converted is not field and converted != field:
                raise WireError(f"{self.name}.{name}: {type(field).__name__} is not as declared")


_INLINE: dict[Convert, tuple[str, dict[str, Any]]] = {}
"""Converters that keep the value they admit, with the same test as an expression over
``{v}`` and the names it uses: ``build`` runs it inline instead of a call."""


def _inline(convert: Convert, test: str, **names: Any) -> Convert:
    _INLINE[convert] = (test, names)
    return convert


def _fast_build(shape: Shape) -> Callable[[object], Any]:
    """``shape.build_checked`` as one generated function (as ``dataclasses`` makes
    ``__init__``): a field test written inline where its converter has one, a call
    where not (a test may call its converter, which raises); any refusal goes to
    ``build_checked`` for an error that names the field."""
    names: dict[str, Any] = {"cls": shape.cls, "slow": shape.build_checked, "WireError": WireError}
    tests, args = [], []
    for k, (field, convert) in enumerate(shape.fields):
        inline = _INLINE.get(convert)
        if inline is None:
            names[f"c{k}"] = convert
            args.append(f"{field}=c{k}(v{k})")
            continue
        test, used = inline
        for name, value in used.items():
            names[f"{name}{k}"] = value
            test = test.replace(f"{{{name}}}", f"{name}{k}")
        tests.append(test.replace("{v}", f"v{k}"))
        args.append(f"{field}=v{k}")
    n = len(shape.fields)
    unpack = "".join(f"v{k}, " for k in range(n))
    source = "\n".join(
        [
            "def build(values):",
            "    try:",
            f"        if type(values) is list and len(values) == {n}:",
            f"            {unpack} = values" if n else "            pass",
            f"            if {' and '.join(tests) or 'True'}:",
            f"                return cls({', '.join(args)})",
            "    except WireError:",
            "        pass",
            "    return slow(values)",
        ]
    )
    exec(source, names)  # the source is made of field names and indexes, never of input
    return typing.cast(Callable[[object], Any], names["build"])


def shape_of(
    cls: type[Any],
    shapes: Mapping[type[Any], Shape],
    *,
    ints: Bounds | None = None,
    bounds: Mapping[str, Bounds] | None = None,
) -> Shape:
    """The shape of dataclass ``cls``. ``shapes`` holds those of the dataclasses its
    fields may hold; ``ints`` bounds every int field, ``bounds`` some by name."""
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        field_ints = (bounds or {}).get(f.name, ints)
        fields.append((f.name, converter(hints[f.name], shapes, field_ints)))
    return Shape(cls, tuple(fields))


def shapes_of(
    classes: Iterable[type[Any]],
    *,
    ints: Bounds | None = None,
    bounds: Mapping[type[Any], Mapping[str, Bounds]] | None = None,
    known: Mapping[type[Any], Shape] | None = None,
) -> dict[type[Any], Shape]:
    """The shapes of ``classes`` in order: a class's fields may hold the earlier ones
    and those of ``known``."""
    shapes = dict(known or {})
    out: dict[type[Any], Shape] = {}
    for cls in classes:
        shape = shape_of(cls, shapes, ints=ints, bounds=(bounds or {}).get(cls))
        shapes[cls] = out[cls] = shape
    return out


def converter(hint: Any, shapes: Mapping[type[Any], Shape], ints: Bounds | None) -> Convert:
    """The converter of annotation ``hint`` (see the module's rules)."""
    supertype = getattr(hint, "__supertype__", None)
    if supertype is not None:
        return converter(supertype, shapes, ints)
    origin = typing.get_origin(hint)
    if origin is None:
        return _plain(hint, shapes, ints)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        others = [a for a in args if a is not type(None)]
        if len(others) == 1 < len(args):
            return _optional(converter(others[0], shapes, ints))
        return _union([converter(a, shapes, ints) for a in args])
    if origin is Literal:
        return _literal(args)
    if origin is list:
        exact = _exact_class(args[0], shapes)
        if exact is not None:
            return _list_of_exactly(exact)
        return _list(converter(args[0], shapes, ints))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _tuple(converter(args[0], shapes, ints))
    if origin is dict:
        key, item = _exact_class(args[0], shapes), _exact_class(args[1], shapes)
        if key is not None and item is not None:
            return _dict_of_exactly(key, item)
        return _dict(converter(args[0], shapes, ints), converter(args[1], shapes, ints))
    raise AssertionError(f"no converter for {hint!r}")


def _exact_class(hint: Any, shapes: Mapping[type[Any], Shape]) -> type[Any] | None:
    """The class ``hint`` admits exactly (its instances unchanged), if it is one."""
    hint = getattr(hint, "__supertype__", hint)
    if hint in (bool, str, bytes) or (isinstance(hint, type) and hint in shapes):
        return typing.cast(type[Any], hint)
    return None


def _plain(hint: Any, shapes: Mapping[type[Any], Shape], ints: Bounds | None) -> Convert:
    if hint is int:
        return _int(ints)
    if hint is float:
        return _float
    if hint is object:
        return _scalar
    if hint is None or hint is type(None):
        return _exactly(type(None))
    if isinstance(hint, type) and issubclass(hint, enum.IntEnum):
        return _enum(hint)
    exact = _exact_class(hint, shapes)
    if exact is not None:
        return _exactly(exact)
    raise AssertionError(f"no converter for {hint!r}")


def _float(value: Any) -> Any:
    if type(value) is not float and type(value) is not int:
        raise _mismatch(value, "float")
    if not math.isfinite(value):
        raise WireError(f"{value} where a finite float is expected")
    return value


def _mismatch(value: object, what: str) -> WireError:
    return WireError(f"{type(value).__name__} where {what} is expected")


def _exactly(cls: type[Any]) -> Convert:
    what = cls.__name__

    def convert(value: Any) -> Any:
        if type(value) is not cls:
            raise _mismatch(value, what)
        return value

    return _inline(convert, "type({v}) is {t}", t=cls)


def _int(bounds: Bounds | None) -> Convert:
    if bounds is None:

        def any_int(value: Any) -> Any:
            if type(value) is not int:
                raise _mismatch(value, "int")
            return value

        return _inline(any_int, "type({v}) is int")
    lo, hi = bounds

    def bounded(value: Any) -> Any:
        if type(value) is not int:
            raise _mismatch(value, "int")
        if not lo <= value <= hi:
            raise WireError(f"{value} is not in {lo}..{hi}")
        return value

    return _inline(bounded, "(type({v}) is int and {lo} <= {v} <= {hi})", lo=lo, hi=hi)


def _scalar(value: Any) -> Any:
    if type(value) not in _SCALARS:
        raise _mismatch(value, "a scalar")
    return value


def _enum(cls: type[enum.IntEnum]) -> Convert:
    members = {int(m): m for m in cls}

    def convert(value: Any) -> Any:
        if type(value) is cls:
            return value
        member = members.get(value) if type(value) is int else None
        if member is None:
            raise WireError(f"{value!r} is not a {cls.__name__}")
        return member

    return convert


def _literal(values: tuple[Any, ...]) -> Convert:
    allowed = {(type(v), v) for v in values}

    def convert(value: Any) -> Any:
        try:
            ok = (type(value), value) in allowed
        except TypeError:  # an unhashable value
            ok = False
        if not ok:
            raise WireError(f"{value!r} is not one of {values!r}")
        return value

    return convert


def _optional(member: Convert) -> Convert:
    def convert(value: Any) -> Any:
        return None if value is None else member(value)

    inline = _INLINE.get(member)
    if inline is None:
        return convert
    test, names = inline
    return _inline(convert, f"({{v}} is None or {test})", **names)


def _union(members: list[Convert]) -> Convert:
    def convert(value: Any) -> Any:
        for member in members:
            try:
                return member(value)
            except WireError:
                pass
        raise WireError(f"{type(value).__name__} is none of the types allowed")

    return convert


def _list(item: Convert) -> Convert:
    def convert(value: Any) -> Any:
        if type(value) is not list:
            raise _mismatch(value, "list")
        return [item(v) for v in value]

    return convert


def _list_of_exactly(cls: type[Any]) -> Convert:
    """A list of instances of ``cls``, kept as it is (most lists: entries, messages)."""
    what = cls.__name__

    def convert(value: Any) -> Any:
        if type(value) is not list:
            raise _mismatch(value, "list")
        for v in value:
            if type(v) is not cls:
                raise _mismatch(v, what)
        return value

    return convert


def _dict_of_exactly(key: type[Any], item: type[Any]) -> Convert:
    """A dict of exact keys and items, kept as it is (message headers)."""

    def convert(value: Any) -> Any:
        if type(value) is not dict:
            raise _mismatch(value, "dict")
        for k, v in value.items():
            if type(k) is not key or type(v) is not item:
                raise WireError(f"a {type(k).__name__}: {type(v).__name__} item")
        return value

    return _inline(convert, "((type({v}) is dict and not {v}) or {c}({v}) is {v})", c=convert)


def _tuple(item: Convert) -> Convert:
    def convert(value: Any) -> Any:
        if type(value) is not list and type(value) is not tuple:
            raise _mismatch(value, "tuple")
        return tuple([item(v) for v in value])

    return convert


def _dict(key: Convert, item: Convert) -> Convert:
    def convert(value: Any) -> Any:
        if type(value) is not dict:
            raise _mismatch(value, "dict")
        return {key(k): item(v) for k, v in value.items()}

    return convert


__all__ = ["Bounds", "Convert", "Shape", "converter", "shape_of", "shapes_of"]
