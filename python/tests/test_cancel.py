"""Cancellation is honest: the only way to end a loop is to stop its run
(protocol §6), so a cancelled reader, or an ``async with`` left early, stops
the run on the wire, and a new run works at once."""

from __future__ import annotations

import asyncio

import pytest

import runloop
from conftest import Server

# 26 chunks 200 ms apart: a loop that is still going when the test acts.
SLOW = "demo:pace=200 Count the words in this sentence"




async def wait_for_figure(server: Server, name: str, labels: str, wanted: float) -> None:
    deadline = asyncio.get_running_loop().time() + 5
    while server.metric(name, labels) != wanted:
        assert asyncio.get_running_loop().time() < deadline, f"{name}{{{labels}}} never became {wanted}"
        await asyncio.sleep(0.02)


async def a_new_loop_works_at_once(client: runloop.Client) -> None:
    began = asyncio.get_running_loop().time()
    run = await client.start("demo", memory="64M")
    async with run.loop("demo:pace=0 again") as stream:
        async for _ in stream:
            pass
    assert stream.outcome.kind == "finished"
    assert asyncio.get_running_loop().time() - began < 2
    await run.stop()


async def test_cancelling_the_reading_task_stops_the_run(fresh_server: Server) -> None:
    async with runloop.connect(fresh_server.url, token=fresh_server.token) as client:
        run = await client.start("demo", memory="64M")
        first = asyncio.Event()

        async def reader() -> None:
            async with run.loop(SLOW) as stream:
                async for _ in stream:
                    first.set()

        task = asyncio.create_task(reader())
        await first.wait()
        assert fresh_server.metric("runloop_loops_open") == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The run says so at once, and refuses a loop at once.
        assert run.ended
        with pytest.raises(runloop.RunEnded):
            run.loop("another")
        # The stop went on the wire: the server finished the run's scope...
        await asyncio.wait_for(run.wait_ended(), 2)
        # ...and ended the run and its loop (the agent's loop is over).
        await wait_for_figure(fresh_server, "runloop_runs_ended_total", 'reason="stop"', 1)
        await wait_for_figure(fresh_server, "runloop_loops_open", "", 0)
        assert fresh_server.metric("runloop_runs_open") == 0
        await a_new_loop_works_at_once(client)


async def test_leaving_the_stream_early_stops_the_run(fresh_server: Server) -> None:
    async with runloop.connect(fresh_server.url, token=fresh_server.token) as client:
        run = await client.start("demo", memory="64M")
        async with run.loop(SLOW) as stream:
            async for _ in stream:
                break
        # No outcome: the loop was left before its end.
        assert not stream.ended
        with pytest.raises(runloop.NotEnded):
            stream.outcome
        assert run.ended
        with pytest.raises(runloop.RunEnded):
            run.loop("another")
        await asyncio.wait_for(run.wait_ended(), 2)
        await wait_for_figure(fresh_server, "runloop_runs_ended_total", 'reason="stop"', 1)
        await a_new_loop_works_at_once(client)


async def test_a_timeout_around_the_loop_stops_the_run(fresh_server: Server) -> None:
    async with runloop.connect(fresh_server.url, token=fresh_server.token) as client:
        run = await client.start("demo", memory="64M")

        async def everything() -> None:
            async for _ in run.loop(SLOW):
                pass

        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(everything(), 0.5)
        assert run.ended
        await asyncio.wait_for(run.wait_ended(), 2)
        await a_new_loop_works_at_once(client)


async def test_two_hundred_loops_at_once_in_one_event_loop(server: Server) -> None:
    async with runloop.connect(server.url, token=server.token) as client:
        # Started a few at a time (each start deploys a demo agent and
        # registers it), then every loop runs at once.
        gate = asyncio.Semaphore(16)

        async def start() -> runloop.Run:
            async with gate:
                return await client.start("demo", memory="16M")

        runs = await asyncio.gather(*(start() for _ in range(200)))
        assert len({run.id for run in runs}) == 200

        async def one(index: int, run: runloop.Run) -> tuple[int, str, str]:
            text = ""
            async with run.loop(f"loop number {index}") as stream:
                async for event in stream:
                    if isinstance(event, runloop.Chunk) and event.kind == "assistant_text_content":
                        text += event.text or ""
            return index, stream.outcome.kind, text

        results = await asyncio.gather(*(one(i, run) for i, run in enumerate(runs)))
        for index, kind, text in results:
            assert kind == "finished"
            assert f'"loop number {index}"' in text
        await asyncio.gather(*(run.stop() for run in runs))
        assert all(run.ended for run in runs)
