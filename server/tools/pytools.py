"""Python server tools: an async function becomes a tool with a JSON Schema.

As openai-agents' `function_tool` and pydantic-ai do, the parameters' type
hints are turned into a pydantic model (`create_model`); its JSON Schema is
what the model sees, and the same model validates the model's arguments, so
the schema and the check can never disagree. The docstring is the
description; parameter descriptions come from
`Annotated[str, Field(description=...)]`. A parameter annotated
`ToolContext` (or `ToolContext | None`) is left out of the schema and injected
at call time. Parameter names pydantic would not make fields of (`_x`,
`model_config`) are refused at load time: the tool would take no arguments.
"""

import importlib
import inspect
import types
import typing
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic_core import PydanticUndefined, to_jsonable_python

from server.tools.config import TOOL_NAME_RE
from server.tools.context import ToolContext


class ToolLoadError(Exception):
    """Why a configured tool cannot be offered (shown as `problem`).

    The message names the exception type only: it is served by
    `GET /v1/tools`, so the exception text (paths, values) goes to the log
    through `__cause__` instead.
    """


@dataclass(frozen=True)
class PythonTool:
    name: str
    description: str
    parameters: dict[str, Any]
    arguments: type[BaseModel]
    func: Callable[..., Awaitable[Any]]
    context_param: str | None

    def check(self, arguments: dict[str, Any]) -> str | None:
        """None when the arguments fit the signature, else a message for the model."""
        try:
            self.arguments.model_validate(arguments)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = "/".join(str(p) for p in first["loc"]) or "(arguments)"
            return f"invalid arguments for {self.name} at {where}: {first['msg']}"
        return None

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        """Validate, call, and return a JSON-ready value (pydantic models, dataclasses...)."""
        model = self.arguments.model_validate(arguments)
        kwargs = {field: getattr(model, field) for field in type(model).model_fields}
        if self.context_param is not None:
            kwargs[self.context_param] = ctx
        return to_jsonable_python(await self.func(**kwargs))


def import_callable(import_string: str) -> object:
    """`"pkg.module:attr.sub"` -> the object; ToolLoadError with a one-line reason."""
    module_name, _, attr_path = import_string.partition(":")
    try:
        target: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            # the configured module itself is not there (a typo, the path not set): one
            # line says all; its traceback would only show importlib's frames
            raise ToolLoadError(f"cannot import {module_name} (ModuleNotFoundError)") from None
        raise ToolLoadError(f"cannot import {module_name} ({type(exc).__name__})") from exc
    except (Exception, SystemExit) as exc:  # the operator's module's failure is a problem,
        # not a crash (a module that calls sys.exit() at import stopped cowrite silently)
        raise ToolLoadError(f"cannot import {module_name} ({type(exc).__name__})") from exc
    for attr in attr_path.split("."):
        try:
            target = getattr(target, attr)
        except AttributeError:
            raise ToolLoadError(f"{module_name} has no attribute {attr_path}") from None
    return target


def _is_context(hint: Any) -> bool:
    """`ToolContext`, optional or not, annotated or not."""
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [arg for arg in typing.get_args(hint) if arg is not type(None)] == [ToolContext]
    return hint is ToolContext


def _unusable_name(name: str) -> str | None:
    """Why pydantic would not make a parameter of this name a field, if it would not."""
    if name.startswith("_"):
        return "pydantic ignores names that start with an underscore"
    if name.startswith("model_") and hasattr(BaseModel, name):
        return "pydantic reserves it for its models"
    return None


def _arguments_model(tool_name: str, fields: dict[str, Any]) -> type[BaseModel]:
    with warnings.catch_warnings():  # `json`, `copy`... shadow BaseModel methods; harmless
        warnings.filterwarnings("ignore", "Field name .* shadows an attribute", UserWarning)
        model = create_model(
            f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    for field in fields:
        if field not in model.model_fields:  # any name pydantic dropped silently
            raise ToolLoadError(f"parameter {field!r} cannot be used: it is not a field of "
                                "a pydantic model; rename it")
    return model


def tool_from_function(func: object, name: str | None = None) -> PythonTool:
    """Build a tool from an async function, or raise ToolLoadError saying why not."""
    if not callable(func):
        raise ToolLoadError("not a function")
    if not inspect.iscoroutinefunction(func):
        raise ToolLoadError("not an async function (define it with `async def`)")
    tool_name: str = name or str(getattr(func, "__name__", ""))
    if not TOOL_NAME_RE.fullmatch(tool_name):
        raise ToolLoadError(f"{tool_name!r} is not a valid tool name; set `name` in the config")
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception as exc:  # unresolvable forward references and the like
        raise ToolLoadError(f"cannot read its type hints ({type(exc).__name__})") from exc
    fields: dict[str, Any] = {}
    context_param = None
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolLoadError(f"*{param.name} parameters cannot be described to a model")
        if param.kind is param.POSITIONAL_ONLY:
            raise ToolLoadError(f"positional-only parameter {param.name} cannot be passed by name")
        hint = hints.get(param.name, PydanticUndefined)
        if hint is PydanticUndefined:
            raise ToolLoadError(f"parameter {param.name} has no type hint")
        if _is_context(hint):
            context_param = param.name
            continue
        unusable = _unusable_name(param.name)
        if unusable is not None:
            raise ToolLoadError(f"parameter {param.name!r} cannot be used: {unusable}; "
                                "rename it")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hint, default)
    try:
        model = _arguments_model(tool_name, fields)
        parameters = model.model_json_schema()
    except ToolLoadError:
        raise
    except Exception as exc:  # PydanticSchemaGenerationError, PydanticInvalidForJsonSchema...
        raise ToolLoadError(f"its type hints have no JSON Schema ({type(exc).__name__})") from exc
    parameters.pop("title", None)
    parameters.setdefault("properties", {})
    description = inspect.getdoc(func) or ""
    return PythonTool(tool_name, description, parameters, model, func, context_param)


def load_python_tool(import_string: str, name: str | None = None) -> PythonTool:
    return tool_from_function(import_callable(import_string), name)
