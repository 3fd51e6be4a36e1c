// The page's showcase agent: one loop that shows every kind of chunk a
// terminal cannot, paced so that it can be watched as it streams —
// reasoning, a tool call and its response (text and an image), an image
// and an audio clip from the model, a notification, text, and usage.
// Node.js, no dependencies; served by page/serve.mjs as the image
// "showcase" (`--agent showcase=exec:node page/showcase-agent.mjs`).

import http from "node:http";
import { deflateSync } from "node:zlib";

const given = Number.parseInt(process.env.PORT ?? "", 10);
const port = given >= 1 && given <= 65535 ? given : 8080;
const PACE_MS = 40;

// --- a PNG, drawn here: a sunset in 96 × 64 pixels ----------------------------

const CRC = new Int32Array(256).map((_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c;
});
function crc32(bytes) {
  let c = -1;
  for (const b of bytes) c = CRC[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ -1) >>> 0;
}
function pngChunk(type, data) {
  const head = Buffer.alloc(8);
  head.writeUInt32BE(data.length, 0);
  head.write(type, 4, "ascii");
  const tail = Buffer.alloc(4);
  tail.writeUInt32BE(crc32(Buffer.concat([head.subarray(4), data])), 0);
  return Buffer.concat([head, data, tail]);
}
function sunset(width, height) {
  const rows = [];
  for (let y = 0; y < height; y++) {
    const row = Buffer.alloc(1 + width * 3);
    for (let x = 0; x < width; x++) {
      const sky = y / height;
      let [r, g, b] = [255, Math.round(80 + 120 * sky), Math.round(160 - 120 * sky)];
      const dx = x - width / 2;
      const dy = y - height * 0.7;
      if (dx * dx + dy * dy < (height / 4) ** 2) [r, g, b] = [255, 220, 90];
      if (y > height * 0.72) [r, g, b] = [30, 60 + Math.round(40 * Math.sin(x / 3 + y)), 120];
      row.set([r, g, b], 1 + x * 3);
    }
    rows.push(row);
  }
  const header = Buffer.alloc(13);
  header.writeUInt32BE(width, 0);
  header.writeUInt32BE(height, 4);
  header.set([8, 2, 0, 0, 0], 8);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    pngChunk("IHDR", header),
    pngChunk("IDAT", deflateSync(Buffer.concat(rows))),
    pngChunk("IEND", Buffer.alloc(0)),
  ]);
}

// --- a WAV: a tone of 440 Hz, 0.8 s, 8 kHz, 8 bits ------------------------------

function tone(hz, seconds, rate = 8000) {
  const samples = Math.round(seconds * rate);
  const wav = Buffer.alloc(44 + samples);
  wav.write("RIFF", 0, "ascii");
  wav.writeUInt32LE(36 + samples, 4);
  wav.write("WAVEfmt ", 8, "ascii");
  wav.writeUInt32LE(16, 16);
  wav.writeUInt16LE(1, 20);
  wav.writeUInt16LE(1, 22);
  wav.writeUInt32LE(rate, 24);
  wav.writeUInt32LE(rate, 28);
  wav.writeUInt16LE(1, 32);
  wav.writeUInt16LE(8, 34);
  wav.write("data", 36, "ascii");
  wav.writeUInt32LE(samples, 40);
  for (let n = 0; n < samples; n++) {
    const fade = Math.min(1, n / 400, (samples - n) / 400);
    wav[44 + n] = 128 + Math.round(90 * fade * Math.sin((2 * Math.PI * hz * n) / rate));
  }
  return wav;
}

// --- the loop ---------------------------------------------------------------------

function* pieces(text, size) {
  for (let at = 0; at < text.length; at += size) yield text.slice(at, at + size);
}

function* loop(prompt) {
  const words = prompt.split(/\s+/).filter(Boolean);
  for (const part of pieces(`The user wrote ${words.length} words. I will draw them a sunset, then play a tone.`, 14)) {
    yield { type: "assistant_reasoning", text: part };
  }
  const args = JSON.stringify({ scene: "sunset", width: 96, height: 64 });
  for (const part of pieces(args, 12)) yield { type: "assistant_tool_call", id: "call_1", name: "draw", arguments: part };
  const picture = sunset(96, 64).toString("base64");
  yield {
    type: "tool_response",
    id: "call_1",
    content: [
      { type: "text", text: "drew a sunset, 96 × 64" },
      { type: "image", data: picture, mimeType: "image/png" },
    ],
    structuredContent: { width: 96, height: 64 },
    isError: false,
  };
  yield { type: "notification", is_fatal: false, message: { tool: "draw", status: "done" } };
  yield { type: "assistant_image_content", data: picture, mimeType: "image/png" };
  yield { type: "assistant_audio_content", data: tone(440, 0.8).toString("base64"), mimeType: "audio/wav" };
  const answer = `Here is your sunset, and a tone of 440 Hz to go with it. You said: "${prompt}"`;
  for (const word of answer.split(/(?<= )/)) yield { type: "assistant_text_content", text: word };
  yield { type: "usage", prompt_tokens: words.length, completion_tokens: 42, total_tokens: words.length + 42 };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

http
  .createServer((req, res) => {
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (piece) => (body += piece));
    req.on("end", async () => {
      if (req.url === "/register") return res.writeHead(204).end();
      if (req.url !== "/run") return res.writeHead(404).end();
      const { prompt } = JSON.parse(body);
      res.writeHead(200, { "Content-Type": "text/event-stream" });
      for (const chunk of loop(String(prompt))) {
        if (res.destroyed) return;
        res.write(`data: ${JSON.stringify(chunk)}\n\n`);
        await sleep(PACE_MS);
      }
      res.end();
    });
  })
  .listen(port, "127.0.0.1");
