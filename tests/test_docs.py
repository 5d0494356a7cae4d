"""docs/ stays true to the code: generated tables current, every example frame
valid, every code and setting it names real, every link resolvable inside the
repository. The fix for a failure is in its message (mostly `make docs`)."""

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from protocol.client import CLIENT_MESSAGE_TYPES
from protocol.codes import CloseCode, ErrorCode
from protocol.parsing import ParseFailure, validate_message
from protocol.reference import anchor, problems, render_blocks, render_type, shapes, splice
from protocol.schema import build_schema
from protocol.server import SERVER_EVENT_ADAPTER
from server.settings import Settings
from tests.harness import Server, joined

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PROTOCOL = DOCS / "protocol.md"
PLANNED = "## Version 1.1\n"
LINK = re.compile(r"\]\(([^)\s]+)\)")
SERVER_TYPES = set(build_schema()["properties"]["server_event"]["discriminator"]["mapping"])


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def test_generated_tables_are_current() -> None:
    text = PROTOCOL.read_text()
    blocks = render_blocks(build_schema())
    assert problems(text, blocks) == []
    assert splice(text, blocks) == text, (
        "docs/protocol.md's tables are out of date with protocol/*.py: run `make docs`")


def test_splice_replaces_only_generated_parts() -> None:
    text = ("prose\n<!-- BEGIN GENERATED: ping -->\nstale\n<!-- END GENERATED -->\nmore\n"
            "<!-- BEGIN GENERATED: nothing -->\nkept\n<!-- END GENERATED -->\n")
    blocks = {"ping": "| table |\n"}
    assert splice(text, blocks) == (
        "prose\n<!-- BEGIN GENERATED: ping -->\n\n| table |\n\n<!-- END GENERATED -->\nmore\n"
        "<!-- BEGIN GENERATED: nothing -->\nkept\n<!-- END GENERATED -->\n")
    assert problems(text, {**blocks, "pong": ""}) == [
        "no generated block for 'pong': add '<!-- BEGIN GENERATED: pong -->' / "
        "'<!-- END GENERATED -->'",
        "generated block 'nothing' matches no message or object",
    ]


def _anchors(path: Path) -> set[str]:
    return {anchor(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), flags=re.MULTILINE)}


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: p.name)
def test_links_resolve_inside_the_repository(path: Path) -> None:
    for target in LINK.findall(path.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        assert resolved.is_relative_to(ROOT), f"{path.name}: {target} points outside the repo"
        assert resolved.exists(), f"{path.name}: {target} does not exist"
        if fragment:
            assert fragment in _anchors(resolved), f"{path.name}: no heading for {target}"


def _example_blocks(text: str) -> Iterator[list[dict[str, Any]]]:
    for block in re.findall(r"```jsonc\n(.*?)```", text, flags=re.DOTALL):
        frames = []
        for line in block.splitlines():
            if line.strip() and not line.lstrip().startswith("//"):
                frames.append(json.loads(line))
        yield frames


def test_example_frames_are_valid_and_seq_is_gapless() -> None:
    blocks = list(_example_blocks(PROTOCOL.read_text()))
    assert len(blocks) >= 6
    seen_types: set[str] = set()
    for frames in blocks:
        expected: int | None = None
        resume_after: int | None = None
        tokens: dict[str, str] = {}
        for index, frame in enumerate(frames):
            kind = frame["type"]
            seen_types.add(kind)
            if kind in CLIENT_MESSAGE_TYPES or kind not in SERVER_TYPES:
                parsed = validate_message(frame)
                if isinstance(parsed, ParseFailure):  # a deliberate mistake: show its real answer
                    answer = frames[index + 1]
                    assert (answer["type"], answer["code"], answer["message"]) == (
                        "error", parsed.code.value, parsed.message), f"wrong answer to {frame}"
                    continue
            else:
                try:
                    SERVER_EVENT_ADAPTER.validate_python(frame)
                except ValidationError as exc:  # pragma: no cover - the message is the point
                    pytest.fail(f"example frame {frame} is invalid: {exc}")
            if kind == "hello":
                resume_after = frame.get("resume", {}).get("after_seq")
            elif kind == "welcome":
                expected = (resume_after if frame["resumed"] else frame["last_seq"])
                assert expected is not None
                expected += 1
            elif kind == "tool.call" and "token" in frame:
                tokens[frame["call_id"]] = frame["token"]
            elif kind == "tool.result" and frame["call_id"] in tokens:
                assert frame["token"] == tokens[frame["call_id"]], "a result needs its call's token"
            if kind in SERVER_TYPES and kind not in {"welcome", "ack", "error", "pong"}:
                assert "seq" in frame and "ts" in frame, f"durable event without seq: {frame}"
                if expected is not None:
                    assert frame["seq"] == expected, f"seq gap or repeat before {frame}"
                expected = frame["seq"] + 1
    assert {"hello", "welcome", "run.start", "message.delta", "tool.call", "tool.result",
            "approval.requested", "approval", "editor.change", "run.finished"} <= seen_types


def test_every_error_and_close_code_is_documented() -> None:
    text = PROTOCOL.read_text()
    for code in ErrorCode:
        assert re.search(rf"^\| `{code.value}` \|", text, flags=re.MULTILINE), (
            f"error code {code.value} missing from docs/protocol.md's error table")
    for close in CloseCode:
        assert re.search(rf"^\| {close.value} \|", text, flags=re.MULTILINE), (
            f"close code {close.value} missing from docs/protocol.md's close table")


def test_settings_named_by_the_docs_exist() -> None:
    known = {f"COWRITE_{name.upper()}" for name in Settings.model_fields}
    for path in DOCS.glob("*.md"):
        current = path.read_text().split(PLANNED, 1)[0]  # 1.1 names settings yet to come
        named = set(re.findall(r"COWRITE_[A-Z_]+", current))
        assert named - known == set(), f"{path.name} names settings that do not exist"


def test_client_guide_lists_every_event() -> None:
    guide = (DOCS / "client.md").read_text()
    for kind in sorted(SERVER_TYPES):
        assert f"`{kind}`" in guide, f"docs/client.md does not mention the {kind} event"


def _feature_table() -> dict[str, str]:
    planned = PROTOCOL.read_text().split(PLANNED, 1)[1]
    rows = re.findall(r"^\| `([a-z_]+)` \| [^|]+ \| (yes, with the Redis backend|yes|no|"
                      r"partly)[^|]*? \|$", planned,
                      flags=re.MULTILINE)
    return dict(rows)


async def test_feature_table_matches_what_the_server_announces(server: Server) -> None:
    """The 1.1 table says "yes" exactly for the features a (memory-backend) server lists in
    welcome.features; "yes, with the Redis backend" only for what Redis mode adds
    (`tests/test_durable_switch.py` checks that a Redis server announces it)."""
    table = _feature_table()
    assert len(table) == 11, "docs/protocol.md's 1.1 feature table lost rows"
    async with joined(server) as (_, welcome):
        announced = set(welcome.get("features", []))
    assert announced <= set(table), f"features missing from the docs table: {announced}"
    documented = {name for name, available in table.items() if available == "yes"}
    assert documented == announced, (
        "update the 'available' column of docs/protocol.md's Version 1.1 table")
    redis_only = {name for name, available in table.items()
                  if available == "yes, with the Redis backend"}
    assert redis_only == {"durable_runs"}


def test_enums_are_written_inline_and_objects_linked() -> None:
    defs = {
        "Small": {"type": "string", "enum": ["a", "b"]},
        "Big": {"type": "string", "enum": [f"code_{i}" for i in range(9)]},
        "Thing": {"type": "object", "properties": {"x": {"type": "integer"}}},
    }
    assert render_type({"$ref": "#/$defs/Small"}, defs) == '`"a"` or `"b"`'
    assert render_type({"$ref": "#/$defs/Big"}, defs) == "string (`Big`, see the description)"
    assert render_type({"anyOf": [{"$ref": "#/$defs/Thing"}, {"type": "null"}]}, defs) == (
        "[Thing](#thing)")
    schema = {
        "$defs": {**defs, "Msg": {"type": "object", "properties": {
            "type": {"const": "m"}, "code": {"$ref": "#/$defs/Big"},
            "thing": {"$ref": "#/$defs/Thing"}}}},
        "properties": {
            "client_message": {"discriminator": {"mapping": {"m": "#/$defs/Msg"}}},
            "server_event": {"discriminator": {"mapping": {}}},
        },
    }
    assert [shape.block for shape in shapes(schema)] == ["m", "Thing"]
