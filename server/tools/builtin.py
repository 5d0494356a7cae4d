"""Built-in server tools: ordinary Python tools that cowrite ships and loads by default.

They are loaded like any `[[tools]]` entry (by import string, schema from
type hints) and reported with `source: "builtin"`. A `[[tools]]` entry whose
`import` names one of them configures it instead of adding a duplicate, so
`enabled = false` there switches it off.
"""

import re
from typing import Annotated, Any

from pydantic import Field

BUILTIN_IMPORTS: tuple[str, ...] = ("server.tools.builtin:text_stats",)

_SENTENCE_END = re.compile(r"[.!?]+(?:\s|$)")


async def text_stats(text: Annotated[str, Field(description="The text to measure.")]
                     ) -> dict[str, Any]:
    """Count characters, words, sentences, lines and paragraphs of a text and estimate its
    reading time. Use it instead of counting yourself, e.g. to meet a length limit."""
    words = len(text.split())
    return {
        "characters": len(text),
        "words": words,
        "sentences": len(_SENTENCE_END.findall(text)) or (1 if text.strip() else 0),
        "lines": text.count("\n") + 1 if text else 0,
        "paragraphs": len([p for p in re.split(r"\n\s*\n", text) if p.strip()]),
        "reading_time_s": round(words / 238 * 60),
    }
