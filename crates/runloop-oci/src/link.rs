//! The agent link: a loopback forwarder between the host-side proxy and the
//! agent program inside the container, which makes sure a loop cut short by
//! the kernel's OOM killer ends with an error that says so.
//!
//! ```text
//! proxy ──HTTP──▶ link (127.0.0.1:L) ──TCP──▶ agent program (container address:PORT)
//! ```
//!
//! Bytes pass through untouched. The one thing the link adds is at the end
//! of a connection: when the agent's side ends, the link reads the
//! container's OOM count. If the kernel killed something for memory, the
//! link tells the supervisor (which kills the whole container: a container
//! that ran out of memory is over) and holds the proxy's side open until
//! the container is stopped. Without the hold, the proxy would see a
//! connection reset first and end the loop with "the stream broke"; with
//! it, the run ends first, with a reason that names memory, and the loop's
//! error is that reason. Any other end is passed on at once.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::io::{AsyncWriteExt, copy};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::debug;

/// What the link asks of the container's supervisor.
pub trait Watch: Send + Sync + 'static {
    /// Whether the kernel has OOM-killed a process of the container.
    fn out_of_memory(&self) -> bool;
    /// Asks for the container to be ended because it ran out of memory.
    fn end_for_memory(&self);
}

/// Binds the link on a loopback port; returns its address and the task
/// that serves it until `stop`.
pub async fn bind(
    agent: SocketAddr,
    watch: Arc<dyn Watch>,
    stop: CancellationToken,
) -> io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let connections = TaskTracker::new();
        loop {
            let accepted = tokio::select! {
                () = stop.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((inbound, _)) => {
                    let _ = inbound.set_nodelay(true);
                    let (watch, stop) = (Arc::clone(&watch), stop.clone());
                    connections.spawn(async move {
                        tokio::select! {
                            () = stop.cancelled() => {}
                            () = forward(inbound, agent, watch.as_ref(), &stop) => {}
                        }
                    });
                }
                Err(error) => debug!(%error, "the agent link's accept failed"),
            }
        }
        connections.close();
        connections.wait().await;
    });
    Ok((addr, task))
}

/// One connection, both ways, until the agent's side ends.
async fn forward(
    inbound: TcpStream,
    agent: SocketAddr,
    watch: &dyn Watch,
    stop: &CancellationToken,
) {
    let outbound = match TcpStream::connect(agent).await {
        Ok(outbound) => outbound,
        Err(error) => {
            debug!(%agent, %error, "the agent link cannot reach the agent program");
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
