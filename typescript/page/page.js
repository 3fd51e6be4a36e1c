// The live page: the package's browser entry (./runloop/browser.js, served
// from the package's dist/) driving one run, one loop at a time. Every
// value from the wire goes into the page as text (textContent) or as a
// data: URL of an image/* or audio/* type, never as markup.

import { Chunk, connect, LoopError } from "./runloop/browser.js";

const $ = (id) => document.getElementById(id);
const hash = new URLSearchParams(location.hash.slice(1));
for (const field of ["url", "token", "image", "prompt"]) {
  if (hash.has(field)) $(field).value = hash.get(field);
}

let client = null;
let run = null;
let aborter = null;

function status(text) {
  $("status").textContent = text;
}

function buttons() {
  const live = run !== null && !run.ended;
  $("start").disabled = live || client === "connecting";
  $("stop").disabled = !live;
  $("send").disabled = !live || aborter !== null;
  $("abort").disabled = aborter === null;
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** The page's view of one loop: blocks in order, fragments merged as a transcript merges them. */
class View {
  constructor(root) {
    this.root = root;
    this.last = null; // { kind, thread, body }
    this.calls = new Map(); // thread/id → { args, block }
    this.usage = { prompt: 0, completion: 0, total: 0 };
  }

  block(kind, label, thread) {
    const block = element("div", `block ${kind}${thread ? " thread" : ""}`);
    block.append(element("span", "label", thread ? `${label} · sub-agent of ${thread}` : label));
    this.root.append(block);
    block.scrollIntoView({ block: "nearest" });
    return block;
  }

  media(block, mimeType, data) {
    const url = `data:${mimeType};base64,${data}`;
    if (/^image\//.test(mimeType)) {
      const img = element("img");
      img.alt = "an image from the loop";
      img.src = url;
      block.append(img);
    } else if (/^audio\//.test(mimeType)) {
      const audio = element("audio");
      audio.controls = true;
      audio.src = url;
      block.append(audio);
    } else {
      block.append(element("span", "", `(${mimeType}, ${data.length} base64 characters)`));
    }
  }

  chunk(chunk) {
    const data = chunk.data;
    const thread = chunk.parentToolCallId ?? null;
    const kind = chunk.kind;
    const texts = { assistant_reasoning: "reasoning", assistant_text_content: "text", assistant_refusal: "refusal" };
    if (kind in texts) {
      if (this.last && this.last.kind === kind && this.last.thread === thread) {
        this.last.body.textContent += data.text;
        return;
      }
      const block = this.block(texts[kind], texts[kind], thread);
      const body = element("div", "", data.text);
      block.append(body);
      this.last = { kind, thread, body };
      return;
    }
    this.last = null;
    if (kind === "assistant_tool_call") {
      const key = `${thread}/${data.id}`;
      let call = this.calls.get(key);
      if (!call) {
        const block = this.block("tool", `tool call ${data.id}`, thread);
        const code = element("code", "", `${data.name}(`);
        const args = element("span", "", "");
        code.append(args, ")");
        block.append(code);
        call = { args, block };
        this.calls.set(key, call);
      }
      call.args.textContent += data.arguments ?? "";
      return;
    }
    if (kind === "tool_response") {
      const call = this.calls.get(`${thread}/${data.id}`);
      const holder = call ? call.block : this.block("tool", `tool response ${data.id}`, thread);
      const response = element("div", "response");
      response.append(element("span", "label", data.isError ? "the tool failed" : "response"));
      for (const block of data.content) {
        if (block.type === "text") response.append(element("pre", "", block.text));
        else if (block.type === "image" || block.type === "audio") {
          const media = element("div", "media");
          this.media(media, block.mimeType, block.data);
          response.append(media);
        } else if (block.type === "resource_link") response.append(element("pre", "", `${block.name}: ${block.uri}`));
        else response.append(element("pre", "", JSON.stringify(block.resource ?? block)));
      }
      if (data.structuredContent !== undefined && data.structuredContent !== null) {
        response.append(element("pre", "", JSON.stringify(data.structuredContent)));
      }
      holder.append(response);
      return;
    }
    if (kind === "assistant_image_content" || kind === "assistant_audio_content") {
      const block = this.block("media", kind === "assistant_image_content" ? "image" : "audio", thread);
      this.media(block, data.mimeType, data.data);
      return;
    }
    if (kind === "usage") {
      this.usage.prompt += data.prompt_tokens;
      this.usage.completion += data.completion_tokens;
      this.usage.total += data.total_tokens;
      const { total, prompt, completion } = this.usage;
      $("usage").textContent = `usage: ${total} tokens (${prompt} prompt, ${completion} completion)`;
      return;
    }
    if (kind === "notification") {
      const block = this.block(`notification${data.is_fatal ? " fatal" : ""}`, data.is_fatal ? "fatal notification" : "notification");
      block.append(element("div", "", typeof data.message === "string" ? data.message : JSON.stringify(data.message)));
      return;
    }
    if (kind === "user") {
      this.block("text", "user").append(element("div", "", data.prompt));
    }
  }

  error(error) {
    this.last = null;
    const block = this.block("error", "the loop's error");
    block.append(element("pre", "", JSON.stringify(error.value, null, 2)));
  }
}

/** How a loop ended, in plain words. */
function words(outcome) {
  const error = outcome.error === null ? "" : ` ${JSON.stringify(outcome.error)}`;
  switch (outcome.kind) {
    case "finished":
      return outcome.fatal
        ? ["failed", "The loop finished, but its last word was a fatal notification: it failed."]
        : ["finished", "The loop finished."];
    case "unfinished":
      return ["partial", `The loop ended without finishing: what came is a partial result. Its error:${error}`];
    case "no_loop":
      return ["failed", `No loop ran. The error:${error}`];
    case "not_served":
      return ["failed", "The server's proxy did not serve the loop (it sent nothing at all)."];
    default:
      return ["failed", `The loop broke before its end, so nothing about it can be concluded: ${outcome.reason}.`];
  }
}

function showOutcome(look, text, kind) {
  const node = $("outcome");
  node.className = `shown ${look}`;
  node.textContent = text;
  node.dataset.kind = kind;
}

$("connect").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    if (!client || client === "connecting" || client.closed) {
      client = "connecting";
      buttons();
      status(`Connecting to ${$("url").value}…`);
      client = await connect($("url").value, { token: $("token").value, connectTimeoutMs: 5000 });
    }
    status(`Starting a run of ${$("image").value}…`);
    run = await client.start($("image").value, { memory: "256M" });
    status(`Run ${run.id} of ${$("image").value} is running: send a prompt.`);
    run.waitEnded().then(() => {
      status(`Run ${run.id} has ended.`);
      buttons();
    });
  } catch (error) {
    if (client === "connecting") client = null;
    status(`${error.name}: ${error.message}`);
  }
  buttons();
});

$("stop").addEventListener("click", async () => {
  await run?.stop();
  buttons();
});

$("abort").addEventListener("click", () => aborter?.abort());

$("ask").addEventListener("submit", async (event) => {
  event.preventDefault();
  if (!run || run.ended) return;
  $("loop").replaceChildren();
  $("usage").textContent = "";
  $("outcome").className = "";
  const view = new View($("loop"));
  aborter = new AbortController();
  buttons();
  status(`Run ${run.id}: the loop is streaming…`);
  const stream = run.loop($("prompt").value, { signal: aborter.signal });
  try {
    for await (const item of stream) {
      if (item instanceof Chunk) view.chunk(item);
      else if (item instanceof LoopError) view.error(item);
    }
    const outcome = await stream.outcome;
    showOutcome(...words(outcome), outcome.kind);
    status(`Run ${run.id}: ${String(outcome)}.`);
  } catch (error) {
    const aborted = error.name === "AbortError";
    showOutcome("partial", aborted ? "You aborted the loop: its run was stopped." : `${error.name}: ${error.message}`, aborted ? "aborted" : "error");
  } finally {
    aborter = null;
    buttons();
  }
});

buttons();
