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

Patterns (`pattern`, `patternProperties`, and the `additionalProperties` that
depends on them) run on RE2, in time linear in the string: jsonschema's own
keywords use Python's backtracking `re` on the event loop, where a client's
`{"pattern": "^(a+)+$"}` and a 30-character argument froze the whole instance
for minutes. JSON Schema patterns are ECMA-262, searched unanchored; RE2's
syntax is close (its `\\d`, `\\w`, `$` are ECMA's; `\\uXXXX` is translated), but
it has no lookaround or backreferences. A schema declared by a client
(`untrusted`) must only hold patterns RE2 can run, and may not combine
`unevaluatedProperties` with `patternProperties` (that keyword is jsonschema's,
with `re`): `pattern_problem` says which pattern is refused, at run.start. An
operator's schema (Python and MCP tools, trusted configuration) keeps Python's
`re` for a pattern RE2 cannot compile.
"""

import functools
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import jsonschema.validators
import orjson
import re2  # type: ignore[import-untyped]  # google-re2 ships no type information
import referencing
from jsonschema.exceptions import ValidationError
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


# -- patterns on RE2 ------------------------------------------------------------------------

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is reported, not logged by RE2 to stderr
# RE2's memory per program (8 MiB by default, its DFA cache included) times the programs
# kept: a pattern that needs more does not compile (a client's is refused at run.start).
_RE2_OPTIONS.max_mem = 8 << 20  # RE2's own default: with 1 MiB its fast matcher gave up
# on a 6,000-instruction pattern and the slow one took 38 s for a 900 KB string
PROGRAMS_CACHED = 64  # compiled programs kept (each may grow its cache up to max_mem)
PROGRAM_SIZE_MAX = 2000
"""The largest RE2 program a client's pattern may compile to (`^[a-z]{1,500}$` is 1,001;
the patterns that made RE2 slow, `(a|aa){1,1000}$` and `a.{800}b`, 6,003 and 6,406)."""
PATTERN_TEXT_MAX = 32_768
"""The longest string a pattern is checked against (longer: it does not match): RE2 is
linear, but its slow path costs microseconds per character on the event loop."""
_ESCAPE = re.compile(r"\\(u[0-9A-Fa-f]{4}|.)", re.DOTALL)  # one escape at a time: linear
PATTERNS_CACHED = 256
UNSUPPORTED = "client tool patterns run on RE2: no lookaround, no backreferences, " \
    "counted repeats up to 1000"


def _re2_syntax(pattern: str) -> str:
    """ECMA-262's `\\uXXXX` as RE2's `\\x{XXXX}`; every other escape kept as written."""
    return _ESCAPE.sub(lambda m: f"\\x{{{m[1][1:]}}}" if len(m[1]) == 5 else m[0], pattern)


@functools.lru_cache(maxsize=PROGRAMS_CACHED)
def re2_program(pattern: str) -> Any:
    """The RE2 program of an ECMA-262 pattern, or why RE2 cannot run it (a str)."""
    try:
        return re2.compile(_re2_syntax(pattern), _RE2_OPTIONS)
    except re2.error as exc:
        why = exc.args[0] if exc.args else "unsupported"
        return why.decode(errors="replace") if isinstance(why, bytes) else str(why)
    except UnicodeEncodeError:
        return "a lone surrogate"


def _search(pattern: str, text: str) -> bool:
    """Whether `pattern` matches anywhere in `text`: on RE2; on Python's `re` only for a
    pattern RE2 cannot compile, which only an operator's schema (or jsonschema's own
    metaschemas, reachable by `$ref`) can hold: `argument_check` refuses such a client
    schema before any validator of it exists."""
    if len(text) > PATTERN_TEXT_MAX:
        return False
    program = re2_program(pattern)
    if isinstance(program, str):
        return re.search(pattern, text) is not None
    try:
        return program.search(text) is not None
    except UnicodeEncodeError:  # a lone surrogate (JSON parsing refuses them): as U+FFFD
        return program.search(text.encode(errors="surrogatepass").decode(errors="replace")) \
            is not None


def _pattern(validator: Any, pattern: str, instance: Any, _: Any
             ) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        if len(instance) > PATTERN_TEXT_MAX:
            yield ValidationError(f"a string of {len(instance)} characters is longer than "
                                  f"{PATTERN_TEXT_MAX}, the most a pattern is checked against")
            return
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any, _: Any
                        ) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any,
                           schema: dict[str, Any]) -> Iterator[ValidationError]:
    """jsonschema's `additionalProperties`, with the patterns searched on RE2."""
    if not validator.is_type(instance, "object"):
        return
    properties, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    extras = {key for key in instance if key not in properties
              and not any(_search(pattern, key) for pattern in patterns)}
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            listed = ", ".join(repr(each) for each in sorted(patterns))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {listed}")
        else:
            unexpected = sorted(extras, key=str)
            verb = "was" if len(unexpected) == 1 else "were"
            yield ValidationError("Additional properties are not allowed (" + ", ".join(
                repr(each) for each in unexpected) + f" {verb} unexpected)")


def _on_re2(base: type[Validator]) -> type[Validator]:
    """`base` (one draft's validator) with its pattern keywords on RE2."""
    keywords = {"pattern": _pattern, "patternProperties": _pattern_properties,
                "additionalProperties": _additional_properties}
    extend: Any = jsonschema.validators.extend  # untyped in types-jsonschema
    extended: type[Validator] = extend(base, keywords)
    return extended


# Registered as the validators of their drafts, process-wide: a validator picks its class
# again for every subschema it enters (`validator_for`: a `$schema` there, a `$ref` into a
# bundled metaschema, whose `$dynamicRef` can lead back into the schema); a stock class
# chosen there would search the schema's patterns on `re` again.
_DRAFTS = {"draft3": jsonschema.Draft3Validator, "draft4": jsonschema.Draft4Validator,
           "draft6": jsonschema.Draft6Validator, "draft7": jsonschema.Draft7Validator,
           "draft2019-09": jsonschema.Draft201909Validator,
           "draft2020-12": jsonschema.Draft202012Validator}
_register: Any = jsonschema.validators.validates  # its stub takes an instance, not a class
ON_RE2: dict[str, type[Validator]] = {version: _register(version)(_on_re2(stock))
                                      for version, stock in _DRAFTS.items()}
LATEST = ON_RE2["draft2020-12"]


def validator_class(schema: dict[str, Any]) -> type[Validator]:
    """The validator of the draft the schema names in `$schema` (draft-07 is what many
    MCP servers emit: its tuple `items: [...]` is invalid 2020-12), else 2020-12; with
    its patterns on RE2. A `$schema` that is not a string is left to 2020-12's
    metaschema to refuse."""
    if not isinstance(schema.get("$schema", ""), str):
        return LATEST
    return jsonschema.validators.validator_for(schema, default=LATEST)


_Path = tuple[str, "_Path"] | None  # (last key, the path before it): shared, not copied


def _json_pointer(path: _Path) -> str:
    parts = []
    while path is not None:
        parts.append(path[0].replace("~", "~0").replace("/", "~1"))
        path = path[1]
    return "".join("/" + part for part in reversed(parts))


def pattern_problem(schema: dict[str, Any]) -> str | None:
    """Why a client's schema cannot be checked in linear time (None: it can): a pattern
    RE2 cannot run, or `unevaluatedProperties` with `patternProperties`. Every object of
    the document is looked at, wherever it is (a `$ref` can point anywhere in it), so
    a `pattern` in an `enum` value counts too. Kept per distinct schema: every run
    (and every takeover) checks its client tools again."""
    return _pattern_verdicts(schema)


def _pattern_problem(schema: dict[str, Any]) -> str | None:
    stack: list[tuple[Any, _Path]] = [(schema, None)]
    keys_seen: set[str] = set()
    while stack:  # iterative: a schema may be nested deeper than Python recurses
        node, path = stack.pop()
        if isinstance(node, list):
            stack.extend((item, (str(i), path)) for i, item in reversed(list(enumerate(node))))
            continue
        if not isinstance(node, dict):
            continue
        keys_seen.update(k for k in ("patternProperties", "unevaluatedProperties") if k in node)
        found: list[tuple[str, _Path]] = []
        if isinstance(node.get("pattern"), str):
            found.append((node["pattern"], ("pattern", path)))
        if isinstance(node.get("patternProperties"), dict):
            within: _Path = ("patternProperties", path)
            found += [(key, (key, within)) for key in node["patternProperties"]]
        for pattern, where in found:
            why = re2_program(pattern)
            if isinstance(why, str):
                return f"the pattern at {_json_pointer(where)} cannot run on RE2 ({why}); " \
                    + UNSUPPORTED
            if why.programsize > PROGRAM_SIZE_MAX:
                return f"the pattern at {_json_pointer(where)} is too large for a client " \
                    f"tool (RE2 program size {why.programsize}, at most {PROGRAM_SIZE_MAX}; " \
                    "bound lengths with minLength/maxLength instead of counted repeats)"
        stack.extend((value, (key, path)) for key, value in reversed(node.items()))
    if len(keys_seen) == 2:
        return "unevaluatedProperties cannot be combined with patternProperties in a " \
            "client tool's schema"
    return None


_pattern_verdicts = SchemaVerdicts(_pattern_problem, PATTERNS_CACHED)


def argument_check(name: str, schema: dict[str, Any], untrusted: bool = False
                   ) -> ArgumentCheck | str:
    """The check of `name`'s arguments (None: valid; else the model's message), or why
    `schema` cannot be used at all. `untrusted` (a client's tool): a pattern RE2 cannot
    run makes the schema unusable (`pattern_problem`) instead of running on `re`."""
    if untrusted:
        problem = pattern_problem(schema)
        if problem is not None:
            return f"its input schema cannot be used: {problem}"
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
