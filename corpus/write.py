#!/usr/bin/env python3
"""Writes the corpus: each case as a capture (NAME.txt) and what a client
must make of it (NAME.json). See README.md beside this file.

    python3 corpus/write.py          # rewrites every case from the table below

The captures are the input (the server's messages, and the client's that
the replay waits for); the expectations are written here by hand, from the
protocol, never taken from a client's output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
RUN_REQUEST = b'\x00{"image":{"server":{"name":"demo","digest":"sha256:' + b"0" * 64 + b'"}},"memory":1073741824,"disk":0,"agent":{}}'


def line(direction: str, kind: int, scope: int, channel: int, payload: bytes = b"", note: str = "") -> str:
    text = f"{direction} {kind:02x} {scope:08x} {channel:08x}"
    if payload:
        text += " " + payload.hex()
    return (f"# {note}\n" if note else "") + text


def raw(direction: str, message: bytes, note: str) -> str:
    return f"# {note}\n{direction} {message.hex()}"


AUTH = line(">", 0, 0, 0, b"\x00", "authorization, unbrokered, credential redacted to nothing")


def start(scope: int = 1) -> list[str]:
    return [
        line(">", 1, scope, 0, RUN_REQUEST, f"request: scope {scope}, containers::agents::run"),
        line("<", 2, scope, 0, b'\x00{"id":"r-1"}', "response: the container runs"),
    ]


def loop(prompt: str = "hi", scope: int = 1, channel: int = 1) -> str:
    body = json.dumps({"prompt": prompt}, separators=(",", ":")).encode()
    return line(">", 4, scope, channel, b"\x05" + body, f"channel request: channel {channel}, run-loop")


def chunk(text: str, scope: int = 1, channel: int = 1, note: str = "") -> str:
    return line("<", 5, scope, channel, b"\x00" + text.encode(), note or "channel response: a chunk")


def error(text: str, scope: int = 1, channel: int = 1, note: str = "") -> str:
    return line("<", 5, scope, channel, b"\x01" + text.encode(), note or "channel response: the error")


def payload(data: bytes, note: str, scope: int = 1, channel: int = 1) -> str:
    return line("<", 5, scope, channel, data, note)


def finish(scope: int = 1, channel: int = 1, note: str = "channel response finish") -> str:
    return line("<", 6, scope, channel, b"", note)


def stop(scope: int = 1, channel: int = 2) -> list[str]:
    return [
        line(">", 4, scope, channel, b"\x00", "the client stops the run (a stop gets no finish of its own)"),
        line("<", 3, scope, 0, b"", "response finish: the run has ended"),
    ]


def one_loop(*responses: str, prompt: str = "hi", end: Optional[list[str]] = None) -> list[str]:
    """A run on scope 1, one loop on channel 1 with `responses`, then the stop."""
    return [AUTH, *start(), loop(prompt), *responses, *(stop() if end is None else end)]


def outcome(kind: str, error: Any = None, fatal: bool = False, reason: Optional[str] = None) -> dict[str, Any]:
    return {"kind": kind, "fatal": fatal, "error": error, "reason": reason}


TEXT_HEL = '{"type":"assistant_text_content","text":"Hel"}'
TEXT_LO = '{"type":"assistant_text_content","text":"lo"}'
USAGE = '{"type":"usage","completion_tokens":2,"prompt_tokens":9,"total_tokens":11}'
FATAL = '{"type":"notification","is_fatal":true,"message":"upstream model unavailable"}'
DOWN = '{"kind":"agent","error":"down"}'
CONNECTION_ENDED = "the connection ended before the channel's finish"
RUN_ENDED = "the run ended before the channel's finish"
CHUNK_DID_NOT_PARSE = "a response did not decode: agentic loop chunk did not parse"
ERROR_DID_NOT_PARSE = "a response did not decode: agentic loop error did not parse"


def c(text: str) -> dict[str, str]:
    return {"chunk": text}


def e(value: Any) -> dict[str, Any]:
    return {"error": value}


CASES: list[tuple[str, str, list[str], dict[str, Any]]] = []


def case(name: str, about: str, lines: list[str], **expected: Any) -> None:
    CASES.append((name, about, lines, expected))


# --- the five outcomes -------------------------------------------------------

case(
    "finished",
    "Chunks, then the finish: the loop finished. Two text fragments coalesce.",
    one_loop(chunk(TEXT_HEL), chunk(TEXT_LO), chunk(USAGE), finish(note="channel response finish: the loop finished")),
    events=[c(TEXT_HEL), c(TEXT_LO), c(USAGE)],
    outcome=outcome("finished"),
    transcript=[json.loads('{"type":"assistant_text_content","text":"Hello"}'), json.loads(USAGE)],
)
case(
    "finished_fatal",
    "A fatal notification as the last chunk: finished, but failed (fatal).",
    one_loop(chunk(TEXT_HEL), chunk(FATAL), finish()),
    events=[c(TEXT_HEL), c(FATAL)],
    outcome=outcome("finished", fatal=True),
    transcript=[json.loads(TEXT_HEL), json.loads(FATAL)],
)
NOTE = '{"type":"notification","is_fatal":false,"message":null}'
case(
    "finished_fatal_not_last",
    "A fatal notification that is not the last chunk does not make the loop fatal.",
    one_loop(chunk(FATAL), chunk(NOTE), finish()),
    events=[c(FATAL), c(NOTE)],
    outcome=outcome("finished"),
    transcript=[json.loads(FATAL), json.loads(NOTE)],
)
case(
    "unfinished",
    "Chunks, an error, the finish: the loop ended without finishing.",
    one_loop(chunk(TEXT_HEL), error(DOWN), finish()),
    events=[c(TEXT_HEL), e(json.loads(DOWN))],
    outcome=outcome("unfinished", error=json.loads(DOWN)),
    transcript=[json.loads(TEXT_HEL)],
)
case(
    "no_loop",
    "An error first, then the finish: no loop ran.",
    one_loop(error(DOWN), finish()),
    events=[e(json.loads(DOWN))],
    outcome=outcome("no_loop", error=json.loads(DOWN)),
    transcript=[],
)
case(
    "not_served",
    "A finish alone: the proxy did not serve the loop.",
    one_loop(finish(note="a bare channel finish")),
    events=[],
    outcome=outcome("not_served"),
    transcript=[],
)
case(
    "broken_connection_ended",
    "The connection ends mid-loop (the capture ends; the replay closes): broken, never finished.",
    [AUTH, *start(), loop(), chunk(TEXT_HEL)],
    events=[c(TEXT_HEL)],
    outcome=outcome("broken", reason=CONNECTION_ENDED),
    transcript=[json.loads(TEXT_HEL)],
)
case(
    "broken_run_ended",
    "The run's scope finishes before the loop's channel: broken.",
    [AUTH, *start(), loop(), chunk(TEXT_HEL), line("<", 3, 1, 0, b"", "response finish: the run ended first")],
    events=[c(TEXT_HEL)],
    outcome=outcome("broken", reason=RUN_ENDED),
    transcript=[json.loads(TEXT_HEL)],
)

# --- the error is last, and the tag decides -----------------------------------

case(
    "broken_response_after_error",
    "A chunk after the error: the sequence broke.",
    one_loop(chunk(TEXT_HEL), error(DOWN), chunk(TEXT_LO), finish()),
    events=[c(TEXT_HEL), e(json.loads(DOWN))],
    outcome=outcome("broken", reason="a response came after the error"),
    transcript=[json.loads(TEXT_HEL)],
)
CHUNKLIKE = '{"type":"assistant_text_content","text":"not a chunk"}'
case(
    "error_shaped_like_a_chunk",
    "An error value that looks like a chunk is an error: the tag byte decides, never the JSON.",
    one_loop(error(CHUNKLIKE), finish()),
    events=[e(json.loads(CHUNKLIKE))],
    outcome=outcome("no_loop", error=json.loads(CHUNKLIKE)),
    transcript=[],
)
for name, text, value in [
    ("error_string", '"the model is gone"', "the model is gone"),
    ("error_null", "null", None),
    ("error_array", ' [1, "two", null] ', [1, "two", None]),
    ("error_number", "-12.5", -12.5),
]:
    case(
        name,
        f"An error value may be any JSON value: {text.strip()}.",
        one_loop(chunk(TEXT_HEL), error(text), finish()),
        events=[c(TEXT_HEL), e(value)],
        outcome=outcome("unfinished", error=value),
        transcript=[json.loads(TEXT_HEL)],
    )

# --- payloads that do not decode ------------------------------------------------

for name, data, about, reason in [
    ("broken_empty_payload", b"", "An empty response payload.", "a response did not decode: agentic loop frame is empty"),
    ("broken_unknown_tag", b"\x02{}", "A tag other than 0 or 1.", "a response did not decode: unknown agentic loop frame tag 2"),
    ("broken_unknown_type", b'\x00{"type":"assistant_thought","text":"x"}', "A chunk whose type is not one of the ten.", CHUNK_DID_NOT_PARSE),
    ("broken_missing_type", b'\x00{"text":"x"}', "A chunk without a type.", CHUNK_DID_NOT_PARSE),
    ("broken_type_not_a_string", b'\x00{"type":7,"text":"x"}', "A type that is not a string.", CHUNK_DID_NOT_PARSE),
    ("broken_missing_member", b'\x00{"type":"assistant_text_content"}', "A text chunk without its text.", CHUNK_DID_NOT_PARSE),
    ("broken_wrong_member_type", b'\x00{"type":"assistant_tool_call","id":"c","name":7}', "A tool call whose name is a number.", CHUNK_DID_NOT_PARSE),
    ("broken_notification_without_message", b'\x00{"type":"notification","is_fatal":true}', "A notification without its message member (required, may be null).", CHUNK_DID_NOT_PARSE),
    ("broken_usage_negative", b'\x00{"type":"usage","completion_tokens":-1,"prompt_tokens":0,"total_tokens":0}', "A negative token count.", CHUNK_DID_NOT_PARSE),
    ("broken_usage_fraction", b'\x00{"type":"usage","completion_tokens":1.5,"prompt_tokens":0,"total_tokens":0}', "A token count that is not a whole number.", CHUNK_DID_NOT_PARSE),
    ("broken_usage_float", b'\x00{"type":"usage","completion_tokens":1.0,"prompt_tokens":0,"total_tokens":0}', "A token count written as a float, 1.0.", CHUNK_DID_NOT_PARSE),
    ("broken_duplicate_member", b'\x00{"type":"assistant_text_content","text":"a","text":"b"}', "A chunk with its text member twice.", CHUNK_DID_NOT_PARSE),
    ("broken_duplicate_type", b'\x00{"type":"assistant_text_content","text":"a","type":"assistant_reasoning"}', "A chunk with two type members.", CHUNK_DID_NOT_PARSE),
    ("broken_chunk_array", b'\x00["assistant_text_content","x"]', "A chunk that is an array, not an object.", CHUNK_DID_NOT_PARSE),
    ("broken_chunk_trailing", b'\x00{"type":"assistant_text_content","text":"x"} {}', "Two JSON values after the tag.", CHUNK_DID_NOT_PARSE),
    ("broken_chunk_not_utf8", b'\x00{"type":"assistant_text_content","text":"\xff"}', "Chunk bytes that are not UTF-8.", CHUNK_DID_NOT_PARSE),
    ("broken_chunk_bom", b'\x00\xef\xbb\xbf{"type":"assistant_text_content","text":"x"}', "A byte-order mark before the chunk.", CHUNK_DID_NOT_PARSE),
    ("broken_chunk_lone_surrogate", b'\x00{"type":"assistant_text_content","text":"\\ud800"}', "A string with half a surrogate pair.", CHUNK_DID_NOT_PARSE),
    ("broken_content_block", b'\x00{"type":"tool_response","id":"c","content":[{"type":"video","data":"AA=="}]}', "A tool response with a content block MCP does not have.", CHUNK_DID_NOT_PARSE),
    ("broken_error_two_values", b"\x01{} {}", "Two JSON values after the error's tag.", ERROR_DID_NOT_PARSE),
    ("broken_error_empty", b"\x01", "No JSON value after the error's tag.", ERROR_DID_NOT_PARSE),
    ("broken_error_out_of_range", b"\x01[1e400]", "A number too large for a double.", ERROR_DID_NOT_PARSE),
    ("broken_error_too_deep", b"\x01" + b"[" * 128 + b"]" * 128, "An error value nested 128 levels deep.", ERROR_DID_NOT_PARSE),
]:
    case(
        name,
        about + " The reader stops at it: broken.",
        one_loop(chunk(TEXT_HEL), payload(data, "channel response: " + about.lower().rstrip(".")), chunk(TEXT_LO), finish()),
        events=[c(TEXT_HEL)],
        outcome=outcome("broken", reason=reason),
        transcript=[json.loads(TEXT_HEL)],
    )

# 124 levels: deep, and still within what a JSON reader of every language
# here takes inside this case's own expectation file (serde_json stops at
# 128 levels, and the expectation wraps the value in three more).
DEEP = "[" * 124 + "]" * 124
case(
    "error_deep",
    "An error value nested 124 levels deep is still one JSON value.",
    one_loop(error(DEEP), finish()),
    events=[e(json.loads(DEEP))],
    outcome=outcome("no_loop", error=json.loads(DEEP)),
    transcript=[],
)

# --- what a chunk may be ------------------------------------------------------------

LATE_TYPE = '{"text":"type comes last","extra":{"any":[1,2]},"type":"assistant_text_content"}'
SPACED = ' \n{ "type" : "assistant_reasoning" , "text" : "spaced" }\t'
NULLS = '{"type":"assistant_tool_call","id":"c","name":"t","arguments":null,"parent_tool_call_id":null,"_meta":null}'
PAIR = '{"type":"assistant_text_content","text":"\\ud83d\\ude00 \\u00e9"}'
case(
    "chunk_shapes",
    "Unknown members are tolerated, type may come anywhere, whitespace around, optional members null, escapes.",
    one_loop(chunk(LATE_TYPE), chunk(SPACED), chunk(NULLS), chunk(PAIR), finish()),
    events=[c(LATE_TYPE), c(SPACED), c(NULLS), c(PAIR)],
    outcome=outcome("finished"),
    transcript=[
        {"type": "assistant_text_content", "text": "type comes last"},
        {"type": "assistant_reasoning", "text": "spaced"},
        {"type": "assistant_tool_call", "id": "c", "name": "t"},
        {"type": "assistant_text_content", "text": "\U0001F600 \u00e9"},
    ],
)
KINDS = [
    '{"type":"assistant_reasoning","text":"Think."}',
    '{"type":"assistant_refusal","text":"No."}',
    '{"type":"assistant_tool_call","id":"call_7","name":"read_file","arguments":"{\\"path\\":"}',
    '{"type":"tool_response","id":"call_7","content":[{"type":"text","text":"fn main() {}"},{"type":"image","data":"AA==","mimeType":"image/png"}],"structuredContent":{"lines":1},"isError":false}',
    '{"type":"assistant_image_content","data":"iVBORw0KGgo=","mimeType":"image/png"}',
    '{"type":"assistant_audio_content","data":"UklGRg==","mimeType":"audio/wav"}',
    '{"type":"user","prompt":"and then?"}',
    '{"type":"usage","completion_tokens":18446744073709,"prompt_tokens":0,"total_tokens":18446744073709}',
    '{"type":"notification","is_fatal":false,"message":{"progress":0.5}}',
    '{"type":"assistant_text_content","text":"Done.","logprobs":[{"token":"Done","bytes":[68,111,110,101],"logprob":-0.25,"top_logprobs":[{"token":"Done","bytes":null,"logprob":-0.25}]}]}',
]
case(
    "every_kind",
    "One chunk of each of the ten kinds.",
    one_loop(*(chunk(k) for k in KINDS), finish()),
    events=[c(k) for k in KINDS],
    outcome=outcome("finished"),
    transcript=[json.loads(k) for k in KINDS],
)

# --- the transcript (protocol §11) ------------------------------------------------

T = [
    '{"type":"assistant_reasoning","text":"a"}',
    '{"type":"assistant_reasoning","text":"b"}',
    '{"type":"assistant_tool_call","id":"x","name":"f","arguments":"{\\"a\\":"}',
    '{"type":"assistant_tool_call","id":"y","name":"g"}',
    '{"type":"assistant_text_content","text":"sub","parent_tool_call_id":"x"}',
    '{"type":"assistant_text_content","text":"main"}',
    '{"type":"assistant_text_content","text":" thread"}',
    '{"type":"assistant_tool_call","id":"x","name":"f","arguments":"1}"}',
    '{"type":"assistant_tool_call","id":"y","name":"g","arguments":"{}"}',
    '{"type":"assistant_tool_call","id":"x","name":"f","arguments":"?","parent_tool_call_id":"z"}',
    '{"type":"usage","completion_tokens":1,"prompt_tokens":2,"total_tokens":3}',
    '{"type":"usage","completion_tokens":1,"prompt_tokens":2,"total_tokens":3}',
    '{"type":"assistant_reasoning","text":"c","logprobs":[{"token":"c","logprob":-1.5,"top_logprobs":[]}]}',
    '{"type":"assistant_reasoning","text":"d","logprobs":[{"token":"d","logprob":-2.5,"top_logprobs":[]}]}',
]
case(
    "transcript_merges",
    "Adjacent text of one kind on one thread merges; tool calls merge by id wherever they are; nothing merges across threads; usage is not summed.",
    one_loop(*(chunk(t) for t in T), finish()),
    events=[c(t) for t in T],
    outcome=outcome("finished"),
    transcript=[
        {"type": "assistant_reasoning", "text": "ab"},
        {"type": "assistant_tool_call", "id": "x", "name": "f", "arguments": '{"a":1}'},
        {"type": "assistant_tool_call", "id": "y", "name": "g", "arguments": "{}"},
        {"type": "assistant_text_content", "text": "sub", "parent_tool_call_id": "x"},
        {"type": "assistant_text_content", "text": "main thread"},
        {"type": "assistant_tool_call", "id": "x", "name": "f", "arguments": "?", "parent_tool_call_id": "z"},
        json.loads(T[10]),
        json.loads(T[11]),
        {
            "type": "assistant_reasoning",
            "text": "cd",
            "logprobs": [
                {"token": "c", "bytes": None, "logprob": -1.5, "top_logprobs": []},
                {"token": "d", "bytes": None, "logprob": -2.5, "top_logprobs": []},
            ],
        },
    ],
)

# --- the connection's rules (protocol §2, §3, §6) ------------------------------------

case(
    "disregarded_frames",
    "Frames the client disregards, and the loop goes on: a truncated frame, a type the server may not send, "
    "frames for a scope or a channel that is not open, a second main-stream response.",
    one_loop(
        chunk(TEXT_HEL),
        raw("<", bytes.fromhex("05000000"), "a truncated frame (4 bytes)"),
        line("<", 1, 1, 0, b"\x00{}", "a request, which a server never sends"),
        line("<", 7, 1, 1, b"\x00" + TEXT_LO.encode(), "type 7: not a frame type"),
        line("<", 5, 9, 1, b"\x00" + TEXT_LO.encode(), "a channel response for scope 9, which is not open"),
        line("<", 5, 1, 9, b"\x00" + TEXT_LO.encode(), "a channel response for channel 9, which is not open"),
        line("<", 6, 1, 9, b"", "a channel finish for channel 9, which is not open"),
        line("<", 3, 9, 0, b"", "a response finish for scope 9, which is not open"),
        line("<", 2, 1, 0, b'\x00{"id":"again"}', "a second main-stream response: disregarded"),
        chunk(TEXT_LO),
        finish(),
    ),
    events=[c(TEXT_HEL), c(TEXT_LO)],
    outcome=outcome("finished"),
    transcript=[json.loads('{"type":"assistant_text_content","text":"Hello"}')],
)
case(
    "server_channel_request",
    "A channel the server opens gets a bare channel finish (the client serves none); the loop goes on.",
    one_loop(
        chunk(TEXT_HEL),
        line("<", 4, 1, 3, b"\x05{\"prompt\":\"x\"}", "a channel request from the server: its channel 3"),
        line(">", 6, 1, 3, b"", "the client's bare channel finish for the server's channel 3"),
        chunk(TEXT_LO),
        finish(),
    ),
    events=[c(TEXT_HEL), c(TEXT_LO)],
    outcome=outcome("finished"),
    transcript=[json.loads('{"type":"assistant_text_content","text":"Hello"}')],
)
case(
    "server_authorization",
    "An authorization from the server, which did not dial, is a violation: the client ends the connection.",
    [AUTH, *start(), loop(), chunk(TEXT_HEL), line("<", 0, 0, 0, b"\x00", "an authorization from the server")],
    events=[c(TEXT_HEL)],
    outcome=outcome("broken", reason=CONNECTION_ENDED),
    transcript=[json.loads(TEXT_HEL)],
)

# --- the run's answer (protocol §5) --------------------------------------------------

REFUSAL = '{"kind":"policy","error":"image \\"nope\\" is not in the catalog"}'
case(
    "run_refused",
    "The server refuses the run: one error response, then the finish.",
    [AUTH, line(">", 1, 1, 0, RUN_REQUEST, "request"), line("<", 2, 1, 0, b"\x01" + REFUSAL.encode(), "the refusal"), line("<", 3, 1, 0, b"", "response finish")],
    start={"refused": json.loads(REFUSAL)},
)
case(
    "run_not_served",
    "A bare finish answers the run: received, not served.",
    [AUTH, line(">", 1, 1, 0, RUN_REQUEST, "request"), line("<", 3, 1, 0, b"", "a bare response finish")],
    start={"not_served": True},
)


def main() -> None:
    for old in HERE.glob("*.txt"):
        old.unlink()
    for old in HERE.glob("*.json"):
        old.unlink()
    for name, about, lines, expected in CASES:
        header = [
            f"# {name}: {about}",
            "# One message per line: '>' client to server, '<' server to client, then the",
            "# message in hex (type, scope, channel, payload). Written by corpus/write.py.",
            "",
        ]
        (HERE / f"{name}.txt").write_text("\n".join(header + lines) + "\n")
        document: dict[str, Any] = {"about": about}
        if "start" not in expected:
            document["prompt"] = "hi"
        document.update(expected)
        (HERE / f"{name}.json").write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {len(CASES)} cases to {HERE}")


if __name__ == "__main__":
    main()
