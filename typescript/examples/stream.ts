// Streams one loop of the demo agent: the assistant's text as it comes, the
// tool calls, and the ending; exits 1 unless the loop finished. Checked by
// `tsc --strict` against the installed package (typescript/ci.sh).
//
//   RUNLOOP_URL=ws://127.0.0.1:7878 RUNLOOP_TOKEN=… node stream.js "Count the words"

import { Chunk, connect, RunloopError, type Outcome } from "runloop";

async function main(prompt: string): Promise<number> {
  const url = process.env.RUNLOOP_URL ?? "ws://127.0.0.1:7878";
  const token = process.env.RUNLOOP_TOKEN ?? "";
  let outcome: Outcome;
  try {
    const client = await connect(url, { token, connectTimeoutMs: 5000 });
    try {
      const run = await client.start("demo", { memory: "256M" });
      const stream = run.loop(prompt, { signal: AbortSignal.timeout(60_000) });
      for await (const event of stream) {
        if (event instanceof Chunk) {
          const data = event.data;
          if (data.type === "assistant_text_content") process.stdout.write(data.text);
          else if (data.type === "assistant_tool_call" && data.arguments?.startsWith("{")) {
            process.stdout.write(`\n${data.name}(…)\n`);
          }
        } else {
          console.error(`\n[error] ${event.json}`);
        }
      }
      outcome = await stream.outcome;
      await run.stop();
    } finally {
      await client.close();
    }
  } catch (error) {
    if (error instanceof RunloopError) {
      console.error(`runloop: ${error.message}`);
      return 1;
    }
    throw error;
  }
  console.log(`\n[${outcome.kind}${outcome.fatal ? " (fatal)" : ""}] ${String(outcome)}`);
  return outcome.ok ? 0 : 1;
}

process.exitCode = await main(process.argv.slice(2).join(" ") || "Count the words");
