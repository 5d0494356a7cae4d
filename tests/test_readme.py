"""README.md stays true: every setting is documented, and the two commands are there."""

import re
from pathlib import Path

from server.settings import Settings

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_setting_is_in_the_configuration_table() -> None:
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", README, flags=re.MULTILINE))
    expected = {
        "OPENAI_API_KEY" if name == "openai_api_key" else f"COWRITE_{name.upper()}"
        for name in Settings.model_fields
    }
    assert expected - documented == set(), "undocumented settings"
    assert documented - expected == set(), "documented settings that do not exist"


def test_quick_start_commands() -> None:
    assert "make run" in README and "make test" in README


def test_the_tool_config_example_is_valid() -> None:
    import tomllib

    from server.tools.config import parse_config

    section = README.split("## Server tools and MCP servers", 1)[1]
    example = section.split("```toml\n", 1)[1].split("```", 1)[0]
    config = parse_config(tomllib.loads(example))
    assert [m.name for m in config.mcp] == ["notes", "files"]
    assert [w.name for w in config.workflows] == ["proofread"]


def _code_lines(text: str) -> list[str]:
    """Lines of Python without their trailing comments (README's snippet annotates)."""
    return [line for line in (re.sub(r"  # .*$", "", raw).rstrip() for raw in text.splitlines())
            if line]


def test_the_tools_module_snippet_is_the_example_file() -> None:
    """Every line of README's `examples/tools.py` snippet is a line of that file: a reader
    comparing the two found both the schema limits and the error text had drifted."""
    snippet = README.split("A tools module (`examples/tools.py`", 1)[1]
    snippet = snippet.split("```python\n", 1)[1].split("```", 1)[0]
    source = (Path(__file__).resolve().parent.parent / "examples" / "tools.py").read_text()
    missing = [line for line in _code_lines(snippet) if line not in _code_lines(source)]
    assert missing == []
