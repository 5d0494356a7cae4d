"""The objects one app instance is made of, built once and injected."""

from dataclasses import dataclass

from server.agent.environment import RunEnvironment
from server.agent.remote import RunRouter
from server.auth import Authenticator
from server.backends.base import Backend
from server.observability import Metrics
from server.session_hub import SessionHub
from server.settings import Settings


@dataclass
class Services:
    settings: Settings
    backend: Backend
    auth: Authenticator
    metrics: Metrics
    hub: SessionHub
    runs: RunEnvironment
    router: RunRouter
    instance_id: str
    draining: bool = False
