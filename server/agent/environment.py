"""What every run of an instance shares: ports, the model, the machine, settings.

Built once per app (`server/app.py`) and handed to each document's run
coordinator, so the run engine depends on these Protocols and values rather
than on the app's other modules.
"""

from dataclasses import dataclass

from server.agent.llm import LLM
from server.agent.machine import RunMachine
from server.observability import Metrics
from server.ports import ClusterLink, RunRegistry, ServerTools
from server.settings import Settings


@dataclass
class RunEnvironment:
    settings: Settings
    registry: RunRegistry
    cluster: ClusterLink
    llm: LLM
    machine: RunMachine
    metrics: Metrics
    instance_id: str
    tools: ServerTools | None = None
    draining: bool = False  # shutting down: start nothing new (queued runs wait for others)

    @property
    def allowed_models(self) -> frozenset[str]:
        """`COWRITE_ALLOWED_MODELS` and always `COWRITE_MODEL` (a run that names no model
        uses it; naming it was refused when the list left it out)."""
        return frozenset([*self.settings.allowed_models, self.settings.model])
