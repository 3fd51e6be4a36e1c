//! A minimal runloop agent program in Rust, on `runloop::agent`.
//!
//! It echoes the prompt back one word per chunk, then reports usage.
//! An empty prompt is refused (no loop runs); the word "fail" in the prompt
//! ends the loop with a fatal notification (the loop failed after it began).

use std::sync::Arc;

use futures_util::future::{self, BoxFuture};
use futures_util::stream::{self, StreamExt};
use runloop::agent::{self, Agent, AgentServer, ChunkStream, Refusal, StatusCode};
use runloop::proto::run_loop::{
    AgenticLoopChunk, NotificationChunk, RunLoopRequest, TextChunk, UsageChunk,
};
use serde_json::{Value, json};

struct Echo;

impl Agent for Echo {
    fn register(&self, _agent: Value) -> BoxFuture<'_, Result<(), Refusal>> {
        // `_agent` is the run request's `agent` value, as the caller sent it.
        Box::pin(future::ready(Ok(())))
    }

    fn run_loop(
        &self,
        request: RunLoopRequest<'static>,
    ) -> BoxFuture<'_, Result<ChunkStream, Refusal>> {
        let prompt = request.prompt();
        let answer = if prompt.trim().is_empty() {
            let error = json!({"kind": "echo", "error": "the prompt is empty"});
            Err(Refusal::json(StatusCode::BAD_REQUEST, &error))
        } else {
            Ok(stream::iter(echo(prompt).into_iter().map(Ok)).boxed())
        };
        Box::pin(future::ready(answer))
    }
}

/// The loop: the chunks to send, in order.
fn echo(prompt: &str) -> Vec<AgenticLoopChunk> {
    let words: Vec<&str> = prompt.split_whitespace().collect();
    let mut chunks = Vec::new();
    for (n, word) in words.iter().enumerate() {
        if *word == "fail" {
            chunks.push(AgenticLoopChunk::Notification(NotificationChunk {
                is_fatal: true,
                message: json!("the echo agent was asked to fail"),
                meta: None,
            }));
            return chunks;
        }
        let text = if n == 0 {
            word.to_string()
        } else {
            format!(" {word}")
        };
        chunks.push(AgenticLoopChunk::AssistantTextContent(TextChunk {
            text,
            ..TextChunk::default()
        }));
    }
    let count = words.len() as u64;
    chunks.push(AgenticLoopChunk::Usage(UsageChunk {
        prompt_tokens: count,
        completion_tokens: count,
        total_tokens: 2 * count,
        meta: None,
    }));
    chunks
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    // Loopback only, on $PORT (else 8080): the proxy runs beside the agent program.
    let listen = ([127, 0, 0, 1], agent::port_from_env()).into();
    // Never shut down: the exec runtime ends this process with SIGTERM.
    AgentServer::bind(listen, Arc::new(Echo))
        .await?
        .serve()
        .await
}
