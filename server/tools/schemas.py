"""Checking tool arguments against a JSON Schema without ever leaving the process.

Given no registry, jsonschema resolves a `$ref` to an http(s) address by
fetching it, synchronously, on the event loop: a tool schema from a client
(`run.start` tools) or an MCP server could make cowrite request any address
it can reach, and stall every run meanwhile. With an empty
`referencing.Registry` only what the schema itself contains resolves. A
schema jsonschema cannot compile, a `$ref` to something outside it, and
arguments that exhaust the recursion of a recursive schema are the call's
problem (a message for the model), never an exception in the run. A schema is
read as the draft its `$schema` names (2020-12 when it names none or one
jsonschema does not know).
"""

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import jsonschema
import jsonschema.validators
import orjson
import referencing
from jsonschema.protocols import Validator
from referencing.exceptions import Unresolvable

NO_FETCHING: referencing.Registry[Any] = referencing.Registry()
ArgumentCheck = Callable[[dict[str, Any]], str | None]


class SchemaVerdicts:
    """What `judge` said of each distinct schema (canonical JSON), the newest `size`
    kept: editors declare the same few tools on every run.start and an MCP server
    lists the same tools at every poll, and the metaschema check costs milliseconds
    per schema (500 tools held the event loop 2 s)."""

    def __init__(self, judge: Callable[[dict[str, Any]], str | None], size: int) -> None:
        self._judge = judge
        self._size = size
        self._verdicts: OrderedDict[bytes, str | None] = OrderedDict()

    def __call__(self, schema: dict[str, Any]) -> str | None:
        try:
            key = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
        except (TypeError, ValueError):  # too deep for orjson: judged without the cache
            return self._judge(schema)
        if key in self._verdicts:
            self._verdicts.move_to_end(key)
            return self._verdicts[key]
        verdict = self._verdicts[key] = self._judge(schema)
        if len(self._verdicts) > self._size:
            self._verdicts.popitem(last=False)
        return verdict


def validator_class(schema: dict[str, Any]) -> type[Validator]:
    """The validator of the draft the schema names in `$schema` (draft-07 is what many
    MCP servers emit: its tuple `items: [...]` is invalid 2020-12), else 2020-12.
    A `$schema` that is not a string is left to 2020-12's metaschema to refuse."""
    if not isinstance(schema.get("$schema", ""), str):
        return jsonschema.Draft202012Validator
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


def argument_check(name: str, schema: dict[str, Any]) -> ArgumentCheck | str:
    """The check of `name`'s arguments (None: valid; else the model's message), or why
    `schema` cannot be used at all."""
    try:
        validator = validator_class(schema)(schema, registry=NO_FETCHING)
    except Exception:  # jsonschema fails while compiling some invalid schemas
        return "its input schema cannot be used"

    def check(arguments: dict[str, Any]) -> str | None:
        try:
            errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
        except Unresolvable:
            return f"the input schema of {name} refers to a schema it does not contain"
        except RecursionError:
            return f"arguments of {name} are nested too deeply"
        if not errors:
            return None
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(arguments)"
        return f"invalid arguments for {name} at {where}: {errors[0].message}"

    return check
