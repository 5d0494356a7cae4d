"""Python server tools for the tests, loaded by import string like an operator's module."""

import asyncio
import socket
from typing import Annotated, Any, Optional

from pydantic import BaseModel, Field

from server.tools import ToolContext, ToolError

# The tests register a queue under a key before calling `sleepy`; it reports there.
OBSERVERS: dict[str, "asyncio.Queue[str]"] = {}


class Greeting(BaseModel):
    text: str
    shout: bool


async def greet(
    name: Annotated[str, Field(description="Who to greet.", min_length=1)],
    ctx: ToolContext,
    times: int = 1,
    shout: bool = False,
) -> Greeting:
    """Greet someone by name."""
    ctx.logger.info("greeting %s", name)
    text = " ".join([f"hello {name} from {ctx.user_id} on {ctx.document_id}"] * times)
    return Greeting(text=text.upper() if shout else text, shout=shout)


async def refuse(reason: str) -> str:
    """Always refuses, telling the model why."""
    raise ToolError(f"refused: {reason}")


async def explode() -> str:
    """Fails with an unexpected error."""
    raise RuntimeError("secret-database-password-hunter2")


async def sleepy(key: str, seconds: float) -> str:
    """Sleeps; reports start and cancellation to OBSERVERS[key]."""
    queue = OBSERVERS[key]
    queue.put_nowait("started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        queue.put_nowait("cancelled")
        raise
    queue.put_nowait("finished")
    return "awake"


async def beyond_json() -> int:
    """Returns an integer JSON cannot carry to every client (over 64 bits)."""
    return 2**70


def not_async(text: str) -> str:
    """A plain function: refused."""
    return text


async def no_hints(text):  # type: ignore[no-untyped-def]
    """A parameter without a type hint: refused."""
    return text


async def unschemable(sock: socket.socket) -> str:
    """A parameter type with no JSON Schema: refused."""
    return "never"


def _note_start(marker: str) -> int:
    """Append "start" to the file `marker`; how many starts it holds now."""
    with open(marker, "a") as f:
        f.write("start\n")
    with open(marker) as f:
        return f.read().split().count("start")


def _note_end(marker: str) -> None:
    with open(marker, "a") as f:
        f.write("end\n")


async def wait_once(marker: str) -> str:
    """Notes each start in the file `marker`; the first call waits a minute (time to
    kill its server mid-call), a later one returns at once. Not idempotent."""
    starts = _note_start(marker)
    if starts == 1:
        await asyncio.sleep(60)
    _note_end(marker)
    return f"done after {starts} starts"


async def wait_again(marker: str) -> str:
    """As `wait_once`; the tests' config declares this one idempotent."""
    return await wait_once(marker)


async def exits() -> str:
    """Calls sys.exit, as a command-line library might."""
    raise SystemExit(1)


class LibraryAbort(BaseException):
    """A library's own BaseException (gevent's Timeout, pytest's Failed): neither an
    Exception nor a cancel."""


async def aborts() -> str:
    raise LibraryAbort("secret detail")


async def nested(depth: int) -> Any:
    """An output `depth` levels deep."""
    output: Any = "bottom"
    for _ in range(depth):
        output = [output]
    return output


async def inner_cancelled() -> str:
    """An operation inside the tool was cancelled (not the tool): its CancelledError."""
    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    future.cancel()
    return await future


async def stubborn(key: str, seconds: float) -> str:
    """Ignores cancellation until `seconds` have passed, as some libraries do; reports
    to OBSERVERS[key] when it is asked to stop and when it ends."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        try:
            await asyncio.sleep(end - loop.time())
        except asyncio.CancelledError:
            OBSERVERS[key].put_nowait("ignored a cancel")
    OBSERVERS[key].put_nowait("ended")
    return "finally"


async def wraps(reason: str) -> str:
    """Wraps a library's exception in ToolError, as tool authors do; a long reason makes
    a long message."""
    try:
        raise ConnectionError(reason)
    except ConnectionError as exc:
        raise ToolError(exc) from exc  # type: ignore[arg-type]


async def stubborn_then_fails(key: str, seconds: float) -> str:
    """As `stubborn`, then raises: its exception must still be retrieved."""
    await stubborn(key, seconds)
    raise RuntimeError("failed after ignoring its cancellation")


async def underscored(text: str, _trace: bool = False) -> str:
    """A parameter pydantic would drop (underscore): refused, not offered without it."""
    return text


async def configured(model_config: str) -> str:
    """A parameter named like pydantic's own attribute: refused."""
    return model_config


async def shadowing(json: int, copy: str = "c") -> str:
    """Parameters named like BaseModel methods still work."""
    return f"{json} {copy}"


async def maybe_context(text: str, ctx: ToolContext | None = None) -> str:
    """An optional context is still the context."""
    return f"{text} for {ctx.user_id if ctx else 'nobody'}"


async def maybe_context_old_style(text: str, ctx: Optional[ToolContext] = None) -> str:  # noqa: UP045
    """As `maybe_context`, spelled with typing.Optional."""
    return f"{text} for {ctx.user_id if ctx else 'nobody'}"
