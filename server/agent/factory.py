"""Which model a server uses, from its settings."""

from server.agent.llm import LLM
from server.agent.openai_chat import OpenAIChat
from server.agent.scripted import ScriptedLLM
from server.settings import Settings


def make_llm(settings: Settings) -> LLM:
    if settings.effective_llm == "openai":
        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else ""
        if not key and not settings.openai_base_url:
            raise ValueError("COWRITE_LLM=openai needs OPENAI_API_KEY or COWRITE_OPENAI_BASE_URL")
        return OpenAIChat(key or "not-needed", settings.openai_base_url,
                          settings.openai_timeout_s)
    return ScriptedLLM()
