"""The objects one app instance is made of, built once and injected."""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from server.agent.llm import LLM
from server.auth import Authenticator
from server.backends.base import Backend
from server.observability import Metrics
from server.session import SessionHub
from server.settings import Settings

if TYPE_CHECKING:
    from server.agent.remote import RunRouter


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
    router: "RunRouter" = field(init=False)  # needs the services itself: set by build_services
