//! The listener every server of runloop runs: the provider's server, the
//! proxy and the agent program start and stop the same way.
//!
//! Each is bound first (`bind`, which fails if the address cannot be
//! listened on), then serves until its handle's `shutdown`: it stops
//! accepting, ends what it serves, and returns when all of it is done.
//! `spawn` does that on a task of its own and hands back the handle:
//!
//! ```text
//! X::bind(addr, …) ──▶ X ──spawn()──▶ (XHandle, JoinHandle)
//!                      │                 │ local_addr(), url(), shutdown()
//!                      └──serve().await──┘ returns after shutdown, once all is done
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Accepts connections on `listener` until `shutdown` fires, handing each
/// to `serve` with Nagle's algorithm off (frames and events are small, and
/// written in batches or one at a time: Nagle would only hold them back for
/// an ACK). An accept that fails (out of descriptors and the like) is
/// logged and followed by a short pause rather than a spin.
pub async fn accept_until(
    listener: &TcpListener,
    shutdown: &CancellationToken,
    mut serve: impl FnMut(TcpStream, SocketAddr),
) {
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((tcp, peer)) => {
                let _ = tcp.set_nodelay(true);
                serve(tcp, peer);
            }
            Err(error) => {
                warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
