//! The admin listener: plain HTTP for the operator's tools, apart from
//! the callers' port.
//!
//! ```text
//! GET /metrics   200, the Prometheus text format (this crate)
//! GET /healthz   200 "ok": the process is alive and serving HTTP
//! GET /readyz    200 "ready" while new work is accepted; 503 "draining"
//!                once a drain or a shutdown has begun
//! ```
//!
//! It is a listener of its own so that probes and scrapes never compete
//! with callers for the connection limit, never need a credential or TLS,
//! and can be kept on an address callers cannot reach. It is off unless
//! asked for (`runloop serve --admin`, `runloop proxy --admin`). Its
//! connections are bounded ([`MAX_CONNECTIONS`]): one more waits for a
//! place before it is accepted.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Admin connections served at once.
pub const MAX_CONNECTIONS: usize = 16;

/// What the admin listener reports on.
pub trait Watched: Send + Sync + 'static {
    /// The metrics, in the Prometheus text format.
    fn metrics(&self) -> String;
    /// Whether new work is accepted now (not draining, not shutting down).
    fn ready(&self) -> bool;
}

/// Serves the admin endpoints of `watched` on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    watched: Arc<dyn Watched>,
    shutdown: CancellationToken,
) -> io::Result<()> {
    info!(admin = ?listener.local_addr().ok(), "admin listener up");
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(watched);
    let listener = Bounded {
        listener,
        slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
    };
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

async fn metrics(State(watched): State<Arc<dyn Watched>>) -> Response {
    ([(CONTENT_TYPE, crate::CONTENT_TYPE)], watched.metrics()).into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(watched): State<Arc<dyn Watched>>) -> Response {
    if watched.ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response()
    }
}

/// A listener that accepts a connection only when one of its places is
/// free, and frees the place when the connection is dropped.
struct Bounded {
    listener: TcpListener,
    slots: Arc<Semaphore>,
}

impl axum::serve::Listener for Bounded {
    type Io = Placed;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Placed, SocketAddr) {
        // The semaphore is never closed.
        let Ok(place) = Arc::clone(&self.slots).acquire_owned().await else {
            unreachable!("the admin listener's semaphore is never closed")
        };
        loop {
            match self.listener.accept().await {
                Ok((tcp, peer)) => {
                    return (Placed { tcp, _place: place }, peer);
                }
                Err(error) => {
                    // Out of descriptors and the like: back off, do not spin.
                    warn!(%error, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// An admin connection and the place it holds.
struct Placed {
    tcp: TcpStream,
    _place: OwnedSemaphorePermit,
}

impl AsyncRead for Placed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Placed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    struct Fixed(AtomicBool);

    impl Watched for Fixed {
        fn metrics(&self) -> String {
            "# TYPE x gauge\nx 1\n".to_owned()
        }
        fn ready(&self) -> bool {
            self.0.load(Ordering::Relaxed)
        }
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut tcp = TcpStream::connect(addr).await.expect("connects");
        let request = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
        tcp.write_all(request.as_bytes()).await.expect("writes");
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.expect("reads");
        answer
    }

    #[tokio::test]
    async fn each_endpoint_answers_over_real_http() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("addr");
        let watched = Arc::new(Fixed(AtomicBool::new(true)));
        let shutdown = CancellationToken::new();
        let serving = tokio::spawn(serve(
            listener,
            Arc::clone(&watched) as Arc<dyn Watched>,
            shutdown.clone(),
        ));
        let metrics = get(addr, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(metrics.contains("text/plain; version=0.0.4"), "{metrics}");
        assert!(metrics.ends_with("x 1\n"), "{metrics}");
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        let ready = get(addr, "/readyz").await;
        assert!(
            ready.starts_with("HTTP/1.1 200") && ready.ends_with("ready\n"),
            "{ready}"
        );
        watched.0.store(false, Ordering::Relaxed);
        let draining = get(addr, "/readyz").await;
        assert!(draining.starts_with("HTTP/1.1 503"), "{draining}");
        assert!(draining.ends_with("draining\n"), "{draining}");
        assert!(get(addr, "/other").await.starts_with("HTTP/1.1 404"));
        shutdown.cancel();
        serving.await.expect("joins").expect("serves");
    }
}
