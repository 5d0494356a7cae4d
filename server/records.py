"""A faster `__init__` for the frozen, slotted dataclasses a round trip makes.

The run engine's values (inputs, effects, decisions, pending calls, logged
events) are frozen dataclasses: what a decision returned can never change
under the driver. The price is in `__init__`: a frozen dataclass sets each
field with `object.__setattr__` looked up through a global and an attribute
and called with three arguments, ~500 ns for four fields against ~150 ns for
a plain one, and a client tool round trip makes about thirty of them (6% of
the server's time by py-spy). `quick_init` keeps them frozen and gives them
an `__init__` with the same signature that stores each field through its
slot's own descriptor (~300 ns for four fields): the instance is what the
dataclass's `__init__` would have built (`tests/test_records.py`).

Only what the generated code can express is accepted: fields with plain
defaults, no `default_factory`, `InitVar`, `kw_only` or `__post_init__`;
anything else fails at import, not at run time.
"""

import dataclasses
import inspect
from typing import Any, TypeVar

T = TypeVar("T", bound=type)

DATACLASS_INITS: dict[type, Any] = {}  # each class's replaced `__init__`


def quick_init(cls: T) -> T:
    """Replace the `__init__` of `cls`, a `@dataclass(frozen=True, slots=True)`."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__ \
            or hasattr(cls, "__post_init__"):
        raise TypeError(f"quick_init needs a frozen, slotted dataclass without "
                        f"__post_init__: {cls.__qualname__}")
    namespace: dict[str, Any] = {}
    parameters, body = [], []
    for field in dataclasses.fields(cls):
        if not field.init or field.kw_only or field.default_factory is not dataclasses.MISSING:
            raise TypeError(f"quick_init cannot build field {field.name!r} of "
                            f"{cls.__qualname__}")
        namespace[f"_set_{field.name}"] = cls.__dict__[field.name].__set__
        if field.default is dataclasses.MISSING:
            parameters.append(field.name)
        else:
            namespace[f"_default_{field.name}"] = field.default
            parameters.append(f"{field.name}=_default_{field.name}")
        body.append(f"    _set_{field.name}(self, {field.name})")
    source = f"def __init__(self, {', '.join(parameters)}):\n" + "\n".join(body or ["    pass"])
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    general = cls.__dict__["__init__"]  # the dataclass's, set on this class
    init.__signature__ = inspect.signature(general)
    DATACLASS_INITS[cls] = general  # the dataclass's own, for the tests
    setattr(cls, "__init__", init)  # noqa: B010  (mypy refuses the assignment)
    return cls
