// A minimal runloop agent program: Node.js, no dependencies.
//
// It echoes the prompt back one word per chunk, then reports usage.
// An empty prompt is refused (no loop runs); the word "fail" in the prompt
// ends the loop with a fatal notification (the loop failed after it began).

import http from "node:http";

// $PORT when it is a port number, else 8080.
const given = Number.parseInt(process.env.PORT ?? "", 10);
const port = given >= 1 && given <= 65535 ? given : 8080;

// The loop: the chunks to send, in order.
function* loop(prompt) {
  const words = prompt.split(/\s+/).filter((word) => word !== "");
  for (const [n, word] of words.entries()) {
    if (word === "fail") {
      yield { type: "notification", is_fatal: true, message: "the echo agent was asked to fail" };
      return;
    }
    yield { type: "assistant_text_content", text: n === 0 ? word : " " + word };
  }
  yield {
    type: "usage",
    prompt_tokens: words.length,
    completion_tokens: words.length,
    total_tokens: 2 * words.length,
  };
}

function answer(res, status, body, contentType = "text/plain") {
  res.writeHead(status, { "Content-Type": contentType, "Content-Length": Buffer.byteLength(body) });
  res.end(body);
}

const server = http.createServer((req, res) => {
  let body = "";
  req.setEncoding("utf8");
  req.on("data", (piece) => (body += piece));
  req.on("end", () => {
    if (req.method !== "POST") return answer(res, 405, "POST only");
    if (req.url === "/register") {
      // JSON.parse(body).agent is the run request's `agent` value, as the caller sent it.
      return answer(res, 204, "");
    }
    if (req.url !== "/run") return answer(res, 404, "no such path");
    const { prompt } = JSON.parse(body);
    if (prompt.trim() === "") {
      const error = { kind: "echo", error: "the prompt is empty" };
      return answer(res, 400, JSON.stringify(error), "application/json");
    }
    // No Content-Length: Node sends the body with chunked transfer encoding,
    // so the end of the body (res.end) is the end of the loop.
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    for (const chunk of loop(prompt)) res.write(`data: ${JSON.stringify(chunk)}\n\n`);
    res.end();
  });
});

// Loopback only: the proxy runs beside the agent program.
server.listen(port, "127.0.0.1");
