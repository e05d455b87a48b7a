"""Declaring and checking fields: the one set of check helpers, and a small declarative layer over dataclasses.

Standard library only, so the core and the planner import it without torch.

**Checks.** A :class:`Rule` says what a value must be: a test, a phrase for
messages (``"an int >= 1"``) and an optional conversion (a list read from a
file becomes a tuple). The rule builders (:func:`integer`, :func:`number`,
:func:`choice`, :func:`boolean`, :func:`string`, :func:`tuple_of`,
:func:`optional`, :func:`table`) make them, :func:`check` applies one, and
:func:`check_int`, :func:`check_number`, :func:`check_choice`,
:func:`check_bool`, :func:`check_str` and :func:`check_tuple` are the
one-line forms. :func:`is_int` and :func:`is_number` are the type tests
(``True`` is no int here). Every failure is a ``ValueError`` in one of two
forms:

* a field of a file (a run config, a plan): ``config field 'training.steps' =
  0 is invalid: expected an int >= 1``, from :func:`field_error` (``config_error``
  is the run config's);
* an argument or attribute in Python: ``warmup must be an int >= 0, got -1``,
  from :func:`argument_error` (the default); the name carries its owner where
  that helps (``Event.rank``, ``PartitionEditor stages``).

**Declared fields.** A dataclass declares each field's rule with
:func:`spec` (``steps: int = spec(10, integer(1))``) and calls
:func:`validate` from ``__post_init__``: one loop checks every declared field,
stores conversions, and names the field with the class's prefix
(``training.``) in its owner's error form. :func:`to_dict` and
:func:`from_dict` are the one way such a value becomes a dict and back:
nested dataclass tables, tuples as lists, unknown keys refused naming the key
and the valid ones (:func:`reject_unknown`), a missing required field named.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Rule", "ErrorForm", "field_error", "config_error", "argument_error", "is_int", "is_number",
           "integer", "number", "at_least", "choice", "boolean", "string", "tuple_of", "optional", "table", "check",
           "check_int", "check_number", "check_choice", "check_bool", "check_str", "check_tuple", "spec",
           "rule_of", "table_class", "validate", "to_dict", "from_dict", "merged", "reject_unknown", "require"]


# -- rules ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """What a value must be: ``test(value)``, the phrase messages use, and how an accepted value is stored.

    ``expected`` is a noun phrase (``"an int >= 1"``); ``valid`` the sentence a field message ends with
    (default ``"expected <expected>"``); ``listing`` marks a phrase that ends in a list (an argument message
    then reads ``...; got x``); ``convert`` turns an accepted value into the stored one (``list`` -> ``tuple``).
    ``rule.then(other)`` checks ``other`` after ``rule`` accepts, each with its own phrase (a type, then a
    bound: ``must be a finite number`` / ``must be >= 0``). ``schema`` is the JSON Schema of what the rule
    accepts, as far as JSON Schema can say it (``workbench schema`` is made from it).
    """

    test: Callable[[Any], bool]
    expected: str
    valid: str = ""
    listing: bool = False
    convert: Callable[[Any], Any] | None = None
    next: "Rule | None" = None
    none: bool = False  # None passes the whole chain (see optional())
    schema: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def sentence(self) -> str:
        return self.valid or f"expected {self.expected}"

    def refusal(self, value: Any) -> "Rule | None":
        """The first rule of the chain that refuses ``value``; None when all accept it."""
        if self.none and value is None:
            return None
        if not self.test(value):
            return self
        return self.next.refusal(value) if self.next is not None else None

    def accepts(self, value: Any) -> bool:
        return self.refusal(value) is None

    def then(self, other: "Rule") -> "Rule":
        """This rule, then ``other`` on the values this one accepts (stored as the last conversion makes them)."""
        return dataclasses.replace(self, next=other if self.next is None else self.next.then(other))

    @property
    def json_schema(self) -> dict[str, Any]:
        """The chain's JSON Schema: each step's constraints together."""
        out = {**self.schema, **(self.next.json_schema if self.next is not None else {})}
        return {"anyOf": [{"type": "null"}, out]} if self.none else out


def is_int(value: Any) -> bool:
    """An ``int`` and not a ``bool`` (``True`` is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An ``int`` or ``float`` and not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bounds(minimum: Any, maximum: Any, strict: bool) -> str:
    if minimum is not None and maximum is not None and not strict:
        return f" from {minimum} to {maximum}"
    parts = ([f"{'>' if strict else '>='} {minimum}"] if minimum is not None else []) + \
        ([f"<= {maximum}"] if maximum is not None else [])
    return (" " + " and ".join(parts)) if parts else ""


def _within(value: Any, minimum: Any, maximum: Any, strict: bool) -> bool:
    low = minimum is None or value > minimum or (not strict and value == minimum)
    return low and (maximum is None or value <= maximum)


def integer(minimum: int | None = None, maximum: int | None = None, *, expected: str | None = None) -> Rule:
    """An int (no bool) within ``[minimum, maximum]`` (either bound optional): ``"an int >= 1"``."""
    low = -math.inf if minimum is None else minimum
    high = math.inf if maximum is None else maximum
    if minimum is None and maximum is None:
        test = is_int
    else:  # spelled out: checks run often (every action of a schedule)
        def test(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high
    return Rule(test, expected or f"an int{_bounds(minimum, maximum, False)}",
                schema=_schema("integer", minimum, maximum, False))


def number(minimum: float | None = None, maximum: float | None = None, *, strict: bool = False,
           finite: bool = False, expected: str | None = None) -> Rule:
    """An int or float (no bool) ``>= minimum`` (``> minimum`` if ``strict``) and ``<= maximum``; ``finite``
    also refuses inf and nan: ``"a number > 0"``, ``"a finite number >= 0"``."""
    def test(v: Any) -> bool:
        return is_number(v) and (not finite or math.isfinite(v)) and _within(v, minimum, maximum, strict)
    return Rule(test, expected or f"a {'finite ' if finite else ''}number{_bounds(minimum, maximum, strict)}",
                schema=_schema("number", minimum, maximum, strict))


def _schema(kind: str, minimum: Any, maximum: Any, strict: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"type": kind}
    if minimum is not None:
        out["exclusiveMinimum" if strict else "minimum"] = minimum
    if maximum is not None:
        out["maximum"] = maximum
    return out


def choice(options: Iterable[Any], *, expected: str | None = None) -> Rule:
    """One of ``options``: ``"one of sgd, adam"`` (a field message: ``valid options are sgd, adam``)."""
    options = tuple(options)
    listed = ", ".join(map(str, options))
    return Rule(lambda v: _member(v, options), expected or f"one of {listed}", valid=f"valid options are {listed}",
                listing=True, schema={"enum": list(options)})


def _member(value: Any, options: tuple) -> bool:
    try:
        return value in options
    except TypeError:  # an unhashable value against a set-like container
        return False


def boolean() -> Rule:
    """``True`` or ``False`` (no 0 or 1)."""
    return Rule(lambda v: isinstance(v, bool), "true or false", schema={"type": "boolean"})


def string(*, empty: bool = True, expected: str | None = None) -> Rule:
    """A ``str``; ``empty=False`` also refuses ``""``."""
    return Rule(lambda v: isinstance(v, str) and (empty or bool(v)),
                expected or ("a string" if empty else "a non-empty string"),
                schema={"type": "string"} if empty else {"type": "string", "minLength": 1})


def tuple_of(item: Rule | None = None, *, expected: str | None = None) -> Rule:
    """A list or tuple (not a string) whose items pass ``item``; stored as a tuple."""
    def test(v: Any) -> bool:
        return isinstance(v, (list, tuple)) and (item is None or all(item.accepts(x) for x in v))
    return Rule(test, expected or (f"a list of {_plural(item.expected)}" if item else "a list"), convert=tuple,
                schema={"type": "array", "items": item.json_schema if item else {}})


def _plural(phrase: str) -> str:
    """``"an int >= 1"`` -> ``"ints >= 1"`` (good enough for the phrases the builders make)."""
    head, _, rest = phrase.partition(" ")
    if head in ("a", "an") and rest:
        word, _, tail = rest.partition(" ")
        return f"{word}s" + (f" {tail}" if tail else "")
    return phrase


def at_least(minimum: float, *, strict: bool = False) -> Rule:
    """A bound alone, after a type rule: ``number(finite=True).then(at_least(0))`` (``must be >= 0``)."""
    return Rule((lambda v: v > minimum) if strict else (lambda v: v >= minimum), f"{'>' if strict else '>='} {minimum}",
                schema={"exclusiveMinimum" if strict else "minimum": minimum})


def optional(rule: Rule) -> Rule:
    """``None`` or what ``rule`` (each step of its chain) accepts."""
    single = rule.next is None
    return dataclasses.replace(rule, none=True, expected=f"None or {rule.expected}" if single else rule.expected,
                               valid=f"None or {rule.valid}" if rule.valid and single else rule.valid)


def table(*, expected: str | None = None) -> Rule:
    """A table (dict) of settings; stored as a copy."""
    return Rule(lambda v: isinstance(v, dict), expected or "a table", convert=dict, schema={"type": "object"})


# -- errors ---------------------------------------------------------------------------------------------------------

ErrorForm = Callable[[str, Any, "Rule | str"], ValueError]
"""How one owner words a refusal: ``(name, value, rule or a sentence of what is valid) -> ValueError``."""


def field_error(owner: str) -> ErrorForm:
    """The refusal of a field of a file: ``<owner> field 'name' = value is invalid: <what is valid>``."""
    def error(name: str, value: Any, valid: Rule | str) -> ValueError:
        text = valid.sentence if isinstance(valid, Rule) else valid
        return ValueError(f"{owner} field {name!r} = {value!r} is invalid: {text}")
    error.__name__ = f"{owner.replace(' ', '_')}_error"
    error.__doc__ = f"A ValueError naming the {owner} field, its value and what would be valid."
    return error


config_error: ErrorForm = field_error("config")


def argument_error(name: str, value: Any, valid: Rule | str) -> ValueError:
    """The refusal of an argument or attribute: ``name must be <expected>, got value`` (``; got`` after a list)."""
    if isinstance(valid, Rule):
        return ValueError(f"{name} must be {valid.expected}{';' if valid.listing else ','} got {value!r}")
    return ValueError(f"{name} = {value!r} is invalid: {valid}")


# -- checks ---------------------------------------------------------------------------------------------------------

def check(name: str, value: Any, rule: Rule, error: ErrorForm = argument_error) -> Any:
    """``value`` as stored (converted by the rule), or the owner's ``ValueError`` naming ``name`` and what the
    (first refusing step of the) rule expected."""
    if rule.none and value is None:
        return None
    step = rule
    while step is not None:  # the chain's steps in turn (a loop: checks run often, in schedules' actions)
        if not step.test(value):
            raise error(name, value, step)
        if step.convert is not None:
            value = step.convert(value)
        step = step.next
    return value


def check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None, *,
              error: ErrorForm = argument_error, expected: str | None = None) -> int:
    """An int (no bool) within ``[minimum, maximum]``."""
    return check(name, value, integer(minimum, maximum, expected=expected), error)


def check_number(name: str, value: Any, minimum: float | None = None, maximum: float | None = None, *,
                 strict: bool = False, finite: bool = False, error: ErrorForm = argument_error,
                 expected: str | None = None) -> float:
    """A number (no bool) ``>= minimum`` (``>`` if ``strict``), ``<= maximum``, finite if asked."""
    return check(name, value, number(minimum, maximum, strict=strict, finite=finite, expected=expected), error)


def check_choice(name: str, value: Any, choices: Iterable[Any], *, error: ErrorForm = argument_error) -> Any:
    """One of ``choices``."""
    return check(name, value, choice(choices), error)


def check_bool(name: str, value: Any, *, error: ErrorForm = argument_error) -> bool:
    """``True`` or ``False``."""
    return check(name, value, boolean(), error)


def check_str(name: str, value: Any, *, empty: bool = True, error: ErrorForm = argument_error,
              expected: str | None = None) -> str:
    """A string (non-empty with ``empty=False``)."""
    return check(name, value, string(empty=empty, expected=expected), error)


def check_tuple(name: str, value: Any, item: Rule | None = None, *, error: ErrorForm = argument_error,
                expected: str | None = None) -> tuple:
    """A list or tuple of items ``item`` accepts, as a tuple."""
    return check(name, value, tuple_of(item, expected=expected), error)


# -- declared fields ------------------------------------------------------------------------------------------------

_RULE = "workbench.rule"


def spec(default: Any = dataclasses.MISSING, rule: Rule | None = None, *,
         default_factory: Any = dataclasses.MISSING, **kwargs: Any) -> Any:
    """A dataclass field whose value must pass ``rule`` (checked by :func:`validate`)::

        steps: int = spec(10, integer(1))
        columns: tuple[str, ...] = spec((), tuple_of(string()))
        args: dict[str, Any] = spec(default_factory=dict, rule=table())
        forward_ms: float = spec(rule=number(finite=True))     # no default: required
    """
    metadata = {**kwargs.pop("metadata", {}), _RULE: rule}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata, **kwargs)


def rule_of(f: dataclasses.Field) -> Rule | None:
    """The rule a field declares with :func:`spec`, if any."""
    return f.metadata.get(_RULE)


def validate(obj: Any, prefix: str = "", error: ErrorForm = argument_error) -> None:
    """Check every field of the dataclass ``obj`` that declares a rule; store the converted values.

    A refusal names the field as ``prefix + name`` (``training.steps``, ``Event.rank``) in ``error``'s form.
    Called from ``__post_init__``, before the class's checks that involve several fields.
    """
    for f in dataclasses.fields(obj):
        rule = rule_of(f)
        if rule is None:
            continue
        value = getattr(obj, f.name)
        stored = check(prefix + f.name, value, rule, error)
        if stored is not value:
            object.__setattr__(obj, f.name, stored)


def reject_unknown(data: Mapping[str, Any], known: Iterable[str], prefix: str = "",
                   error: ErrorForm = argument_error, unknown: str = "unknown field; valid fields are", *,
                   ordered: bool = False) -> None:
    """Refuse the first key of ``data`` (sorted) that is not in ``known``, naming it and the valid ones:
    ``<unknown> [the valid names]`` (``none`` when there are none), sorted unless ``ordered``."""
    extra = data.keys() - known if isinstance(known, (set, frozenset)) else data.keys() - set(known)
    if extra:
        known = list(known) if ordered else sorted(known)
        first = sorted(extra)[0]
        raise error(prefix + first, data[first], f"{unknown} {known or 'none'}")


def require(data: Mapping[str, Any], names: Iterable[str], prefix: str = "", owner: str = "config") -> None:
    """Refuse ``data`` without one of ``names``: ``<owner> field 'name' is missing; it is required``."""
    for name in names:
        if name not in data:
            raise ValueError(f"{owner} field {prefix + name!r} is missing; it is required")


def _plain(value: Any) -> Any:
    """A field value as JSON/TOML-ready data: a nested value by its own ``to_dict``, tuples as lists."""
    if hasattr(value, "to_dict") and not isinstance(value, type):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def to_dict(obj: Any) -> dict[str, Any]:
    """Every field of the dataclass ``obj`` in field order: nested tables as dicts (by their own ``to_dict``
    where they have one), tuples as lists, dicts copied."""
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def table_class(hint: Any) -> type | None:
    """The dataclass a field's annotation names (also inside ``X | None``), else None: a nested table."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        found = [a for a in typing.get_args(hint) if isinstance(a, type) and dataclasses.is_dataclass(a)]
        return found[0] if len(found) == 1 else None
    return None


@functools.lru_cache(maxsize=None)
def _layout(cls: type) -> tuple[frozenset[str], tuple[str, ...], dict[str, type]]:
    """A dataclass's init fields, the required ones, and the fields that hold a nested table (by its class)."""
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    required = tuple(n for n, f in known.items()
                     if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    hints = typing.get_type_hints(cls)
    nested = {n: t for n in known if (t := table_class(hints.get(n))) is not None}
    return frozenset(known), required, nested


def from_dict(cls: type, data: Any, prefix: str = "", error: ErrorForm = argument_error,
              owner: str = "config") -> Any:
    """An instance of the dataclass ``cls`` from a dict, the inverse of :func:`to_dict`.

    Unknown keys are refused (:func:`reject_unknown`), a missing field without a default is named
    (:func:`require`, in ``owner``'s words), and a field whose annotation is a dataclass is built from its dict
    the same way (by the class's own ``from_dict`` where it has one), its keys prefixed with the field's name
    (``training.optimizer.``). Values are checked by the class itself (``__post_init__``).
    """
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        names = [f.name for f in dataclasses.fields(cls)]
        raise error(prefix.rstrip(".") or cls.__name__, data, f"expected a table with fields {names}")
    known, required, nested = _layout(cls)
    reject_unknown(data, known, prefix, error)
    require(data, required, prefix, owner)
    values = dict(data)
    for name in nested.keys() & values.keys():
        if isinstance(values[name], Mapping):
            table_cls = nested[name]
            values[name] = table_cls.from_dict(values[name]) if hasattr(table_cls, "from_dict") else \
                from_dict(table_cls, values[name], f"{prefix}{name}.", error, owner)
    return cls(**values)


def merged(cls: type, data: Mapping[str, Any], changes: Mapping[str, Any], whole: Iterable[str] = ()) -> dict[str, Any]:
    """``data`` (a dict of the dataclass ``cls``) with ``changes``: a dict given for a nested table changes only
    the entries it names (the same way down its own tables); any other value, and a table named in ``whole``,
    replaces the entry."""
    out = dict(data)
    _, _, nested = _layout(cls)
    for key, value in changes.items():
        current = out.get(key)
        if key in nested and key not in whole and isinstance(value, Mapping) and isinstance(current, Mapping):
            out[key] = merged(nested[key], current, value)
        else:
            out[key] = value
    return out
