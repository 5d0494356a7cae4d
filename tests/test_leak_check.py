"""tests/leaks.py: a test that leaves a socket or a stream open fails itself, at its
teardown; one that leaks an object something else still holds fails nobody (it is listed
in the run's summary). Run in a pytest of their own, under the suite's settings."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LEAKY_TESTS = '''
import asyncio
import socket

HELD = []


def test_leaves_a_socket_in_a_cycle():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    box = {"sock": sock}
    box["box"] = box  # garbage only the collector finds: when it next runs


def test_clean():
    pass


async def test_leaves_a_connection_to_its_loop():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    connected = asyncio.Event()

    async def pipe():
        reader, _ = await asyncio.open_connection("127.0.0.1", port)
        connected.set()
        await reader.read()

    pending = asyncio.get_running_loop().create_task(pipe())  # cancelled with the loop
    await connected.wait()
    server.close()
    assert not pending.done()


def test_hands_a_socket_to_a_module_list():
    sock = socket.socket()
    box = {"sock": sock}
    box["box"] = box
    HELD.append(box)


def test_drops_the_module_list():
    HELD.clear()


def test_clean_again():
    pass
'''


def test_a_leak_fails_the_test_that_leaked_it_and_no_other(tmp_path: Path) -> None:
    (tmp_path / "test_leaky.py").write_text(LEAKY_TESTS)
    (tmp_path / "pytest.ini").write_text(textwrap.dedent("""\
        [pytest]
        asyncio_mode = auto
        asyncio_default_fixture_loop_scope = function
        filterwarnings = error
        """))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.leaks", "-p", "no:cacheprovider",
         "-p", "no:randomly", "-rA", "test_leaky.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    results = {line.split()[1].split("::")[1]: line.split()[0] for line in out.splitlines()
               if line.startswith(("PASSED ", "ERROR ", "FAILED "))}
    assert results.pop("test_leaves_a_socket_in_a_cycle") == "ERROR", out
    assert results.pop("test_leaves_a_connection_to_its_loop") == "ERROR", out
    assert set(results.values()) == {"PASSED"}, out  # in particular, the tests after each
    assert "ERROR at teardown of test_leaves_a_socket_in_a_cycle" in out
    assert "left 1 resource(s) open:\n  ResourceWarning: unclosed <socket.socket" in out
    assert "resources leaked by tests that cannot be named" in out
    late = out.split("resources leaked by tests that cannot be named")[1]
    assert "(swept at the end of the run) ResourceWarning: unclosed <socket.socket" in late
