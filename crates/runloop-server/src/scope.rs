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
//!
//! Each run-loop channel is relayed by a task of its own once its identity
//! has a place for it ([`LoopClaim`](super::budget::LoopClaim)); one past `max_loops_per_identity`
//! gets an error and the finish instead, and no proxy path is opened.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use base64::Engine as _;
use runloop_proto::agents_run::{Image, ImageRef, RunRequest, RunResponse};
use runloop_proto::error_chain::Chain;
use runloop_proto::{ErrorKind, ErrorValue};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span};

use super::budget::Claim;
use super::identity::Identity;
use super::outbox::{Order, ScopeOutbox};
use super::shared::{Held, Shared, Stats};
use super::{proxy_path, relay};
use runloop_metrics::{RunEnd, RunRefusal, TenantFigures};
use runloop_runtime::{Container, ContainerLimits, Puller, Registry, RunTenant};

/// What a run is served with: the server's shared state, the connection's
/// end, who it is served as, its outbox, and its stop.
pub(crate) struct Run {
    pub(crate) shared: Arc<Shared>,
    /// Fires when the connection is ending.
    pub(crate) ended: CancellationToken,
    pub(crate) identity: Identity,
    /// The number its connection is known by in logs.
    pub(crate) connection: u64,
    pub(crate) outbox: ScopeOutbox,
    /// Fires on the caller's stop.
    pub(crate) stop: CancellationToken,
}

/// Serves one run scope until its finish; its run-loop requests come as
/// `orders`.
pub(crate) async fn serve(
    run: Run,
    request: Box<RunRequest>,
    orders: mpsc::UnboundedReceiver<Order>,
) {
    let _held = Held::new(&run.shared, |s: &Stats| &s.scopes);
    // Spawned by the connection, not inside its span: the span names the
    // connection itself; the run's id is added once it has one.
    let span = info_span!(
        "scope",
        connection = run.connection,
        scope = run.outbox.scope(),
        tenant = %run.identity,
        id = tracing::field::Empty,
    );
    async move {
        match run.start(&request).await {
            Ok(container) => run.serve(container, orders).await,
            Err((refusal, error)) => {
                run.shared.metrics.runs_refused.inc(refusal);
                TenantFigures::add(&run.identity.figures.runs_refused, 1);
                info!(%error, "run refused");
                run.outbox.respond(&RunResponse::Error(error.clone()));
                run.outbox.finish(&error);
            }
        }
    }
    .instrument(span)
    .await;
}

/// A started container, counted while it runs, with its run's claim on
/// the budget, given back once it has stopped.
struct Running {
    container: Box<dyn Container>,
    _held: Held,
    claim: Claim,
}

impl Running {
    async fn stop(self) {
        self.container.stop().await;
        drop(self.claim);
    }
}

impl Run {
    /// Checks the request, starts its container and registers its agent;
    /// a refusal says, besides its error, how it is counted.
    async fn start(&self, request: &RunRequest) -> Result<Running, (RunRefusal, ErrorValue)> {
        let shared = &self.shared;
        let refused = |reason| move |error| (reason, error);
        request.validate().map_err(|why| {
            (
                RunRefusal::Request,
                ErrorValue::kind(ErrorKind::Request, why),
            )
        })?;
        let container = &request.container;
        let source = match (&container.image, &shared.config.registry) {
            (Image::Server(image), _) => Source::Catalog(image),
            (Image::Registry(image), Some(registry)) => {
                Source::Registry(&image.reference, registry)
            }
            _ => {
                return Err((
                    RunRefusal::Policy,
                    ErrorValue::kind(
                        ErrorKind::Policy,
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
                ErrorValue::kind(
                    ErrorKind::Policy,
                    format!(
                        "{list} is refused: this server holds no volumes, identities or FUSE sessions"
                    ),
                ),
            ));
        }
        let claim = shared
            .ledger
            .claim_run(&self.identity, container.memory, container.disk)?;
        let (runtime, name) = match source {
            Source::Catalog(image) => {
                let runtime = shared.config.catalog.resolve(image).map_err(|why| {
                    (RunRefusal::Policy, ErrorValue::kind(ErrorKind::Policy, why))
                })?;
                (runtime, image.name.as_str())
            }
            Source::Registry(reference, registry) => {
                info!(%reference, "pulling the image");
                let puller = Puller {
                    tenant: self.identity.name().to_owned(),
                    max_pulls: shared
                        .tenants
                        .shares(&self.identity)
                        .ok()
                        .flatten()
                        .map(|shares| shares.max_pulls),
                };
                let pulled = self
                    .unless_ended(registry.resolve(reference, puller))
                    .await
                    .map_err(refused(RunRefusal::Abandoned))?;
                let runtime = pulled
                    .map_err(|why| (RunRefusal::Policy, ErrorValue::kind(why.kind, why.message)))?;
                (runtime, reference)
            }
        };
        // What the run shares with its tenant's others: one CPU weight
        // and one log rate (protocol §12, "fair shares").
        let tenant = RunTenant {
            name: Arc::from(self.identity.name()),
            cpu_weight: shared
                .tenants
                .shares(&self.identity)
                .ok()
                .flatten()
                .map_or(shared.config.tenant_cpu_weight, |shares| shares.cpu_weight),
            log_rate: Some(shared.config.tenant_log_rate),
        };
        let limits = ContainerLimits {
            memory: container.memory,
            disk: container.disk,
            tenant,
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
                // What its disk already holds is written, not still to be.
                claim.disk_file(container.disk_file().map(ToOwned::to_owned));
                container
            }
            Err(why) => {
                shared.metrics.runtime_failures.inc();
                return Err((
                    RunRefusal::Runtime,
                    ErrorValue::kind(ErrorKind::Runtime, Chain(&why)),
                ));
            }
        };
        let running = Running {
            container,
            _held: Held::new(shared, |s: &Stats| &s.containers),
            claim,
        };
        let registered = self
            .unless_ended(proxy_path::register(
                &proxy_path::Place::of(&*running.container),
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
    async fn unless_ended<F: Future>(&self, work: F) -> Result<F::Output, ErrorValue> {
        tokio::select! {
            biased;
            () = self.stop.cancelled() => {
                Err(ErrorValue::kind(ErrorKind::Run, "the run was stopped before its container ran"))
            }
            () = self.ended.cancelled() => Err(self.connection_ending()),
            output = work => Ok(output),
        }
    }

    fn connection_ending(&self) -> ErrorValue {
        self.connection_ended().1
    }

    /// Why the connection's end ends a run: the server's shutdown, the
    /// end of its revocation grace, or the caller's connection.
    fn connection_ended(&self) -> (RunEnd, ErrorValue) {
        if self.shared.shutdown.is_cancelled() {
            (
                RunEnd::Shutdown,
                ErrorValue::kind(ErrorKind::Server, "the server is shutting down"),
            )
        } else if self.identity.is_revoked() {
            (
                RunEnd::Revoked,
                ErrorValue::kind(
                    ErrorKind::Policy,
                    format!(
                        "tenant {}'s credential was revoked by a reload, and the revocation \
                         grace ({:?}) is over: the connection is closed",
                        self.identity, self.shared.config.revoked_grace
                    ),
                ),
            )
        } else {
            (
                RunEnd::Disconnect,
                ErrorValue::kind(ErrorKind::Server, "the caller's connection ended"),
            )
        }
    }

    /// Serves the running container's channels until the run ends, then
    /// ends everything in order.
    async fn serve(&self, mut running: Running, mut orders: mpsc::UnboundedReceiver<Order>) {
        let metrics = &self.shared.metrics;
        let id = match RunId::mint(&self.shared) {
            Ok(id) => id,
            Err(error) => {
                running.stop().await;
                metrics.runs_refused.inc(RunRefusal::Server);
                TenantFigures::add(&self.identity.figures.runs_refused, 1);
                self.outbox.respond(&RunResponse::Error(error.clone()));
                return self.outbox.finish(&error);
            }
        };
        tracing::Span::current().record("id", id.0.as_str());
        metrics.runs_started.inc();
        TenantFigures::add(&self.identity.figures.runs_started, 1);
        self.outbox.respond(&RunResponse::Id(id.0.clone()));
        info!("running");
        let run: Arc<str> = Arc::from(id.0.as_str());
        let proxy = proxy_path::Place::of(&*running.container);
        let (ending, ending_seen) = watch::channel(None::<ErrorValue>);
        let relays = TaskTracker::new();
        let (end, why) = loop {
            tokio::select! {
                biased;
                () = self.stop.cancelled() => break (RunEnd::Stop, ErrorValue::kind(ErrorKind::Run, "the run was stopped")),
                () = self.ended.cancelled() => break self.connection_ended(),
                why = running.container.ended() => {
                    break (RunEnd::Container, ErrorValue::kind(ErrorKind::Container, format!("the container ended: {why}")));
                }
                Some(order) = orders.recv() => {
                    let outbox = self.outbox.channel(order.channel);
                    match self.shared.ledger.claim_loop(&self.identity) {
                        Ok(claim) => {
                            relays.spawn(relay::serve(
                                Arc::clone(&self.shared),
                                outbox,
                                order.request,
                                proxy.clone(),
                                ending_seen.clone(),
                                (self.connection, Arc::clone(&run)),
                                claim,
                            ));
                        }
                        Err(error) => {
                            debug!(channel = order.channel, %error, "loop refused");
                            relay::refuse(&self.shared, &self.identity, outbox, error);
                        }
                    }
                }
            }
        };
        metrics.runs_ended.inc(end);
        info!(reason = %why, "run ending");
        if matches!(end, RunEnd::Container) {
            // A container that ended by itself leaves its loops' proxies up
            // for a moment, and each says how its loop ended: the chunks the
            // agent program sent before it died, then the error in the
            // runtime's words. Cut at once, the loop would lose both to the
            // run's reason.
            // A stop or the connection's end cuts the wait short.
            relays.close();
            tokio::select! {
                _ = tokio::time::timeout(CONTAINER_DRAIN, relays.wait()) => {}
                () = self.stop.cancelled() => {}
                () = self.ended.cancelled() => {}
            }
        }
        ending.send_replace(Some(why.clone()));
        relays.close();
        relays.wait().await;
        running.stop().await;
        drop(id);
        self.outbox.finish(&why);
    }
}

/// How long the loops of a container that ended by itself may take to end
/// as its proxy tells them, before the run's end cuts them.
const CONTAINER_DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

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
    fn mint(shared: &Arc<Shared>) -> Result<RunId, ErrorValue> {
        loop {
            let mut bytes = [0u8; 16];
            getrandom::fill(&mut bytes).map_err(|why| {
                ErrorValue::kind(
                    ErrorKind::Server,
                    format!("no randomness for a run id: {why}"),
                )
            })?;
            let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
            if shared.take_id(&id) {
                return Ok(RunId(id, Arc::clone(shared)));
            }
        }
    }
}

impl Drop for RunId {
    fn drop(&mut self) {
        self.1.give_back_id(&self.0);
    }
}
