"""The shared corpus (corpus/ at the repository's root), read by this package.

Each capture is played by ``runloop __replay`` over a real socket, and what
the package makes of it is held to the case's expectations: the same files
the Rust client (crates/runloop-cli/tests/it/corpus.rs) and the TypeScript
package (typescript/test/corpus.test.ts) are held to, so the three clients
cannot drift apart.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

import runloop
from conftest import ROOT, runloop_binary

CORPUS = ROOT / "corpus"
CASES = sorted(path.stem for path in CORPUS.glob("*.json"))


def without_nulls(value: Any) -> Any:
    """Object members whose value is null removed, everywhere: an absent
    optional member and a null one mean the same (protocol §8)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


@pytest.fixture(scope="module")
def replay() -> Iterator[str]:
    child = subprocess.Popen(
        [str(runloop_binary()), "__replay", str(CORPUS)], stdout=subprocess.PIPE, stderr=sys.stderr, text=True
    )
    assert child.stdout is not None
    url = child.stdout.readline().strip()
    assert url.startswith("ws://"), url
    yield url
    child.kill()
    child.wait()


def test_the_corpus_has_its_cases() -> None:
    assert len(CASES) >= 40, CASES


@pytest.mark.parametrize("name", CASES)
async def test_corpus(replay: str, name: str) -> None:
    expected = json.loads((CORPUS / f"{name}.json").read_text())
    async with runloop.connect(f"{replay}/{name}") as client:
        if "start" in expected:
            if "refused" in expected["start"]:
                with pytest.raises(runloop.RunRefused) as refused:
                    await client.start("demo")
                assert refused.value.error == expected["start"]["refused"]
            else:
                with pytest.raises(runloop.RunNotServed):
                    await client.start("demo")
            return
        run = await client.start("demo")
        events: list[runloop.Event] = []
        async with run.loop(expected.get("prompt", "hi")) as stream:
            async for event in stream:
                events.append(event)
        outcome = stream.outcome
        assert outcome is not None
        got = [{"chunk": e.json} if isinstance(e, runloop.Chunk) else {"error": e.value} for e in events]
        assert got == expected["events"]
        wanted = expected["outcome"]
        assert outcome.kind == wanted["kind"], outcome
        assert outcome.fatal == wanted["fatal"]
        assert outcome.error == wanted["error"]
        assert outcome.ok == (wanted["kind"] == "finished" and not wanted["fatal"])
        if wanted["reason"] is None:
            assert outcome.reason is None
        else:
            assert outcome.reason is not None and outcome.reason.startswith(wanted["reason"]), outcome.reason
        transcript = [json.loads(chunk.json) for chunk in stream.transcript()]
        assert without_nulls(transcript) == without_nulls(expected["transcript"])
        if not run.ended:
            await run.stop()


def test_the_corpus_is_what_its_writer_writes(tmp_path: Path) -> None:
    """corpus/write.py and the files it wrote are in step."""
    source = (CORPUS / "write.py").read_text()
    copy = tmp_path / "write.py"
    copy.write_text(source)
    subprocess.run([sys.executable, str(copy)], check=True, capture_output=True)
    for path in sorted(CORPUS.glob("*.txt")) + sorted(CORPUS.glob("*.json")):
        assert (tmp_path / path.name).read_text() == path.read_text(), path.name
