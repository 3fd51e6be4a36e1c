"""Every ending of the demo's loops, as the package reports it, and the
chunks byte for byte as ``runloop run --json`` prints them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

import pytest

import runloop
from conftest import TOKEN, Server, runloop_binary

PROMPT = "Count the words in this sentence"


async def read(server: Server, prompt: str) -> tuple[list[runloop.Event], runloop.Outcome, list[runloop.Chunk]]:
    async with runloop.connect(server.url, token=server.token) as client:
        run = await client.start("demo", memory="64M")
        events: list[runloop.Event] = []
        async with run.loop(prompt) as stream:
            async for event in stream:
                events.append(event)
        transcript = stream.transcript()
        await run.stop()
        assert run.ended
        return events, stream.outcome, transcript


async def test_a_plain_prompt_finishes(server: Server) -> None:
    events, outcome, transcript = await read(server, PROMPT)
    assert outcome.kind == "finished"
    assert outcome.ok and not outcome.fatal
    assert outcome.error is None and outcome.reason is None
    assert all(isinstance(event, runloop.Chunk) for event in events)
    chunks = [event for event in events if isinstance(event, runloop.Chunk)]
    kinds = [chunk.kind for chunk in chunks]
    assert "assistant_tool_call" in kinds and kinds[-1] == "usage"
    text = "".join(c.text or "" for c in chunks if c.kind == "assistant_text_content")
    assert "6 words" in text
    # The typed accessors read what json.loads reads.
    for chunk in chunks:
        assert chunk.data == json.loads(chunk.json)
        assert chunk.data["type"] == chunk.kind
        if chunk.kind == "assistant_tool_call":
            assert chunk.id == chunk.data["id"] and chunk.name == chunk.data["name"]
        if chunk.kind == "usage":
            assert chunk.usage == (
                chunk.data["completion_tokens"],
                chunk.data["prompt_tokens"],
                chunk.data["total_tokens"],
            )
    # The transcript coalesces (protocol §11): one text, one call.
    coalesced = [c.kind for c in transcript]
    assert coalesced.count("assistant_text_content") == 1
    assert coalesced.count("assistant_tool_call") == 1
    whole = next(c for c in transcript if c.kind == "assistant_text_content")
    assert whole.text == text
    call = next(c for c in transcript if c.kind == "assistant_tool_call")
    assert json.loads(call.arguments or "") == {"text": PROMPT}


async def test_demo_fatal_finishes_but_fails(server: Server) -> None:
    events, outcome, _ = await read(server, "please demo:fatal")
    assert outcome.kind == "finished"
    assert outcome.fatal and not outcome.ok
    last = events[-1]
    assert isinstance(last, runloop.Chunk) and last.kind == "notification"
    assert last.is_fatal
    assert last.message == {"kind": "demo", "error": "the demo agent was asked to fail (demo:fatal)"}


async def test_demo_break_is_unfinished_with_its_error_last(server: Server) -> None:
    events, outcome, _ = await read(server, "demo:break now")
    assert outcome.kind == "unfinished" and not outcome.ok
    assert any(isinstance(event, runloop.Chunk) for event in events)
    last = events[-1]
    assert isinstance(last, runloop.Error)
    assert last.value == outcome.error
    assert json.loads(last.json) == outcome.error
    assert "broke" in str(outcome.error)


@pytest.mark.parametrize("prompt", ["demo:refuse", "demo:refuse-text"])
async def test_demo_refuse_is_no_loop(server: Server, prompt: str) -> None:
    events, outcome, transcript = await read(server, prompt)
    assert outcome.kind == "no_loop" and not outcome.ok
    assert len(events) == 1 and isinstance(events[0], runloop.Error)
    assert events[0].value == outcome.error
    assert transcript == []


async def test_a_connection_that_dies_mid_loop_is_broken_not_finished(fresh_server: Server) -> None:
    async with runloop.connect(fresh_server.url, token=fresh_server.token) as client:
        run = await client.start("demo", memory="64M")
        async with run.loop("demo:pace=100 " + PROMPT) as stream:
            async for event in stream:
                assert isinstance(event, runloop.Chunk)
                fresh_server.kill()
        assert stream.outcome.kind == "broken"
        assert stream.outcome.reason == "the connection ended before the channel's finish"
        assert not stream.outcome.ok


@pytest.mark.parametrize("prompt", [PROMPT, "demo:fatal", "demo:break", "demo:refuse"])
async def test_chunks_are_byte_identical_to_runloop_run_json(server: Server, prompt: str) -> None:
    events, outcome, _ = await read(server, prompt)
    printed = subprocess.run(
        [str(runloop_binary()), "run", "--url", server.url, "--memory", "64M", "--json", prompt],
        env=dict(os.environ, RUNLOOP_TOKEN=TOKEN),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.splitlines()
    chunk_lines = [line for line in printed if line.startswith('{"chunk":')]
    ours = [event.json for event in events if isinstance(event, runloop.Chunk)]
    # `{"chunk":<the chunk's JSON as it came>}`
    assert [line[len('{"chunk":') : -1] for line in chunk_lines] == ours
    errors = [json.loads(line)["error"] for line in printed if line.startswith('{"error":')]
    assert errors == [event.value for event in events if isinstance(event, runloop.Error)]
    ending = json.loads(printed[-1])
    assert ending["outcome"] == outcome.kind
    assert ending.get("fatal", False) == outcome.fatal


async def test_a_long_loop_s_transcript_holds_every_chunk_handed_over(server: Server) -> None:
    # More chunks than the package leaves out of the transcript until
    # Python has let them go (two batches): the transcript is still every
    # chunk handed over, whether the caller keeps the chunks or not.
    count = 5 * runloop._native.BATCH
    for keep in (True, False):
        async with runloop.connect(server.url, token=server.token) as client:
            run = await client.start("demo", memory="64M")
            kept: list[runloop.Event] = []
            text = ""
            async with run.loop(f"demo:load={count}x16") as stream:
                async for event in stream:
                    assert isinstance(event, runloop.Chunk) and event.text is not None
                    text += event.text
                    if keep:
                        kept.append(event)
                    if len(text) == 16 * count // 2:
                        # Mid-loop, with the next events made ready
                        # meanwhile: every chunk handed to Python so far
                        # (the batch it holds), none of those not yet.
                        await asyncio.sleep(0.2)
                        held = stream._batch[stream._at :]
                        ahead = "".join(c.text or "" for c in held if isinstance(c, runloop.Chunk))
                        (middle,) = stream.transcript()
                        assert middle.text == text + ahead
            (whole,) = stream.transcript()
            await run.stop()
        assert whole.kind == "assistant_text_content"
        assert whole.text == text and len(text) == 16 * count
        assert len(kept) == (count if keep else 0)
