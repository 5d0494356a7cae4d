"""The typed JavaScript client: generated declarations current, a typed usage
example that compiles (and whose deliberate mistakes do not), and the package
importable by name.

Needs node and the npm packages of tests/node (`make node-deps`, which
`make test` runs). In CI a missing one fails; elsewhere these tests skip.
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import TypedDict

import pytest

ROOT = Path(__file__).resolve().parent.parent
NODE_DIR = ROOT / "tests" / "node"
STATIC = ROOT / "static"
TSC = NODE_DIR / "node_modules" / ".bin" / "tsc"


def _node() -> str:
    node = shutil.which("node")
    missing = node is None or not TSC.exists() or not (
        NODE_DIR / "node_modules" / "json-schema-to-typescript").exists()
    if missing and os.environ.get("CI") == "true":
        pytest.fail("node and tests/node's npm packages are required in CI (make node-deps)")
    if missing or node is None:
        pytest.skip("node or tests/node/node_modules missing: run `make node-deps`")
    return node


def _run(*args: str, cwd: Path = NODE_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120,
                          check=False)


def test_protocol_declarations_match_the_schema(tmp_path: Path) -> None:
    node = _node()
    result = _run(node, str(NODE_DIR / "gen-types.mjs"), "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    fresh = (tmp_path / "protocol.d.ts").read_text()
    assert "export type ServerEvent" in fresh and "export interface ToolCallEvent" in fresh
    assert (STATIC / "protocol.d.ts").read_text() == fresh, (
        "static/protocol.d.ts is out of date with protocol/schema.json: run `make docs`")


@pytest.mark.parametrize("config", ["tsconfig.json", "tsconfig.node16.json"])
def test_typed_usage_compiles_and_its_mistakes_do_not(config: str) -> None:
    _node()
    result = _run(str(TSC), "-p", config)
    assert result.returncode == 0, result.stdout + result.stderr
    usage = (NODE_DIR / "typed-usage.ts").read_text()
    assert usage.count("@ts-expect-error") >= 10, "the example must keep proving mistakes fail"


def test_typed_usage_fails_on_a_wrong_type(tmp_path: Path) -> None:
    """The check can fail: the same example with one wrong annotation does not compile."""
    _node()
    usage = (NODE_DIR / "typed-usage.ts").read_text()
    wrong = usage.replace("const piece: string = event.detail.delta;",
                          "const piece: number = event.detail.delta;")
    assert wrong != usage
    (tmp_path / "wrong-usage.ts").write_text(wrong)
    config = tmp_path / "tsconfig.json"
    config.write_text(json.dumps({
        "extends": str(NODE_DIR / "tsconfig.json"),
        "compilerOptions": {"paths": {"@cowrite/client": [str(STATIC / "client.d.ts")]}},
        "files": ["wrong-usage.ts"],
    }))
    result = _run(str(TSC), "-p", str(config))
    assert result.returncode != 0
    assert "Type 'string' is not assignable to type 'number'" in result.stdout


class Runtime(TypedDict):
    exports: list[str]
    methods: list[str]
    close: dict[str, int]


def _runtime_exports(node: str) -> Runtime:
    script = """
    import * as client from "@cowrite/client";
    const methods = Object.getOwnPropertyNames(client.CowriteClient.prototype)
      .filter((name) => name !== "constructor");
    console.log(JSON.stringify({ exports: Object.keys(client), methods, close: client.CLOSE }));
    """
    result = _run(node, "--input-type=module", "-e", script)
    assert result.returncode == 0, result.stderr
    found: Runtime = json.loads(result.stdout)
    return found


def test_package_is_importable_by_name_and_declarations_cover_it() -> None:
    node = _node()
    package = json.loads((STATIC / "package.json").read_text())
    entry = package["exports"]["."]
    assert package["type"] == "module"
    assert (STATIC / entry["types"]).exists() and (STATIC / entry["default"]).exists()
    runtime = _runtime_exports(node)

    declarations = (STATIC / "client.d.ts").read_text()
    declared = set(re.findall(r"^export declare (?:const|function|class) (\w+)",
                              declarations, flags=re.MULTILINE))
    assert declared == set(runtime["exports"]), (
        "static/client.d.ts must declare exactly what static/client.js exports")

    body = declarations.split("export declare class CowriteClient", 1)[1]
    methods = set(re.findall(r"^  (\w+)(?:<.*>)?\(", body, flags=re.MULTILINE))
    methods -= {"constructor", "addEventListener", "removeEventListener"}
    assert methods == set(runtime["methods"]), (
        "static/client.d.ts must declare every public method of CowriteClient")

    close_codes = dict(re.findall(r"readonly (\w+): (\d+);", declarations))
    assert {name: int(code) for name, code in close_codes.items()} == runtime["close"]
