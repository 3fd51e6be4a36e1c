// An agent program for the tests, in one of a few modes (its first argument):
//
//   refuse   answers /run with 503 and a JSON body: no loop ran
//   crash    sends two chunks, then exits with status 3 mid-body: unfinished
//   empty    answers /run with an event stream that holds no event: not served
//   slow     sends a text chunk every 50 ms for a minute (abort tests)
import http from "node:http";

const mode = process.argv[2] ?? "slow";
const given = Number.parseInt(process.env.PORT ?? "", 10);
const port = given >= 1 && given <= 65535 ? given : 8080;

const send = (res, chunk) => res.write(`data: ${JSON.stringify(chunk)}\n\n`);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

http
  .createServer((req, res) => {
    req.resume();
    req.on("end", async () => {
      if (req.url === "/register") return res.writeHead(204).end();
      if (mode === "refuse") {
        res.writeHead(503, { "Content-Type": "application/json" });
        return res.end(JSON.stringify({ kind: "test", error: "this agent refuses every loop" }));
      }
      res.writeHead(200, { "Content-Type": "text/event-stream" });
      if (mode === "empty") return res.end();
      if (mode === "crash") {
        send(res, { type: "assistant_text_content", text: "about to " });
        send(res, { type: "assistant_text_content", text: "crash" });
        await sleep(50);
        process.exit(3);
      }
      if (mode === "slow") {
        for (let n = 0; n < 1200 && !res.destroyed; n++) {
          send(res, { type: "assistant_text_content", text: `${n} ` });
          await sleep(50);
        }
        return res.end();
      }
      res.end();
    });
  })
  .listen(port, "127.0.0.1");
