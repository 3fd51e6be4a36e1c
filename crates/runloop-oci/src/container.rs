//! One container's life: made, started, watched, stopped and removed.
//!
//! ```text
//! start:  run dir ─▶ disk (ext4, loop) ─▶ overlay root ─▶ netns + veth ─▶ config.json
//!         ─▶ runc run --keep ─▶ agent accepts TCP on PORT ─▶ link ─▶ proxy   (any failure: teardown)
//! end:    by itself (exit, OOM) or stop: signal, grace, SIGKILL to all, runc delete,
//!         netns gone, overlay and disk unmounted (loop detached), run dir removed
//! ```
//!
//! A supervisor task owns the `runc run` child from the start on. It
//! reports the end as soon as it knows it (so the run's loops end with the
//! reason), then tears everything down; [`Container::stop`] resolves once
//! the teardown is done. A container dropped without `stop` is still
//! stopped and torn down by its supervisor. Teardown works from the run's
//! key alone ([`teardown`]), so a server restarted after a crash removes
//! the leftovers of its runs the same way.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use runloop_proxy::Proxy;
use runloop_runtime::output::log_output;
use runloop_runtime::{BoxFuture, Container, ContainerLimits, Runtime, StartError};
use tokio::net::TcpStream;
use tokio::process::Child;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::bundle::{self, Bundle};
use crate::cgroup;
use crate::disk;
use crate::host::Host;
use crate::link::{self, Watch};
use crate::network;
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
}

impl OciRuntime {
    /// Runs `image` on `host`.
    pub fn new(host: Arc<Host>, image: Unpacked) -> OciRuntime {
        OciRuntime {
            host,
            image: Arc::new(image),
        }
    }

    /// The image.
    pub fn image(&self) -> &Unpacked {
        &self.image
    }

    /// Starts one container; resolves once its agent accepts TCP and its
    /// proxy listens. [`Runtime::start`] is this, boxed.
    pub async fn spawn(&self, limits: ContainerLimits) -> Result<OciContainer, StartError> {
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
        let slot = self.host.pool().take().ok_or_else(|| {
            StartError::new(format!(
                "no container addresses are left in {}",
                self.host.pool().subnet()
            ))
        })?;
        let key = crate::random_name();
        let run = self.host.store().runs().join(&key);
        let made = self.make(&key, &run, &slot, limits).await;
        let child = match made {
            Ok(child) => child,
            Err(why) => {
                warn!(%key, %why, "container did not start");
                teardown(&self.host, &key).await;
                return Err(StartError::new(why));
            }
        };
        let port = bundle::port(&self.image.image.process);
        let agent = SocketAddr::from((slot.container, port));
        let started = Started {
            host: Arc::clone(&self.host),
            key,
            child,
            slot,
            agent,
            stop_signal: self
                .image
                .image
                .process
                .stop_signal
                .clone()
                .unwrap_or_else(|| "SIGTERM".to_owned()),
        };
        started.ready().await
    }

    /// Makes the run's files, mounts, network and configuration, and starts
    /// runc.
    async fn make(
        &self,
        key: &str,
        run: &PathBuf,
        slot: &network::Slot,
        limits: ContainerLimits,
    ) -> Result<Child, String> {
        let ids = self.host.config().ids;
        // 0710 with the containers' root group: runc sets the container up
        // as that root (see `Store::with_ids`).
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(run)
            .and_then(|()| {
                std::os::unix::fs::chown(run, Some(0), Some(ids.gids.start))?;
                std::fs::set_permissions(run, std::fs::Permissions::from_mode(0o710))
            })
            .map_err(|error| {
                format!("cannot make the run's directory {}: {error}", run.display())
            })?;
        let process = &self.image.image.process;
        crate::init::find_program(&self.image.rootfs, &process.args, &process.env)?;
        disk::create(run, limits.disk, (ids.uids.start, ids.gids.start))
            .await
            .map_err(|error| format!("cannot make the run's disk: {error}"))?;
        disk::overlay(run, &self.image.rootfs)
            .map_err(|error| format!("cannot mount the run's root: {error}"))?;
        network::create(key, slot)
            .await
            .map_err(|error| format!("cannot make the run's network: {error}"))?;
        let user = user::resolve(&self.image.rootfs, process.user.as_deref())?;
        if user.uid >= ids.uids.count || user.gid >= ids.gids.count {
            return Err(format!(
                "the image's user {}:{} is past the {} ids a container has",
                user.uid, user.gid, ids.uids.count
            ));
        }
        let id = runc::id(key);
        let spec = Bundle {
            process,
            ids: user,
            run,
            hostname: key,
            netns: network::namespace_path(key),
            cgroup: cgroup::path(&id),
            memory: limits.memory,
            swap: self.host.cgroups().accounts_swap(),
            pids: self.host.config().pids,
            mapping: ids,
            cpus: self.host.config().cpus,
            nofile: self.host.config().nofile,
            init: self.host.init().map(|source| bundle::InitMount {
                source: source.to_owned(),
            }),
            sandbox: self.host.runc().kind() == runc::Kind::Runsc,
        }
        .spec()
        .map_err(|error| error.to_string())?;
        let config = run.join("config.json");
        spec.save(&config)
            .map_err(|error| format!("cannot write {}: {error}", config.display()))?;
        let child = self
            .host
            .runc()
            .run_command(run, &id)
            .spawn()
            .map_err(|error| format!("cannot start runc: {error}"))?;
        info!(%key, image = %self.image.image.digest, memory = limits.memory, disk = limits.disk, "container starting");
        Ok(child)
    }
}

impl Runtime for OciRuntime {
    fn start(
        &self,
        limits: ContainerLimits,
    ) -> BoxFuture<'_, Result<Box<dyn Container>, StartError>> {
        Box::pin(async move {
            let container: Box<dyn Container> = Box::new(self.spawn(limits).await?);
            Ok(container)
        })
    }
}

/// A container whose runc has started, not yet known to listen.
struct Started {
    host: Arc<Host>,
    key: String,
    child: Child,
    slot: network::Slot,
    agent: SocketAddr,
    stop_signal: String,
}

impl Started {
    /// Waits for the agent to accept TCP, then puts the link and the proxy
    /// in front of it and hands the child to its supervisor.
    async fn ready(mut self) -> Result<OciContainer, StartError> {
        let pid = self.child.id().unwrap_or_default();
        let program: Arc<str> = Arc::from(runc::id(&self.key));
        log_output(&mut self.child, program, pid, self.host.config().output);
        let timeout = self.host.config().startup_timeout;
        let watch = Arc::new(Memory {
            host: Arc::clone(&self.host),
            id: runc::id(&self.key),
            ended: CancellationToken::new(),
        });
        let stop = CancellationToken::new();
        let run = self.host.store().runs().join(&self.key);
        let serving = async {
            listening(&mut self.child, self.agent, timeout)
                .await
                .map_err(|why| match runc::last_error(&run) {
                    Some(runc) => format!("{why} ({runc})"),
                    None => why,
                })?;
            let link = link::bind(self.agent, watch.clone(), stop.clone())
                .await
                .map_err(|error| format!("cannot bind the agent link: {error}"))?;
            let proxy = Proxy::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), link.0)
                .await
                .map_err(|error| format!("cannot bind the proxy: {error}"))?;
            let url = format!("ws://{}", proxy.local_addr());
            Ok::<_, String>((link.1, proxy, url))
        };
        let (link, proxy, url) = match serving.await {
            Ok(serving) => serving,
            Err(why) => {
                stop.cancel();
                warn!(key = %self.key, %why, "container did not become ready");
                let runc = self.host.runc().clone();
                let _ = runc.kill(&runc::id(&self.key), "SIGKILL", true).await;
                let _ = self.child.wait().await;
                teardown(&self.host, &self.key).await;
                return Err(StartError::new(why));
            }
        };
        let (proxy_handle, proxy) = proxy.spawn();
        let proxy_stop = stop.clone();
        let (exited_tx, exited) = watch::channel(None);
        let key = self.key.clone();
        let supervisor = tokio::spawn(supervise(self, watch, stop.clone(), exited_tx));
        info!(%key, %url, "oci container ready");
        Ok(OciContainer {
            key,
            url,
            stop,
            supervisor: Some(supervisor),
            tasks: vec![
                link,
                // The proxy ends with the container.
                tokio::spawn(async move {
                    proxy_stop.cancelled().await;
                    proxy_handle.shutdown();
                    drop(proxy.await)
                }),
            ],
            exited,
        })
    }
}

/// The link's view of the container: its OOM count, and a way to end it.
struct Memory {
    host: Arc<Host>,
    id: String,
    ended: CancellationToken,
}

impl Watch for Memory {
    fn out_of_memory(&self) -> bool {
        cgroup::Cgroup::new(self.host.cgroups(), &self.id)
            .oom_kills()
            .unwrap_or(0)
            > 0
    }

    fn end_for_memory(&self) {
        self.ended.cancel();
    }
}

/// Waits until the agent accepts TCP at `agent`, runc exits, or time runs out.
async fn listening(child: &mut Child, agent: SocketAddr, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(2);
    loop {
        if TcpStream::connect(agent).await.is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the agent program did not listen on {agent} within {timeout:?}"
            ));
        }
        tokio::select! {
            status = child.wait() => {
                return Err(format!(
                    "the container exited before its agent program listened on {agent}: {}",
                    describe(status)
                ));
            }
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Owns the container until it is gone: reports its end, then tears it down.
async fn supervise(
    mut started: Started,
    memory: Arc<Memory>,
    stop: CancellationToken,
    exited: watch::Sender<Option<String>>,
) {
    let host = Arc::clone(&started.host);
    let id = runc::id(&started.key);
    let runc = host.runc().clone();
    let grace = host.config().grace;
    let reason = tokio::select! {
        status = started.child.wait() => {
            let reason = ended_by_itself(&host, &id, status);
            warn!(%id, %reason, "container ended");
            reason
        }
        () = memory.ended.cancelled() => {
            if let Err(error) = runc.kill(&id, "SIGKILL", true).await {
                warn!(%id, %error, "cannot kill the container");
            }
            let status = started.child.wait().await;
            let reason = ended_by_itself(&host, &id, status);
            warn!(%id, %reason, "container ended");
            reason
        }
        () = stop.cancelled() => {
            if let Err(error) = runc.kill(&id, &started.stop_signal, false).await {
                warn!(%id, %error, "cannot signal the container");
            }
            let status = match tokio::time::timeout(grace, started.child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    warn!(%id, ?grace, "the container ignored its stop signal; killing every process in it");
                    if let Err(error) = runc.kill(&id, "SIGKILL", true).await {
                        warn!(%id, %error, "cannot kill the container");
                    }
                    started.child.wait().await
                }
            };
            format!("the container was stopped: {}", describe(status))
        }
    };
    exited.send_replace(Some(reason));
    // The link and the proxy stay until the server stops the run: a loop
    // held open by the link must end with the reason just reported.
    teardown(&host, &started.key).await;
    drop(started.slot);
}

/// Why a container that ended by itself ended, OOM kills first.
fn ended_by_itself(host: &Host, id: &str, status: io::Result<ExitStatus>) -> String {
    match cgroup::Cgroup::new(host.cgroups(), id).oom_kills() {
        Some(kills) if kills > 0 => format!(
            "the container ran out of memory: the kernel killed {kills} of its processes at its memory limit ({})",
            describe(status)
        ),
        _ => format!("the container exited: {}", describe(status)),
    }
}

/// runc's exit status in words (runc exits with 128+N for a container
/// killed by signal N).
fn describe(status: io::Result<ExitStatus>) -> String {
    match status {
        Ok(status) => match status.code() {
            Some(code) if code > 128 => format!("killed by signal {}", code - 128),
            Some(code) => format!("exit status {code}"),
            None => status.to_string(),
        },
        Err(error) => format!("its status could not be read: {error}"),
    }
}

/// Removes everything of the run `key`: its container, cgroup, network,
/// mounts, loop device and files. Each step goes on whatever the last one
/// did; failures are logged.
pub async fn teardown(host: &Host, key: &str) {
    let id = runc::id(key);
    if let Err(error) = host.runc().delete(&id).await {
        warn!(%id, %error, "cannot delete the container");
    }
    for dir in cgroup::Cgroup::new(host.cgroups(), &cgroup::path(&id)).leftovers() {
        if let Err(error) = std::fs::remove_dir(&dir) {
            warn!(%id, dir = %dir.display(), %error, "cannot remove the container's cgroup");
        }
    }
    if let Err(error) = network::remove(key).await {
        warn!(%id, %error, "cannot remove the container's network");
    }
    let run = host.store().runs().join(key);
    if let Err(error) = disk::remove(&run).await {
        warn!(%id, %error, "cannot remove the run's disk and files");
    }
}

/// One running container, as the server sees it.
#[derive(Debug)]
pub struct OciContainer {
    key: String,
    url: String,
    stop: CancellationToken,
    supervisor: Option<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    exited: watch::Receiver<Option<String>>,
}

impl OciContainer {
    /// Stops the container, tears it down, and says how it ended.
    pub async fn terminate(mut self) -> String {
        self.stop.cancel();
        if let Some(supervisor) = self.supervisor.take()
            && let Err(error) = supervisor.await
        {
            warn!(key = %self.key, %error, "the supervisor task failed");
        }
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
        let reason = self
            .exited
            .borrow()
            .clone()
            .unwrap_or_else(|| "the container's supervisor ended without a word".to_owned());
        info!(key = %self.key, %reason, "oci container removed");
        reason
    }
}

impl Container for OciContainer {
    fn proxy_url(&self) -> &str {
        &self.url
    }

    fn ended(&mut self) -> BoxFuture<'_, String> {
        Box::pin(async move {
            match self.exited.wait_for(Option::is_some).await {
                Ok(reason) => reason.clone().unwrap_or_default(),
                Err(_) => "the container's supervisor is gone".to_owned(),
            }
        })
    }

    fn stop(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            (*self).terminate().await;
        })
    }
}

impl Drop for OciContainer {
    /// Dropped without `stop`, the container is still stopped and torn
    /// down by its supervisor.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
