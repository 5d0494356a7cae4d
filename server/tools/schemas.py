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

from collections.abc import Callable
from typing import Any

import jsonschema
import jsonschema.validators
import referencing
from jsonschema.protocols import Validator
from referencing.exceptions import Unresolvable

NO_FETCHING: referencing.Registry[Any] = referencing.Registry()
ArgumentCheck = Callable[[dict[str, Any]], str | None]


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
