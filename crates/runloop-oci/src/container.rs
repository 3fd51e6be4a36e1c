//! One container's life: made, started, watched, stopped and removed.
//!
//! ```text
//! start:  run dir ─▶ ┬ disk (a copy of its size's template, loop, ext4) ─▶ overlay root ┬─▶ config.json
//!                    └ netns (lo; egress veth if on) ────────────────────────────────┘
//!         ─▶ runc run --keep ─▶ agent listens on 127.0.0.1:PORT in the netns ─▶ proxy (dials it through the link)
//!         (any failure, or the start given up on: teardown)
//! end:    by itself (exit, OOM) or stop: signal, grace, SIGKILL to all, runc delete,
//!         netns gone, overlay and disk unmounted (loop detached), run dir removed
//! ```
//!
//! The `runc run` child is a supervised agent
//! ([`runloop_runtime::supervised`]), as an exec runtime's program is: the
//! same readiness loop, the same words for its end, the same policy. It
//! reports the end as soon as it knows it (so the run's loops end with the
//! reason, and a loop the agent's death cut short says so in words: `the
//! agent program exited (exit status 3) before its /run body ended`), then
//! tears everything down; [`Container::stop`] resolves once the teardown
//! is done. A container dropped without `stop` is still stopped and torn
//! down by its supervisor. What is this runtime's own is in [`Agent`]'s
//! implementation here: the probe made in the run's network namespace,
//! runc's signals and exit codes, the cgroup's OOM count, the teardown.
//!
//! Nothing is left behind, whatever ends a run and when. A start runs on
//! a task of the host's tracker; the caller's future only waits for its
//! answer. A start given up on (the caller left, the drain ended, a second
//! signal) finishes the step under way — a `mount` or `ip` killed half-way
//! could land after a teardown — and then removes everything it made; a
//! start that fails does the same before it answers. Supervisors run on
//! the tracker too, and the server waits for it before it exits
//! ([`Host::close`], which also stops whatever still runs and sweeps the
//! store once more). Teardown works from the run's key alone
//! ([`crate::teardown`]), so a server restarted after a crash removes the
//! leftovers of its runs the same way.
//!
//! The agent is reached only through sockets made inside the run's network
//! namespace (module [`network`]): the readiness probe, and every
//! connection the proxy makes through the [`link`](crate::link). The
//! agent program listens on `127.0.0.1:$PORT`, as under exec.

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, OnceLock};

use runloop_proto::error_chain::Chain;
use runloop_runtime::cgroup::{TenantHold, Tenants};
use runloop_runtime::netns::{Diag, Listening};
use runloop_runtime::output::TenantLog;
use runloop_runtime::steps::Steps;
use runloop_runtime::supervised::{self, Agent, NotReady, Supervisor};
use runloop_runtime::{BoxFuture, Container, ContainerLimits, Reserve, Runtime, StartError};
use tokio::process::Child;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::bundle::{self, Bundle};
use crate::cgroup;
use crate::digest::Digest;
use crate::disk;
use crate::gc::Hold;
use crate::host::{Host, HostError};
use crate::image::Image;
use crate::layout::{Layout, LayoutError};
use crate::link::{Link, Watch};
use crate::network::{self, Netns};
use crate::pool::{Pool, PoolConfig};
use crate::run::{OciContainer, OciRun};
use crate::runc;
use crate::store::Unpacked;
use crate::user;

/// The smallest memory limit a container may have: below it runc's own
/// start-up does not fit in the cgroup.
pub const MIN_MEMORY: u64 = 6 << 20;

/// A runtime whose containers run one unpacked image.
#[derive(Debug, Clone)]
pub struct OciRuntime {
    host: Arc<Host>,
    image: Arc<Unpacked>,
    /// Its warm pool, once it keeps one ([`OciRuntime::keep_warm`]);
    /// shared by its clones.
    pool: Arc<OnceLock<Arc<Pool>>>,
}

impl OciRuntime {
    /// Runs `image` on `host`.
    pub fn new(host: Arc<Host>, image: Unpacked) -> OciRuntime {
        OciRuntime {
            host,
            image: Arc::new(image),
            pool: Arc::default(),
        }
    }

    /// The image.
    pub fn image(&self) -> &Unpacked {
        &self.image
    }

    /// Keeps `config.size` containers of this image started, each of
    /// `config.memory` and `config.disk` claimed of `reserve` (the server's
    /// budgets), for runs to take ([`crate::pool`]); refilled in the
    /// background until the host closes. Once per runtime (and its
    /// clones); a size of 0 keeps none.
    pub fn keep_warm(&self, config: PoolConfig, reserve: Arc<dyn Reserve>) {
        if config.size == 0 {
            return;
        }
        let pool = Arc::new(Pool::new(config, self.host.cgroups()));
        if self.pool.set(Arc::clone(&pool)).is_err() {
            return;
        }
        info!(image = %self.image.image.digest, size = config.size, memory = config.memory, disk = config.disk, "keeping containers warm");
        let runtime = self.clone();
        let start = move |limits| {
            let runtime = runtime.clone();
            async move { runtime.spawn_cold(limits).await }
        };
        let closing = self.host.closing().clone();
        self.host
            .tasks()
            .spawn(crate::pool::refill(pool, start, closing, reserve));
    }

    /// Warm containers ready now (0 without a pool).
    pub fn warm(&self) -> usize {
        self.pool.get().map_or(0, |pool| pool.len())
    }

    /// Starts one container for a run: a warm one held to `limits` when
    /// the pool has one they fit, else a cold start ([`OciRuntime::spawn_cold`]).
    /// [`Runtime::start`] is this, boxed.
    pub async fn spawn(&self, limits: ContainerLimits) -> Result<OciContainer, StartError> {
        if let Some(pool) = self.pool.get()
            && let Some(container) = pool.take(&limits).await
        {
            info!(key = %container.runtime().key(), memory = limits.memory, disk = limits.disk, "a warm container goes to a run");
            return Ok(container);
        }
        self.spawn_cold(limits).await
    }

    /// Starts one container; resolves once its agent accepts TCP and its
    /// proxy listens.
    ///
    /// The start runs on a task of the host's tracker, and this future only
    /// waits for its answer: dropping it (the caller left, the server is
    /// shutting down) gives the start up, and the task then tears down
    /// everything it made — after the step under way has finished, so that
    /// no `mount` or `ip` killed half-way lands after the teardown.
    pub async fn spawn_cold(&self, limits: ContainerLimits) -> Result<OciContainer, StartError> {
        let (answer_tx, answer) = tokio::sync::oneshot::channel();
        let abandoned = CancellationToken::new();
        let _give_up_when_dropped = abandoned.clone().drop_guard();
        let runtime = self.clone();
        self.host.tasks().spawn(async move {
            let started = runtime.start_owned(limits, abandoned).await;
            if let Err(Ok(container)) = answer_tx.send(started) {
                // Given up on just as it became ready.
                container.terminate().await;
            }
        });
        answer.await.unwrap_or_else(|_| {
            Err(StartError::new(
                "the container's start ended without an answer (the server is shutting down)",
            ))
        })
    }

    /// [`OciRuntime::spawn`]'s work, on the host's tracker; gives up (and
    /// removes what it made) when `abandoned` fires.
    async fn start_owned(
        &self,
        limits: ContainerLimits,
        abandoned: CancellationToken,
    ) -> Result<OciContainer, StartError> {
        if limits.memory < MIN_MEMORY {
            return Err(StartError::new(format!(
                "memory {} bytes is below the container minimum of {MIN_MEMORY} bytes (6 MiB)",
                limits.memory
            )));
        }
        if limits.disk < disk::MIN_DISK {
            return Err(StartError::new(format!(
                "disk {} bytes is below the container minimum of {} bytes (1 MiB)",
                limits.disk,
                disk::MIN_DISK
            )));
        }
        let mut steps = Steps::start();
        // The image is used now, and held until the run is torn down.
        self.image.hold.touch();
        let key = crate::random_name();
        // The run's cgroup goes below its tenant's, whose CPU weight the
        // tenant's runs share (exec runs included).
        let tenant = match Tenants::of_host() {
            Some(tenants) => Some(
                tenants
                    .hold(&limits.tenant.name, limits.tenant.cpu_weight)
                    .map_err(|error| {
                        StartError::new(format!(
                            "cannot make the cgroup of tenant {}: {error}",
                            limits.tenant.name
                        ))
                    })?,
            ),
            None => None,
        };
        let cgroup = match &tenant {
            Some(tenant) => format!("/{}/{}", tenant.cgroup().path(), runc::id(&key)),
            None => cgroup::path(&runc::id(&key)),
        };
        let run = Run {
            host: Arc::clone(&self.host),
            key,
            armed: true,
            image: self.image.hold.clone(),
            cgroup,
            tenant,
        };
        let log = limits.tenant.log();
        let made = self.make(&run, &limits, &mut steps).await;
        let (netns, diag, child) = match made {
            Ok(_) if abandoned.is_cancelled() => {
                warn!(key = %run.key, "a container start was given up on; removing what it made");
                run.remove().await;
                return Err(StartError::new(GIVEN_UP));
            }
            Ok(made) => made,
            Err(why) => {
                warn!(key = %run.key, %why, "container did not start");
                run.remove().await;
                return Err(StartError::new(why));
            }
        };
        let disk = disk::image(&run.dir());
        let started = Started {
            run,
            netns,
            diag,
            port: bundle::port(&self.image.image.process),
            stop_signal: self
                .image
                .image
                .process
                .stop_signal
                .clone()
                .unwrap_or_else(|| "SIGTERM".to_owned()),
        };
        // Its disk file's blocks are what it has written of its disk.
        started
            .ready(child, log, &abandoned, steps)
            .await
            .map(|container| container.with_disk_file(disk))
    }

    /// Makes the run's files, mounts, network and configuration, and starts
    /// runc.
    async fn make(
        &self,
        run: &Run,
        limits: &ContainerLimits,
        steps: &mut Steps,
    ) -> Result<(Netns, Diag, Child), String> {
        let key = run.key.as_str();
        let dir = run.dir();
        let ids = self.host.config().ids;
        // 0710 with the containers' root group: runc sets the container up
        // as that root (see `Store::with_ids`).
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .and_then(|()| {
                std::os::unix::fs::chown(&dir, Some(0), Some(ids.gids.start))?;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o710))
            })
            .map_err(|error| {
                format!("cannot make the run's directory {}: {error}", dir.display())
            })?;
        steps.mark("dir");
        let process = &self.image.image.process;
        crate::init::find_program(&self.image.rootfs, &process.args, &process.env)?;
        let user = user::resolve(&self.image.rootfs, process.user.as_deref())?;
        if user.uid >= ids.uids.count || user.gid >= ids.gids.count {
            return Err(format!(
                "the image's user {}:{} is past the {} ids a container has",
                user.uid, user.gid, ids.uids.count
            ));
        }
        steps.mark("image");
        // The disk and the network do not wait for each other; a start that
        // fails in one has the other finish, and the run's teardown
        // removes both.
        let (disk, network) = tokio::join!(
            async {
                disk::create(&dir, limits.disk, self.host.disks(), &self.image.rootfs)
                    .await
                    .map_err(|error| {
                        format!("cannot make the run's disk and root: {}", Chain(&error))
                    })
            },
            async {
                let netns = network::create(key)
                    .await
                    .map_err(|error| format!("cannot make the run's network: {}", Chain(&error)))?;
                let diag = netns.diag().await.map_err(|error| {
                    format!(
                        "cannot ask who listens in the run's network namespace: {}",
                        Chain(&error)
                    )
                })?;
                let resolv_conf = self.egress(key, &dir).await?;
                Ok::<_, String>((netns, diag, resolv_conf))
            }
        );
        disk?;
        let (netns, diag, resolv_conf) = network?;
        steps.mark("disk+netns");
        let id = runc::id(key);
        let spec = Bundle {
            process,
            ids: user,
            run: &dir,
            hostname: key,
            netns: network::namespace_path(key),
            cgroup: run.cgroup.clone(),
            memory: limits.memory,
            swap: self.host.cgroups().accounts_swap(),
            pids: self.host.config().pids,
            mapping: ids,
            cpus: self.host.config().cpus,
            nofile: self.host.config().nofile,
            init: self.host.init().map(|source| bundle::InitMount {
                source: source.to_owned(),
            }),
            resolv_conf,
            sandbox: self.host.runc().kind() == runc::Kind::Runsc,
            filter: self.host.filter(),
        }
        .spec()
        .map_err(|error| Chain(&error).to_string())?;
        let config = dir.join("config.json");
        bundle::save(&spec, &config)?;
        steps.mark("bundle");
        let child = self
            .host
            .runc()
            .run_command(&dir, &id)
            .spawn()
            .map_err(|error| format!("cannot start runc: {error}"))?;
        steps.mark("spawn");
        info!(%key, image = %self.image.image.digest, memory = limits.memory, disk = limits.disk, "container starting");
        Ok((netns, diag, child))
    }
}

impl OciRuntime {
    /// Gives the run its way out, when the host has egress on; the
    /// resolver configuration to bind into it, if any.
    async fn egress(&self, key: &str, dir: &Path) -> Result<Option<PathBuf>, String> {
        let Some(egress) = self.host.egress() else {
            return Ok(None);
        };
        let link = egress.attach(key, dir).await.map_err(|error| {
            format!(
                "cannot give the run its egress link: {error}",
                error = Chain(&error)
            )
        })?;
        info!(%key, link = %link.name, address = %link.run, gateway = %link.host, "container egress");
        Ok(egress.resolv_conf(dir))
    }
}

impl Runtime for OciRuntime {
    fn start(
        &self,
        limits: ContainerLimits,
    ) -> BoxFuture<'_, Result<Box<dyn Container>, StartError>> {
        supervised::boxed(self.spawn(limits))
    }
}

/// Why a start given up on failed (nobody reads it: its caller is gone).
const GIVEN_UP: &str = "the container's start was given up on";

/// A run's claim on the machine, from its directory on: dropped while
/// armed (its task dropped with the runtime), it has the run torn down on
/// the host's tracker.
struct Run {
    host: Arc<Host>,
    key: String,
    /// Whether the run's things may still be on the machine.
    armed: bool,
    /// The image under the run's root: no collection removes it first.
    image: Hold,
    /// The path of the container's cgroup, below its tenant's.
    cgroup: String,
    /// The run's hold on its tenant's cgroup, given back once the run's
    /// own cgroup is gone.
    tenant: Option<TenantHold>,
}

impl Run {
    /// The run's directory.
    fn dir(&self) -> PathBuf {
        self.host.store().runs().join(&self.key)
    }

    /// Kills what runs and removes everything of the run, now.
    async fn remove(mut self) {
        self.armed = false;
        end_now(&self.host, &self.key).await;
    }
}

impl Drop for Run {
    /// A run dropped armed: its task was dropped (the runtime is going
    /// away without [`Host::close`]) — the teardown is tried on the
    /// tracker, and the next server's sweep removes what it cannot.
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Without a runtime there is nothing to run a teardown on; the
        // server's closing sweep, or the next server's, removes the run.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let host = Arc::clone(&self.host);
        let key = std::mem::take(&mut self.key);
        let image = self.image.clone();
        let tenant = self.tenant.take();
        warn!(%key, "a run's task was dropped; removing what it made");
        let tasks = host.tasks().clone();
        tasks.spawn_on(
            async move {
                end_now(&host, &key).await;
                drop(image);
                drop(tenant);
            },
            &runtime,
        );
    }
}

/// Kills every process of the run's container, then tears the run down.
async fn end_now(host: &Host, key: &str) {
    let id = runc::id(key);
    // "does not exist": runc had not made it yet, or it is gone already.
    if let Err(error) = host.runc().kill(&id, "SIGKILL", true).await
        && !error.says("does not exist")
        && !error.says("not running")
    {
        warn!(%id, %error, "cannot kill the container");
    }
    host.teardown(key).await;
}

/// A container whose runc has started: the oci runtime's side of a
/// supervised agent.
struct Started {
    run: Run,
    netns: Netns,
    /// Who listens in the run's namespace: the readiness probe.
    diag: Diag,
    port: u16,
    stop_signal: String,
}

impl Started {
    /// Waits for the agent to accept TCP, then puts the proxy in front of
    /// it (dialing it through the [`Link`]) and hands runc's child to its
    /// supervisor.
    async fn ready(
        self,
        child: Child,
        log: Option<TenantLog>,
        abandoned: &CancellationToken,
        mut steps: Steps,
    ) -> Result<OciContainer, StartError> {
        let host = Arc::clone(&self.run.host);
        let key = self.run.key.clone();
        // The host's close stops every container.
        let mut supervisor = Supervisor::new(
            child,
            Arc::from(runc::id(&key)),
            host.config().output,
            log,
            host.closing().child_token(),
            host.config().grace,
        );
        let watch = Arc::new(Memory {
            host: Arc::clone(&host),
            id: runc::id(&key),
            cgroup: self.run.cgroup.clone(),
            ended: supervisor.end_now().clone(),
        });
        let dir = self.run.dir();
        let link = Link::new(&self.netns, self.port, watch);
        let timeout = host.config().startup_timeout;
        let listened = tokio::select! {
            listened = supervisor.listening(&self, self.port, timeout) => listened.map_err(NotReady::words),
            () = abandoned.cancelled() => Err(GIVEN_UP.to_owned()),
        }
        .map_err(|why| match runc::last_error(&dir) {
            Some(runc) => format!("{why} ({runc})"),
            None => why,
        });
        let served = match listened {
            Ok(()) => {
                steps.mark("ready");
                let run = OciRun::new(key.clone(), dir, self.run.cgroup.clone());
                supervisor.serve(self, link, run).await
            }
            Err(why) => {
                supervisor.give_up(self).await;
                Err(why)
            }
        };
        match served {
            Ok(container) => {
                steps.mark("proxy");
                let key = container.runtime().key();
                info!(%key, url = container.proxy_url(), "oci container ready");
                debug!(%key, %steps, "start steps");
                Ok(container)
            }
            Err(why) => {
                warn!(%key, %why, "container did not become ready");
                Err(StartError::new(why))
            }
        }
    }
}

impl Agent for Started {
    const WHAT: &'static str = "the container";

    /// Something listening on `PORT` in the run's network namespace where
    /// `127.0.0.1` reaches it, as the kernel's socket diagnostics there
    /// say (a question, not a connection, while nothing listens); then
    /// one connection made in the namespace, which it must accept.
    async fn probe(&self) -> Result<bool, NotReady> {
        let failed = |error: io::Error| {
            NotReady::Failed(format!(
                "cannot reach the agent program in the run's network namespace {}: {error}",
                self.netns.name()
            ))
        };
        let found = self.diag.listening(self.port).map_err(failed)?;
        if !found.iter().any(Listening::reached_from_loopback) {
            return Ok(false);
        }
        match self.netns.connect(self.port).await {
            Ok(_) => Ok(true),
            // No longer listening.
            Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => Ok(false),
            Err(error) => Err(failed(error)),
        }
    }

    /// runc's exit status in words (runc exits with 128+N for a container
    /// killed by signal N).
    fn describe(&self, status: io::Result<ExitStatus>) -> String {
        match status {
            Ok(status) => match status.code() {
                Some(code) if code > 128 => format!("killed by signal {}", code - 128),
                Some(code) => format!("exit status {code}"),
                None => status.to_string(),
            },
            Err(error) => format!("its status could not be read: {error}"),
        }
    }

    /// The container cgroup's count; under runsc, whose cgroup (and its
    /// count) goes with the sandbox the kernel killed, the kernel's log
    /// says instead, and the sandbox is the one process it killed.
    fn oom_kills(&self) -> Option<u64> {
        let id = runc::id(&self.run.key);
        match cgroup::Cgroup::new(self.run.host.cgroups(), &self.run.cgroup).oom_kills() {
            Some(kills) if kills > 0 => Some(kills),
            _ if cgroup::oom_logged(&id) => Some(1),
            counted => counted,
        }
    }

    async fn signal_stop(&self) {
        let id = runc::id(&self.run.key);
        if let Err(error) = self
            .run
            .host
            .runc()
            .kill(&id, &self.stop_signal, false)
            .await
        {
            warn!(%id, %error, "cannot signal the container");
        }
    }

    async fn kill(&self) {
        let id = runc::id(&self.run.key);
        // "does not exist": runc had not made it yet, or it is gone already.
        if let Err(error) = self.run.host.runc().kill(&id, "SIGKILL", true).await
            && !error.says("does not exist")
            && !error.says("not running")
        {
            warn!(%id, %error, "cannot kill the container");
        }
    }

    /// The container's teardown: nothing of the run is left.
    async fn release(mut self) {
        self.run.armed = false;
        self.run.host.teardown(&self.run.key).await;
    }

    /// The host's close waits for its supervisors.
    fn tracker(&self) -> Option<TaskTracker> {
        Some(self.run.host.tasks().clone())
    }
}

/// The link's view of the container: its OOM count and a way to end it.
struct Memory {
    host: Arc<Host>,
    id: String,
    cgroup: String,
    ended: CancellationToken,
}

impl Watch for Memory {
    fn out_of_memory(&self) -> bool {
        match cgroup::Cgroup::new(self.host.cgroups(), &self.cgroup).oom_kills() {
            Some(kills) => kills > 0,
            // Gone with a runsc sandbox the kernel killed: its log says.
            None => cgroup::oom_logged(&self.id),
        }
    }

    fn end_for_memory(&self) {
        self.ended.cancel();
    }
}

/// A layout named the way skopeo names one, `oci:DIR:TAG`, where `DIR` is
/// a layout: the error says that an entry names the directory alone.
fn tagged(dir: &Path, error: LayoutError) -> LayoutError {
    let LayoutError::NotALayout { path, why } = error else {
        return error;
    };
    let layout = dir
        .to_str()
        .and_then(|text| text.rsplit_once(':'))
        .map(|(layout, _)| layout)
        .filter(|layout| !layout.is_empty() && Path::new(layout).join("oci-layout").is_file());
    let why = match layout {
        Some(layout) => format!(
            "{why}; oci:DIR names the layout's directory alone, with no :TAG (oci:{layout} \
             serves the one image it holds)"
        ),
        None => why,
    };
    LayoutError::NotALayout { path, why }
}

// A runtime for an image layout belongs with the runtime it makes: the
// host (below the container) knows nothing of OciRuntime.
impl Host {
    /// A runtime for the image layout at `dir` (`oci:DIR`), checked against
    /// `pin` when given and unpacked into the store; with the image's
    /// digest, which the catalog entry is pinned to.
    pub async fn layout(
        self: &Arc<Self>,
        dir: &Path,
        pin: Option<&str>,
    ) -> Result<(Digest, OciRuntime), HostError> {
        let image_error = |source| HostError::Image {
            dir: dir.to_owned(),
            source,
        };
        let layout = Layout::open(dir).map_err(|error| image_error(tagged(dir, error).into()))?;
        let layout = Arc::new(layout);
        let image = Image::from_layout(&layout).map_err(image_error)?;
        if let Some(pin) = pin {
            let pinned: Digest = pin.parse().map_err(|source| HostError::Pin {
                dir: dir.to_owned(),
                source,
            })?;
            if pinned != image.digest {
                return Err(HostError::Mismatch {
                    dir: dir.to_owned(),
                    pinned,
                    actual: image.digest,
                });
            }
        }
        let unpacked = self.store().unpack(&layout, &image).await?;
        Ok((
            image.digest.clone(),
            OciRuntime::new(Arc::clone(self), unpacked),
        ))
    }
}
