//! One run: a `containers::agents::run` scope from its request to its
//! finish (protocol §5, §6, §12).
//!
//! ```text
//! request ──validate, policy, catalog or registry──▶ refused: [1] error, finish
//!    │
//!    ▼ runtime.start ──▶ /agent/register ──▶ [0] {"id"} ──▶ serving channels
//!                                                              │
//!    stop channel │ container ends │ connection ends │ server shuts down
//!                                                              ▼
//!              every channel ends with an error, the container stops, finish
//! ```
//!
//! Before the id, anything that ends the run (a stop, the connection, the
//! server) still answers the main stream with one error, so the caller never
//! reads a bare finish ("not served") for a run that was in fact refused or
//! abandoned. After the id the main stream carries nothing but the finish.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use base64::Engine as _;
use bytes::Bytes;
use runloop_proto::agents_run::{Image, ImageRef, RunRequest, RunResponse};
use runloop_proto::{Encode, Error};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span};

use super::connection::Conn;
use super::{Held, Shared, Stats, proxy_path, relay};
use crate::metrics::{RunEnd, RunRefusal};
use crate::runtime::{Container, Limits, Registry};

/// A run-loop channel request, handed from the connection to its scope.
#[derive(Debug)]
pub(crate) struct Order {
    /// The client's channel number.
    pub(crate) channel: u32,
    /// The request's JSON, as the caller sent it.
    pub(crate) request: Bytes,
}

/// Serves one run scope until its finish.
pub(crate) async fn serve(
    conn: Arc<Conn>,
    scope: u32,
    request: Box<RunRequest>,
    stop: CancellationToken,
    orders: mpsc::UnboundedReceiver<Order>,
) {
    let _held = Held::new(conn.shared(), |s: &Stats| &s.scopes);
    // Spawned by the connection, not inside its span: the span names the
    // connection itself; the run's id is added once it has one.
    let span = info_span!(
        "scope",
        connection = conn.number,
        scope,
        identity = %conn.identity,
        id = tracing::field::Empty,
    );
    let run = Run { conn, scope, stop };
    async move {
        match run.start(&request).await {
            Ok(container) => run.serve(container, orders).await,
            Err((refusal, error)) => {
                run.conn.shared().metrics.runs_refused.inc(refusal);
                info!(%error, "run refused");
                run.respond(&RunResponse::Error(error.clone()));
                run.conn.finish_scope(scope, &error);
            }
        }
    }
    .instrument(span)
    .await;
}

struct Run {
    conn: Arc<Conn>,
    scope: u32,
    stop: CancellationToken,
}

/// A started container, counted while it runs.
struct Running {
    container: Box<dyn Container>,
    _held: Held,
}

impl Running {
    async fn stop(self) {
        self.container.stop().await;
    }
}

impl Run {
    /// Checks the request, starts its container and registers its agent;
    /// a refusal says, besides its error, how it is counted.
    async fn start(&self, request: &RunRequest) -> Result<Running, (RunRefusal, Error)> {
        let shared = self.conn.shared();
        let refused = |reason| move |error| (reason, error);
        request
            .validate()
            .map_err(|why| (RunRefusal::Request, Error::kind("request", why)))?;
        let container = &request.container;
        let source = match (&container.image, &shared.config.registry) {
            (Image::Server(image), _) => Source::Catalog(image),
            (Image::Registry(image), Some(registry)) => {
                Source::Registry(&image.reference, registry)
            }
            _ => {
                return Err((
                    RunRefusal::Policy,
                    Error::kind(
                        "policy",
                        format!(
                            "{} images are not run here; only server images from this server's catalog",
                            container.image.source()
                        ),
                    ),
                ));
            }
        };
        if let Some(list) = first_mount_list(request) {
            return Err((
                RunRefusal::Policy,
                Error::kind(
                    "policy",
                    format!(
                        "{list} is refused: this server holds no volumes, identities or FUSE sessions"
                    ),
                ),
            ));
        }
        let (runtime, name) = match source {
            Source::Catalog(image) => {
                let runtime = shared
                    .config
                    .catalog
                    .resolve(image)
                    .map_err(|why| (RunRefusal::Policy, Error::kind("policy", why)))?;
                (runtime, image.name.as_str())
            }
            Source::Registry(reference, registry) => {
                info!(%reference, "pulling the image");
                let pulled = self
                    .unless_ended(registry.resolve(reference))
                    .await
                    .map_err(refused(RunRefusal::Abandoned))?;
                let runtime = pulled
                    .map_err(|why| (RunRefusal::Policy, Error::kind(why.kind, why.message)))?;
                (runtime, reference)
            }
        };
        let limits = Limits {
            memory: container.memory,
            disk: container.disk,
        };
        info!(image = %name, "starting the container");
        let starting = Instant::now();
        let started = self
            .unless_ended(runtime.start(limits))
            .await
            .map_err(refused(RunRefusal::Abandoned))?;
        let container = match started {
            Ok(container) => {
                shared.metrics.runtime_start.observe(starting.elapsed());
                container
            }
            Err(why) => {
                shared.metrics.runtime_failures.inc();
                return Err((RunRefusal::Runtime, Error::kind("runtime", why)));
            }
        };
        let running = Running {
            container,
            _held: Held::new(shared, |s: &Stats| &s.containers),
        };
        let registered = self
            .unless_ended(proxy_path::register(
                running.container.proxy_url(),
                &request.agent,
                &shared.config.limits,
            ))
            .await;
        match registered {
            Ok(Ok(())) => Ok(running),
            Ok(Err(error)) => {
                running.stop().await;
                Err((RunRefusal::Registration, error))
            }
            Err(error) => {
                running.stop().await;
                Err((RunRefusal::Abandoned, error))
            }
        }
    }

    /// Runs `work` unless the run is stopped or the connection ends first.
    async fn unless_ended<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        tokio::select! {
            biased;
            () = self.stop.cancelled() => {
                Err(Error::kind("run", "the run was stopped before its container ran"))
            }
            () = self.conn.ended.cancelled() => Err(self.connection_ending()),
            output = work => Ok(output),
        }
    }

    fn connection_ending(&self) -> Error {
        self.connection_ended().1
    }

    /// Why the connection's end ends a run: the server's shutdown, or the
    /// caller's connection.
    fn connection_ended(&self) -> (RunEnd, Error) {
        if self.conn.shared().shutdown.is_cancelled() {
            (
                RunEnd::Shutdown,
                Error::kind("server", "the server is shutting down"),
            )
        } else {
            (
                RunEnd::Disconnect,
                Error::kind("server", "the caller's connection ended"),
            )
        }
    }

    fn respond(&self, response: &RunResponse) {
        let message = runloop_proto::frame::build(
            runloop_proto::frame::FrameType::Response,
            self.scope,
            0,
            response.size_hint(),
            |out| response.encode(out),
        );
        if let Ok(message) = message {
            self.conn.queue_in_scope(self.scope, message);
        }
    }

    /// Serves the running container's channels until the run ends, then
    /// ends everything in order.
    async fn serve(&self, mut running: Running, mut orders: mpsc::UnboundedReceiver<Order>) {
        let metrics = &self.conn.shared().metrics;
        let id = match RunId::mint(self.conn.shared()) {
            Ok(id) => id,
            Err(error) => {
                running.stop().await;
                metrics.runs_refused.inc(RunRefusal::Server);
                self.respond(&RunResponse::Error(error.clone()));
                return self.conn.finish_scope(self.scope, &error);
            }
        };
        tracing::Span::current().record("id", id.0.as_str());
        metrics.runs_started.inc();
        self.respond(&RunResponse::Id(id.0.clone()));
        info!("running");
        let run: Arc<str> = Arc::from(id.0.as_str());
        let proxy_url = running.container.proxy_url().to_owned();
        let (ending, ending_seen) = watch::channel(None::<Error>);
        let relays = TaskTracker::new();
        let (end, why) = loop {
            tokio::select! {
                biased;
                () = self.stop.cancelled() => break (RunEnd::Stop, Error::kind("run", "the run was stopped")),
                () = self.conn.ended.cancelled() => break self.connection_ended(),
                why = running.container.ended() => {
                    break (RunEnd::Container, Error::kind("container", format!("the container ended: {why}")));
                }
                Some(order) = orders.recv() => {
                    relays.spawn(relay::serve(
                        Arc::clone(&self.conn),
                        self.scope,
                        order,
                        proxy_url.clone(),
                        ending_seen.clone(),
                        Arc::clone(&run),
                    ));
                }
            }
        };
        metrics.runs_ended.inc(end);
        info!(reason = %why, "run ending");
        ending.send_replace(Some(why.clone()));
        relays.close();
        relays.wait().await;
        running.stop().await;
        drop(id);
        self.conn.finish_scope(self.scope, &why);
    }
}

/// Where a run's image comes from, once policy allows it.
enum Source<'a> {
    /// A `server` image of the catalog.
    Catalog(&'a ImageRef),
    /// A `registry` image, pulled by the server's registry.
    Registry(&'a str, &'a Arc<dyn Registry>),
}

/// The first mount list that is not empty, by its wire name.
fn first_mount_list(request: &RunRequest) -> Option<&'static str> {
    let c = &request.container;
    [
        ("volume_mounts", c.volume_mounts.is_empty()),
        ("identity_file_mounts", c.identity_file_mounts.is_empty()),
        (
            "identity_directory_mounts",
            c.identity_directory_mounts.is_empty(),
        ),
        ("fuse_file_mounts", c.fuse_file_mounts.is_empty()),
        ("fuse_directory_mounts", c.fuse_directory_mounts.is_empty()),
    ]
    .into_iter()
    .find_map(|(name, empty)| (!empty).then_some(name))
}

/// A run's id, unique among the server's running containers while it lives.
struct RunId(String, Arc<Shared>);

impl RunId {
    /// 128 bits from the OS's randomness, base64url: unguessable, and not
    /// derived from anything in the request.
    fn mint(shared: &Arc<Shared>) -> Result<RunId, Error> {
        loop {
            let mut bytes = [0u8; 16];
            getrandom::fill(&mut bytes).map_err(|why| {
                Error::kind("server", format!("no randomness for a run id: {why}"))
            })?;
            let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
            let mut ids = shared
                .ids
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if ids.insert(id.clone()) {
                return Ok(RunId(id, Arc::clone(shared)));
            }
        }
    }
}

impl Drop for RunId {
    fn drop(&mut self) {
        let mut ids = self
            .1
            .ids
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        ids.remove(&self.0);
    }
}
