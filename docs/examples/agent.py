#!/usr/bin/env python3
"""A minimal runloop agent program: Python 3, standard library only.

It echoes the prompt back one word per chunk, then reports usage.
An empty prompt is refused (no loop runs); the word "fail" in the prompt
ends the loop with a fatal notification (the loop failed after it began).
"""

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def port():
    """$PORT when it is a port number, else 8080."""
    try:
        value = int(os.environ.get("PORT", ""))
    except ValueError:
        return 8080
    return value if 1 <= value <= 65535 else 8080


def loop(prompt):
    """The loop: the chunks to send, in order, as dicts."""
    words = prompt.split()
    for n, word in enumerate(words):
        if word == "fail":
            yield {"type": "notification", "is_fatal": True,
                   "message": "the echo agent was asked to fail"}
            return
        text = word if n == 0 else " " + word
        yield {"type": "assistant_text_content", "text": text}
    yield {"type": "usage", "prompt_tokens": len(words),
           "completion_tokens": len(words), "total_tokens": 2 * len(words)}


class Agent(BaseHTTPRequestHandler):
    # HTTP/1.1, so the event stream below can use chunked transfer encoding:
    # with HTTP/1.0 the body would end with the connection, and a crash could
    # not be told from the end of the loop.
    protocol_version = "HTTP/1.1"
    # Each event is a small write of its own: send it now, not after the
    # proxy's delayed acknowledgement of the previous one (about 40 ms).
    disable_nagle_algorithm = True

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length))
        if self.path == "/register":
            # body["agent"] is the run request's `agent` value, as the caller sent it.
            self.answer(204, b"")
        elif self.path == "/run":
            prompt = body["prompt"]
            if not prompt.strip():
                error = {"kind": "echo", "error": "the prompt is empty"}
                self.answer(400, json.dumps(error).encode(), "application/json")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in loop(prompt):
                event = b"data: " + json.dumps(chunk).encode() + b"\n\n"
                self.write_chunk(event)
            self.write_chunk(b"")  # the last chunk: the body, and the loop, ended here
        else:
            self.answer(404, b"no such path")

    def answer(self, status, body, content_type="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def write_chunk(self, data):
        """One piece of a chunked body: its size in hex, the bytes, CRLF."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


if __name__ == "__main__":
    # Loopback only: the proxy runs beside the agent program.
    ThreadingHTTPServer(("127.0.0.1", port()), Agent).serve_forever()
