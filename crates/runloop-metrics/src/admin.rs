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
//! asked for (`runloop serve --admin`, `runloop proxy --admin`).
//!
//! Whoever can reach it must not be able to blind it, or a liveness probe
//! fails and the process is restarted with every tenant's runs:
//!
//! - a connection must send its request's headers within
//!   [`HEADER_TIMEOUT`], is closed once it has been answered (no
//!   keep-alive to hold open), and lives [`CONNECTION_TIMEOUT`] at most;
//! - at most [`MAX_CONNECTIONS`] are open, [`MAX_PER_ADDRESS`] from one
//!   address; a connection over either count takes the place of the
//!   oldest one (of that address, for the second) that has not yet sent a
//!   request, so a new probe is never kept waiting by idle sockets — it is
//!   refused only when every place is busy answering;
//! - `/metrics` is rendered off the async threads, [`MAX_RENDERS`] at a
//!   time; `/healthz` and `/readyz` never wait for it.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::header::{ALLOW, CONTENT_TYPE};
use axum::http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

/// Admin connections open at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Admin connections open at once from one address.
pub const MAX_PER_ADDRESS: usize = 16;
/// How long a connection has to send its request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection lives, answered or not.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(20);
/// `/metrics` renders at once.
pub const MAX_RENDERS: usize = 2;

/// What the admin listener reports on.
pub trait Watched: Send + Sync + 'static {
    /// The metrics, in the Prometheus text format.
    fn metrics(&self) -> String;
    /// Whether new work is accepted now (not draining, not shutting down).
    fn ready(&self) -> bool;
}

/// One open connection, as the place table sees it.
struct Place {
    address: IpAddr,
    /// When it was accepted, as a count: lower is older.
    order: u64,
    /// Whether a request has arrived on it (it is then not evicted).
    busy: Arc<AtomicBool>,
    /// Ends it.
    end: CancellationToken,
}

/// The open connections.
#[derive(Default)]
struct Places {
    open: HashMap<u64, Place>,
    next: u64,
}

impl Places {
    /// A place for a connection from `address`, evicting an idle one when
    /// a count is reached; `None` when every place that counts is busy.
    fn take(&mut self, address: IpAddr) -> Option<(u64, Arc<AtomicBool>, CancellationToken)> {
        let from_address = self
            .open
            .values()
            .filter(|place| place.address == address)
            .count();
        if from_address >= MAX_PER_ADDRESS && !self.evict(Some(address)) {
            return None;
        }
        if self.open.len() >= MAX_CONNECTIONS && !self.evict(None) {
            return None;
        }
        let id = self.next;
        self.next += 1;
        let busy = Arc::new(AtomicBool::new(false));
        let end = CancellationToken::new();
        self.open.insert(
            id,
            Place {
                address,
                order: id,
                busy: Arc::clone(&busy),
                end: end.clone(),
            },
        );
        Some((id, busy, end))
    }

    /// Ends the oldest idle connection (of `address`, if given).
    fn evict(&mut self, address: Option<IpAddr>) -> bool {
        let oldest = self
            .open
            .iter()
            .filter(|(_, place)| address.is_none_or(|a| place.address == a))
            .filter(|(_, place)| !place.busy.load(Ordering::Relaxed))
            .min_by_key(|(_, place)| place.order)
            .map(|(id, _)| *id);
        match oldest.and_then(|id| self.open.remove(&id)) {
            Some(place) => {
                place.end.cancel();
                true
            }
            None => false,
        }
    }
}

/// Serves the admin endpoints of `watched` on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    watched: Arc<dyn Watched>,
    shutdown: CancellationToken,
) -> io::Result<()> {
    info!(admin = ?listener.local_addr().ok(), "admin listener up");
    let places = Arc::new(Mutex::new(Places::default()));
    let renders = Arc::new(Semaphore::new(MAX_RENDERS));
    let tasks = TaskTracker::new();
    loop {
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors and the like: back off, do not spin.
                    warn!(%error, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let taken = places
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take(peer.ip());
        let Some((id, busy, end)) = taken else {
            debug!(%peer, "admin connection refused: every place is answering");
            continue;
        };
        let places = Arc::clone(&places);
        let watched = Arc::clone(&watched);
        let renders = Arc::clone(&renders);
        let stop = shutdown.clone();
        tasks.spawn(async move {
            connection(tcp, watched, renders, busy, end, stop).await;
            places
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .open
                .remove(&id);
        });
    }
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// Serves one connection: one request, within the timeouts.
async fn connection(
    tcp: TcpStream,
    watched: Arc<dyn Watched>,
    renders: Arc<Semaphore>,
    busy: Arc<AtomicBool>,
    end: CancellationToken,
    shutdown: CancellationToken,
) {
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        busy.store(true, Ordering::Relaxed);
        let watched = Arc::clone(&watched);
        let renders = Arc::clone(&renders);
        async move { Ok::<_, std::convert::Infallible>(route(&request, watched, renders).await) }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(false);
    let serving = http.serve_connection(TokioIo::new(tcp), service);
    tokio::pin!(serving);
    tokio::select! {
        result = serving.as_mut() => {
            if let Err(error) = result {
                debug!(%error, "admin connection ended");
            }
        }
        () = end.cancelled() => debug!("admin connection evicted: idle, and its place was needed"),
        () = tokio::time::sleep(CONNECTION_TIMEOUT) => debug!("admin connection ended: open too long"),
        () = shutdown.cancelled() => {
            // A request under way is finished; an idle connection ends.
            serving.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(1), serving).await;
        }
    }
}

/// The answer to one request.
async fn route(
    request: &Request<Incoming>,
    watched: Arc<dyn Watched>,
    renders: Arc<Semaphore>,
) -> Response<Body> {
    let text = |status: StatusCode, body: &'static str| {
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = status;
        response
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "");
        response
            .headers_mut()
            .insert(ALLOW, axum::http::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match request.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if watched.ready() => text(StatusCode::OK, "ready\n"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
        "/metrics" => {
            let Ok(_render) = renders.acquire_owned().await else {
                return text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
            };
            let rendered = tokio::task::spawn_blocking(move || watched.metrics()).await;
            match rendered {
                Ok(metrics) => {
                    let mut response = Response::new(Body::from(metrics));
                    response.headers_mut().insert(
                        CONTENT_TYPE,
                        axum::http::HeaderValue::from_static(crate::CONTENT_TYPE),
                    );
                    response
                }
                Err(_) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the metrics did not render\n",
                ),
            }
        }
        _ => text(StatusCode::NOT_FOUND, ""),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use std::net::SocketAddr;
    use std::time::Instant;

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

    /// A listener serving `watched` on a loopback port.
    async fn listening(watched: Arc<dyn Watched>) -> (SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        tokio::spawn(serve(listener, watched, shutdown.clone()));
        (addr, shutdown)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn healthz_answers_while_a_thousand_idle_sockets_are_open() {
        let (addr, shutdown) = listening(Arc::new(Fixed(AtomicBool::new(true)))).await;
        // Silent sockets, and sockets that sent half a request.
        let mut idle = Vec::new();
        for n in 0..1000 {
            let mut tcp = TcpStream::connect(addr).await.expect("connects");
            if n % 2 == 1 {
                tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: a")
                    .await
                    .expect("writes");
            }
            idle.push(tcp);
        }
        let mut took = Vec::new();
        for _ in 0..200 {
            let started = Instant::now();
            let answer = tokio::time::timeout(Duration::from_secs(5), get(addr, "/healthz"))
                .await
                .expect("/healthz answered within 5 s while 1000 idle sockets are open");
            took.push(started.elapsed());
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        }
        took.sort();
        let p99 = took[took.len() * 99 / 100 - 1];
        println!(
            "/healthz with 1000 idle sockets open: p50 {:?}, p99 {p99:?}, max {:?} (200 requests)",
            took[took.len() / 2],
            took[took.len() - 1]
        );
        assert!(p99 < Duration::from_millis(100), "p99 {p99:?}");
        drop(idle);
        shutdown.cancel();
    }

    /// Metrics that take `delay` to render.
    struct Slow(Duration);

    impl Watched for Slow {
        fn metrics(&self) -> String {
            std::thread::sleep(self.0);
            String::new()
        }
        fn ready(&self) -> bool {
            true
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn probes_never_wait_behind_metrics() {
        let (addr, shutdown) = listening(Arc::new(Slow(Duration::from_secs(3)))).await;
        let scrapes: Vec<_> = (0..8)
            .map(|_| tokio::spawn(async move { get(addr, "/metrics").await }))
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        for path in ["/healthz", "/readyz"] {
            let started = Instant::now();
            let answer = tokio::time::timeout(Duration::from_secs(2), get(addr, path))
                .await
                .unwrap_or_else(|_| panic!("{path} waited behind /metrics"));
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            assert!(
                started.elapsed() < Duration::from_millis(500),
                "{:?}",
                started.elapsed()
            );
        }
        for scrape in scrapes {
            scrape.abort();
        }
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_connection_that_sends_no_request_is_closed() {
        let (addr, shutdown) = listening(Arc::new(Fixed(AtomicBool::new(true)))).await;
        let mut tcp = TcpStream::connect(addr).await.expect("connects");
        tcp.write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .expect("writes");
        let started = Instant::now();
        let mut sink = Vec::new();
        let read = tokio::time::timeout(HEADER_TIMEOUT * 3, tcp.read_to_end(&mut sink)).await;
        assert!(read.is_ok(), "still open after {:?}", started.elapsed());
        assert!(started.elapsed() >= HEADER_TIMEOUT - Duration::from_millis(100));
        shutdown.cancel();
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
