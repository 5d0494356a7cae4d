"""What a start-up that cannot go on prints: one line per problem, never a traceback and
never a value from the environment (pydantic's own message quoted the whole settings
dict, the start of the JWT secret and an `OPENAI_API_KEY` included)."""

from collections.abc import Iterator

from pydantic import ValidationError

from server.settings import Settings


class StartupError(RuntimeError):
    """A start-up that cannot go on (an optional package missing, say), in one line that
    names the variable and what to do; `python -m server` prints it and exits 2."""


def _variable(field: object) -> str:
    """The environment variable behind a settings field (`port` -> `COWRITE_PORT`)."""
    if field == "openai_api_key":
        return "OPENAI_API_KEY"
    if isinstance(field, str) and field in Settings.model_fields:
        return f"COWRITE_{field.upper()}"
    return str(field)


def settings_problems(error: ValidationError) -> Iterator[str]:
    for problem in error.errors(include_input=False, include_url=False):
        message = str(problem["msg"]).removeprefix("Value error, ")
        location = problem["loc"]
        yield f"{_variable(location[0])}: {message}" if location else message
