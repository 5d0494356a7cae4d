"""The objects one app instance is made of, built once and injected."""

from dataclasses import dataclass, field
from typing import Any

from server.agent.llm import LLM
from server.auth import Authenticator
from server.backends.base import Backend
from server.observability import Metrics
from server.session import SessionHub
from server.settings import Settings


@dataclass
class Services:
    settings: Settings
    backend: Backend
    auth: Authenticator
    metrics: Metrics
    hub: SessionHub
    llm: LLM
    instance_id: str
    draining: bool = False
    router: Any = field(default=None)  # server.agent.remote.RunRouter, set by build_services
