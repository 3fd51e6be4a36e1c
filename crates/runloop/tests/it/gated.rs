//! A runtime whose containers are a fake proxy's, and whose test decides
//! when each start completes and when each container ends by itself: for
//! the tests of what the server does while a start is under way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use runloop::runtime::Catalog;
use runloop::server::{Credentials, Server, ServerConfig, ServerHandle};
use runloop_testkit::fake_proxy::FakeProxy;
use runloop_testkit::server::unbudgeted;

/// A runtime whose containers are a fake proxy's, and whose test decides
/// when each start completes and when each container ends by itself.
#[derive(Debug, Clone)]
pub struct Gated {
    url: String,
    /// One permit per start allowed to complete.
    pub gate: Arc<tokio::sync::Semaphore>,
    /// Starts asked for.
    pub asked: Arc<AtomicU64>,
    /// Starts dropped before they completed (the server gave up waiting).
    pub abandoned: Arc<AtomicU64>,
    /// Containers that exist (started and not yet dropped).
    pub live: Arc<AtomicU64>,
    /// Containers stopped through `Container::stop`.
    pub stopped: Arc<AtomicU64>,
    ends: Arc<Mutex<Vec<tokio::sync::watch::Sender<bool>>>>,
}

impl Gated {
    /// Containers at `proxy`, every start held until the test opens the gate.
    pub fn new(proxy: &FakeProxy) -> Gated {
        Gated {
            url: proxy.url(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
            asked: Arc::default(),
            abandoned: Arc::default(),
            live: Arc::default(),
            stopped: Arc::default(),
            ends: Arc::default(),
        }
    }

    /// Lets `n` more starts complete.
    pub fn open(&self, n: usize) {
        self.gate.add_permits(n);
    }

    /// Ends the most recently started container, as if it had exited.
    pub fn end_latest(&self) {
        let ends = self.ends.lock().expect("lock");
        ends.last().expect("a container started").send_replace(true);
    }

    /// A server serving `demo` with this runtime.
    pub async fn server(&self) -> ServerHandle {
        let mut catalog = Catalog::new();
        catalog.insert("demo", None, Arc::new(self.clone()));
        let config = unbudgeted(ServerConfig::new(Credentials::Any, catalog));
        let server = Server::bind("127.0.0.1:0", config).await.expect("bind");
        server.spawn().0
    }
}

/// Counts a start as abandoned unless it completed.
struct StartGuard(Option<Arc<AtomicU64>>);

impl Drop for StartGuard {
    fn drop(&mut self) {
        if let Some(abandoned) = self.0.take() {
            abandoned.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl runloop::runtime::Runtime for Gated {
    fn start(
        &self,
        _limits: runloop::runtime::ContainerLimits,
    ) -> runloop::runtime::BoxFuture<
        '_,
        Result<Box<dyn runloop::runtime::Container>, runloop::runtime::StartError>,
    > {
        Box::pin(async move {
            let mut guard = StartGuard(Some(Arc::clone(&self.abandoned)));
            self.asked.fetch_add(1, Ordering::SeqCst);
            self.gate.acquire().await.expect("never closed").forget();
            guard.0 = None;
            let (end, ended) = tokio::sync::watch::channel(false);
            self.ends.lock().expect("lock").push(end);
            self.live.fetch_add(1, Ordering::SeqCst);
            let container: Box<dyn runloop::runtime::Container> = Box::new(GatedContainer {
                url: self.url.clone(),
                ended,
                live: Arc::clone(&self.live),
                stopped: Arc::clone(&self.stopped),
            });
            Ok(container)
        })
    }
}

#[derive(Debug)]
struct GatedContainer {
    url: String,
    ended: tokio::sync::watch::Receiver<bool>,
    live: Arc<AtomicU64>,
    stopped: Arc<AtomicU64>,
}

impl runloop::runtime::Container for GatedContainer {
    fn proxy_url(&self) -> &str {
        &self.url
    }

    fn ended(&mut self) -> runloop::runtime::BoxFuture<'_, String> {
        Box::pin(async move {
            let ended = self.ended.wait_for(|ended| *ended).await.is_ok();
            if !ended {
                // The test dropped its end of it: never ends by itself.
                std::future::pending::<()>().await;
            }
            "the test ended it".to_owned()
        })
    }

    fn stop(self: Box<Self>) -> runloop::runtime::BoxFuture<'static, ()> {
        self.stopped.fetch_add(1, Ordering::SeqCst);
        Box::pin(std::future::ready(()))
    }
}

impl Drop for GatedContainer {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}
