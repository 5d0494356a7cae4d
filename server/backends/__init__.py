"""Where document logs, history, run records and shared limits live."""

from server.backends.base import Backend, LoggedEvent, LogHead, ResumeFailure
from server.backends.memory import MemoryBackend

__all__ = ["Backend", "LogHead", "LoggedEvent", "MemoryBackend", "ResumeFailure"]
