"""A takeover finds the text an interrupted message sent however far back it is
(PROTOCOL.md section 13), with real redis-server, real server processes and a
real (fake) OpenAI stream.

The model stalls after a few words; meanwhile people keep editing the document
(`on_edit: continue`), so thousands of `document.changed` follow the message's
deltas in the log. Then the owner dies. The survivor makes the model call
again under a new message id, and must log `message.discarded` for the cut
message first: without it a frontend keeps both texts. It used to look for the
deltas among the log's last 2,000 events only, and found none. The reading
back itself, case by case: tests/test_takeover_streamed.py."""

import asyncio

import pytest

from tests.cluster_support import FAST_LEASE, cluster, ended, join, killed
from tests.fake_openai import Reply, running_fake_openai
from tests.runs import of_run

pytestmark = pytest.mark.redis
TAKEOVER_S = 15  # the lease (1 s) + a janitor tick, on a loaded 2-core machine
EDITS = 2500  # more than the window the takeover used to search (2,000 events)


def last_edit(event: dict[str, object]) -> bool:
    return event.get("type") == "document.changed" and event.get("document_version") == EDITS


def transcript(events: list[dict[str, object]], run_id: str) -> dict[str, str]:
    """What a frontend shows of the run's messages: deltas joined per message, the
    discarded ones removed (docs/client.md)."""
    shown: dict[str, str] = {}
    for event in of_run(events, run_id):
        if event["type"] == "message.delta":
            key = str(event["message_id"])
            shown[key] = shown.get(key, "") + str(event["delta"])
        elif event["type"] == "message.discarded":
            shown.pop(str(event["message_id"]), None)
    return shown


async def test_text_sent_before_thousands_of_later_events_is_discarded() -> None:
    async with running_fake_openai() as fake:
        fake.replies = [Reply(text=["Hello ", "world"], stall_after_text=True),
                        Reply(text=["Again."])]
        env = {**FAST_LEASE, "COWRITE_LLM": "openai", "COWRITE_OPENAI_API_KEY": "sk-test",
               "COWRITE_OPENAI_BASE_URL": fake.base_url,
               "COWRITE_OPENAI_WARMUP_TIMEOUT_S": "0"}
        async with cluster(env=env) as (_, (one, two)), \
                join(two, sub="bob", client_id="watch") as (watcher, _):
            async with join(one) as (tab, _), join(one, client_id="editor") as (editor, _):
                await tab.send({"type": "run.start", "id": "s", "run_id": "far-1",
                                "prompt": "say hello", "tools": [],
                                "options": {"on_edit": "continue"}})
                ack = await tab.recv_until(lambda e: e.get("reply_to") == "s")
                assert ack["type"] == "ack", ack
                await asyncio.wait_for(fake.stalled.wait(), TAKEOVER_S)
                said = ""
                while said != "Hello world":  # the model stalls after these words
                    said += (await watcher.recv_until("message.delta"))["delta"]
                for version in range(1, EDITS + 1):  # people go on editing meanwhile
                    await editor.send({"type": "editor.change", "document_version": version})
                for client in (watcher, tab, editor):  # all logged; none left unread
                    await client.recv_until(last_edit, timeout=120)
                await killed(one)
            resumed = await watcher.recv_until("run.resumed", timeout=TAKEOVER_S)
            assert (resumed["run_id"], resumed["reason"]) == ("far-1", "owner_lost")
            done = await watcher.recv_until("message.done", timeout=TAKEOVER_S)
            finished = await watcher.recv_until(ended("far-1"), timeout=TAKEOVER_S)
        assert finished["status"] == "completed", finished
        assert done["text"] == "Again." and done["message_id"] != "far-1:m1"
        discarded = of_run(watcher.events, "far-1", "message.discarded")
        assert [e["message_id"] for e in discarded] == ["far-1:m1"], \
            f"the cut text stays next to the new one: {transcript(watcher.events, 'far-1')}"
        assert discarded[0]["seq"] > resumed["seq"]
        assert transcript(watcher.events, "far-1") == {done["message_id"]: "Again."}

