"""The operator's tool file (`COWRITE_CONFIG`, PROTOCOL.md section 15), parsed and validated.

The file is read once at startup with the standard `tomllib` and checked by
pydantic models that forbid unknown keys, so a typo such as
`requires_aproval` stops cowrite with one line naming the key and the file
instead of being silently ignored. Everything here is free of I/O except
`load_config`, which reads the file.
"""

import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from server.settings import MAX_SECONDS

TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"
# MCP server names become the prefix of `<server>__<tool>`; "__" inside one is refused.
MCP_SERVER_NAME = r"^[A-Za-z0-9_-]{1,32}$"
WORKFLOW_NAME = r"^[A-Za-z0-9._:-]{1,64}$"
IMPORT_STRING = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
# A tool's `timeout_s`: finite, at most a year (as the COWRITE_*_S settings); a
# workflow's `max_steps`: a run's step count is checkpointed as a 64-bit integer, and
# a value beyond that started a run whose every checkpoint was skipped.
TimeoutSeconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
MAX_STEPS = 1_000_000


class ConfigError(Exception):
    """The tool file is missing, unreadable or invalid; the message is one line."""


class _Strict(BaseModel):
    # strict: a value of the wrong TOML type is an error, not converted (`timeout_s = "5"`
    # was taken as 5, `requires_approval = "no"` as false)
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


class PythonToolConfig(_Strict):
    """`[[tools]]`: a Python server tool by import string (or a built-in's settings)."""

    import_: str = Field(alias="import", pattern=IMPORT_STRING)
    name: str | None = Field(default=None, pattern=TOOL_NAME)  # default: the function's name
    enabled: bool = True
    requires_approval: bool = False
    timeout_s: TimeoutSeconds | None = None  # default: COWRITE_SERVER_TOOL_TIMEOUT_S
    idempotent: bool = False


class McpServerConfig(_Strict):
    """`[[mcp]]`: one MCP server, either a stdio `command` or a streamable-HTTP `url`."""

    name: str = Field(pattern=MCP_SERVER_NAME)
    command: list[str] | None = Field(default=None, min_length=1)
    env: dict[str, str] | None = None
    cwd: Path | None = Field(default=None, strict=False)  # TOML has no path type
    url: str | None = Field(default=None, pattern=r"^https?://")
    headers: dict[str, str] | None = None
    enabled: bool = True
    requires_approval: bool = True
    timeout_s: TimeoutSeconds | None = None  # default: COWRITE_SERVER_TOOL_TIMEOUT_S
    idempotent: bool = False
    tools: list[str] | None = None  # allowlist of the server's own tool names
    rename: dict[str, str] = Field(default_factory=dict)  # MCP tool name -> cowrite name

    @model_validator(mode="after")
    def _transport(self) -> "McpServerConfig":
        if "__" in self.name:
            raise ValueError("an MCP server name cannot contain `__` (it ends the prefix)")
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of `command` (stdio) or `url` (streamable HTTP)")
        if self.url is not None and (self.env is not None or self.cwd is not None):
            raise ValueError("`env` and `cwd` apply to a stdio `command` only")
        if self.command is not None and self.headers is not None:
            raise ValueError("`headers` apply to a streamable-HTTP `url` only")
        for new in self.rename.values():
            if not TOOL_NAME_RE.fullmatch(new):
                raise ValueError(f"rename target {new!r} is not a valid tool name")
        return self


class Workflow(_Strict):
    """`[[workflows]]`: an operator-defined kind of run (PROTOCOL.md section 14).

    Parsed and checked here; applying it to a run (allowlist, approvals,
    prompt, steps) is the run engine's job. `tools = None` means no allowlist.
    """

    name: str = Field(pattern=WORKFLOW_NAME)
    title: str | None = None  # default: the name
    description: str = ""
    category: str = "general"
    mode: Literal["agent", "chat"] = "agent"
    system_prompt: str | None = None  # default: COWRITE_SYSTEM_PROMPT
    tools: list[str] | None = None
    approval: list[str] = Field(default_factory=list)
    max_steps: int | None = Field(default=None, ge=1, le=MAX_STEPS)  # default: COWRITE_MAX_STEPS

    @model_validator(mode="after")
    def _check(self) -> "Workflow":
        for name in [*(self.tools or []), *self.approval]:
            if not TOOL_NAME_RE.fullmatch(name):
                raise ValueError(f"{name!r} is not a valid tool name")
        if self.mode == "chat" and (self.tools or self.approval):
            raise ValueError("a chat workflow uses no tools: drop `tools` and `approval`")
        if self.tools is not None and (extra := sorted(set(self.approval) - set(self.tools))):
            raise ValueError(f"`approval` names tools missing from `tools`: {', '.join(extra)}")
        return self

    def public(self) -> dict[str, Any]:
        """The `GET /v1/workflows` entry; the system prompt stays on the server. `tools`
        is left out when the workflow has no allowlist (the run's tools are not
        narrowed), as the protocol leaves out absent fields rather than send null."""
        entry: dict[str, Any] = {"name": self.name, "title": self.title or self.name,
                                 "description": self.description, "category": self.category,
                                 "mode": self.mode}
        if self.tools is not None:
            entry["tools"] = self.tools
        return entry


class CowriteConfig(_Strict):
    tools: list[PythonToolConfig] = Field(default_factory=list)
    mcp: list[McpServerConfig] = Field(default_factory=list)
    workflows: list[Workflow] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> "CowriteConfig":
        for what, key, names in (
                ("mcp server name", "[[mcp]] name", [m.name for m in self.mcp]),
                ("workflow name", "[[workflows]] name", [w.name for w in self.workflows]),
                ("tool import", "[[tools]] import: each function once",
                 [t.import_ for t in self.tools])):
            seen: set[str] = set()
            for name in names:
                if name in seen:
                    raise ValueError(f"duplicate {what} {name!r} ({key})")
                seen.add(name)
        return self


def _where(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(file)"


def parse_config(data: dict[str, Any], source: str = "COWRITE_CONFIG") -> CowriteConfig:
    """Validate parsed TOML; raise ConfigError with one line naming `source` and the key."""
    try:
        return CowriteConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False, include_input=False, include_context=False):
            where = _where(error["loc"])
            if error["type"] == "extra_forbidden":
                problems.append(f"unknown key {where}")
            else:  # pydantic's "Value error, " prefix says nothing to the operator
                message = str(error["msg"]).removeprefix("Value error, ")
                problems.append(message if where == "(file)" else f"{where}: {message}")
        raise ConfigError(f"{source}: {'; '.join(problems)}") from None


def load_config(path: Path) -> CowriteConfig:
    """Read and validate the tool file named by COWRITE_CONFIG."""
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"COWRITE_CONFIG {path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"COWRITE_CONFIG {path}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"COWRITE_CONFIG {path}: not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"COWRITE_CONFIG {path}: not valid TOML (not UTF-8)") from None
    except RecursionError:  # `x = [[[...]]]`: a traceback and exit 1, not one line
        raise ConfigError(f"COWRITE_CONFIG {path}: not valid TOML (nested too deeply)") from None
    return parse_config(data, f"COWRITE_CONFIG {path}")
