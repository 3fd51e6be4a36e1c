//! The agent link: a loopback forwarder between the host-side proxy and the
//! agent program inside the container's network namespace, which makes
//! sure every connection lands in the run and a loop cut short by the
//! kernel's OOM killer ends with an error that says so.
//!
//! ```text
//! proxy ──HTTP──▶ link (host 127.0.0.1:L) ──socket made in the run's netns──▶ agent (127.0.0.1:PORT)
//! ```
//!
//! Bytes pass through untouched. Each connection to the agent is made with
//! [`Netns::connect`], so it can reach nothing but the run's own loopback
//! (module [`network`](crate::network)). When it cannot be made — the
//! agent stopped listening, or its container is gone — the link answers
//! the proxy itself with a `502` whose JSON body says so (`{"kind":"agent",
//! "error":…}`, protocol §10) and names the container's end when there was
//! one: a registration sent to a run that is over fails with that reason,
//! and is never sent anywhere else.
//!
//! At the end of a connection, when the agent's side ends, the link reads
//! the container's OOM count. If the kernel killed something for memory,
//! the link tells the supervisor (which kills the whole container: a
//! container that ran out of memory is over) and holds the proxy's side
//! open until the container is stopped. Without the hold, the proxy would
//! see a connection reset first and end the loop with "the stream broke";
//! with it, the run ends first, with a reason that names memory, and the
//! loop's error is that reason. Any other end is passed on at once.
//!
//! The accept loop is the shared one (`runloop_wire::listener::accept_until`):
//! an accept that fails (out of descriptors) pauses instead of spinning.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use runloop_runtime::BoxFuture;
use tokio::io::{AsyncReadExt, AsyncWriteExt, copy};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::network::Netns;

/// How long a failed dial waits for the supervisor to report the
/// container's end, so that the answer can name it.
const END_REPORT: Duration = Duration::from_secs(1);

/// How long, and how much, the link reads of a request it answers itself
/// (so that closing does not reset the connection before the proxy has
/// read the answer).
const DRAIN: Duration = Duration::from_secs(2);
const DRAIN_BYTES: usize = 1 << 20;

/// What the link asks of the container's supervisor.
pub trait Watch: Send + Sync + 'static {
    /// Whether the kernel has OOM-killed a process of the container.
    fn out_of_memory(&self) -> bool;
    /// Asks for the container to be ended because it ran out of memory.
    fn end_for_memory(&self);
    /// Why the container ended, waiting up to `patience` for the word
    /// when it has not come yet; `None` while it runs.
    fn ended(&self, patience: Duration) -> BoxFuture<'_, Option<String>>;
}

/// Where the link dials: a port of a run's namespace.
#[derive(Debug, Clone)]
pub struct Agent {
    /// The run's namespace.
    pub netns: Netns,
    /// The agent program's port there.
    pub port: u16,
}

/// Binds the link on a loopback port of the host; returns its address and
/// the task that serves it until `stop`.
pub async fn bind(
    agent: Agent,
    watch: Arc<dyn Watch>,
    stop: CancellationToken,
) -> io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let addr = listener.local_addr()?;
    let agent = Arc::new(agent);
    let task = tokio::spawn(async move {
        let connections = TaskTracker::new();
        runloop_wire::listener::accept_until(&listener, &stop, |inbound, _| {
            let (agent, watch, stop) = (Arc::clone(&agent), Arc::clone(&watch), stop.clone());
            connections.spawn(async move {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = forward(inbound, &agent, watch.as_ref(), &stop) => {}
                }
            });
        })
        .await;
        connections.close();
        connections.wait().await;
    });
    Ok((addr, task))
}

/// One connection, both ways, until the agent's side ends.
async fn forward(inbound: TcpStream, agent: &Agent, watch: &dyn Watch, stop: &CancellationToken) {
    let outbound = match agent.netns.connect(agent.port).await {
        Ok(outbound) => outbound,
        Err(error) => {
            let why = match watch.ended(END_REPORT).await {
                Some(reason) => format!(
                    "the run's container has ended ({reason}); nothing is left to answer in its network namespace"
                ),
                None => format!(
                    "cannot reach the agent program on 127.0.0.1:{} in the run's network namespace {}: {error}",
                    agent.port,
                    agent.netns.name()
                ),
            };
            warn!(netns = agent.netns.name(), %why, "the agent link answers for the agent program");
            answer_unreachable(inbound, &why).await;
            return;
        }
    };
    let _ = outbound.set_nodelay(true);
    let (mut from_proxy, mut to_proxy) = inbound.into_split();
    let (mut from_agent, mut to_agent) = outbound.into_split();
    let upstream = async {
        let _ = copy(&mut from_proxy, &mut to_agent).await;
        let _ = to_agent.shutdown().await;
        // The agent may still be answering: the connection ends with it.
        std::future::pending::<()>().await;
    };
    let downstream = async {
        let copied = copy(&mut from_agent, &mut to_proxy).await;
        if watch.out_of_memory() {
            watch.end_for_memory();
            stop.cancelled().await;
            return;
        }
        if copied.is_ok() {
            let _ = to_proxy.shutdown().await;
        }
    };
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
}

/// The HTTP answer the link gives in the agent program's place: `502`,
/// the error JSON of an agent that cannot be dialled (protocol §10).
fn unreachable_response(why: &str) -> Vec<u8> {
    let body = serde_json::json!({"kind": "agent", "error": why}).to_string();
    format!(
        "HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Answers the proxy's request with [`unreachable_response`] once its
/// head has come (an answer before the request is one HTTP clients
/// refuse as unexpected), then reads what it still sends (boundedly)
/// until it closes.
async fn answer_unreachable(mut inbound: TcpStream, why: &str) {
    let head = async {
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4096];
        while seen.len() < DRAIN_BYTES && !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            match inbound.read(&mut buffer).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => seen.extend_from_slice(&buffer[..n]),
            }
        }
        true
    };
    if !tokio::time::timeout(DRAIN, head).await.unwrap_or(false) {
        debug!("the proxy sent no request the link could answer");
        return;
    }
    if let Err(error) = inbound.write_all(&unreachable_response(why)).await {
        debug!(%error, "the proxy left before the link's answer");
        return;
    }
    let _ = inbound.shutdown().await;
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut read = 0;
        while read < DRAIN_BYTES {
            match inbound.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN, drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_in_the_agents_place_is_a_502_with_agent_error_json() {
        let response = String::from_utf8(unreachable_response("it is \"gone\"")).expect("text");
        let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
        assert!(head.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{head}");
        assert!(head.contains("Content-Type: application/json"), "{head}");
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        let json: serde_json::Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(
            json,
            serde_json::json!({"kind": "agent", "error": "it is \"gone\""})
        );
    }
}
