"""`quick_init` builds exactly what the dataclass's own `__init__` would have, for
every class the server gives it, and the instances stay frozen."""

import dataclasses
import inspect
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import server.app  # noqa: F401  (imports every module that uses quick_init)
from server.records import DATACLASS_INITS, quick_init

CLASSES = sorted(DATACLASS_INITS, key=lambda cls: cls.__qualname__)
VALUES = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers()),
                   st.booleans())


def test_the_round_trips_values_use_it() -> None:
    names = {cls.__name__ for cls in CLASSES}
    assert {"Decision", "Publish", "Reply", "ClientToolResult", "ModelFinished", "PendingCall",
            "LoggedEvent", "CallGrant", "ToolOutcome"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__qualname__)
@given(data=st.data())
def test_an_instance_is_what_the_dataclass_would_build(cls: type, data: st.DataObject) -> None:
    fields = dataclasses.fields(cls)
    required = sum(field.default is dataclasses.MISSING for field in fields)
    count = data.draw(st.integers(required, len(fields)))
    args = [data.draw(VALUES) for _ in range(count)]
    as_keywords = data.draw(st.booleans())
    built = (cls(**{f.name: a for f, a in zip(fields, args, strict=False)}) if as_keywords
             else cls(*args))
    reference: Any = object.__new__(cls)
    DATACLASS_INITS[cls](reference, *args)
    assert [getattr(built, f.name) for f in fields] == \
        [getattr(reference, f.name) for f in fields]
    assert repr(built) == repr(reference)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, fields[0].name, "changed")


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__qualname__)
def test_the_signature_and_its_errors_are_the_dataclasses(cls: type) -> None:
    assert inspect.signature(cls.__dict__["__init__"]) == inspect.signature(DATACLASS_INITS[cls])
    too_many = [None] * (len(dataclasses.fields(cls)) + 1)
    with pytest.raises(TypeError):
        cls(*too_many)


def _refused(**options: Any) -> None:
    body: dict[str, Any] = {"__annotations__": {"a": int}}
    body.update(options.pop("body", {}))
    cls = type("Refused", (), body)
    quick_init(dataclasses.dataclass(**options)(cls))


@pytest.mark.parametrize(("options", "why"), [
    ({"frozen": False, "slots": True}, "frozen"),
    ({"frozen": True}, "slotted"),
    ({"frozen": True, "slots": True, "body": {"__post_init__": lambda self: None}},
     "__post_init__"),
    ({"frozen": True, "slots": True, "kw_only": True}, "field 'a'"),
    ({"frozen": True, "slots": True, "body": {"a": dataclasses.field(default_factory=int)}},
     "field 'a'"),
])
def test_what_it_cannot_build_fails_at_import(options: dict[str, Any], why: str) -> None:
    with pytest.raises(TypeError, match=why):
        _refused(**options)
