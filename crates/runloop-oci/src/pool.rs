//! Warm pools: containers of an image started before any run asks for
//! them — disk, network namespace, container, agent listening — so that a
//! run only registers.
//!
//! ```text
//! refill task:  claim (server's budgets) ─▶ cold start (warm size) ─▶ ready queue ◀─┐
//! a run:        fits the warm size? ─▶ take the oldest ─▶ held to the run's memory  │ wake
//!               and disk ─▶ the claim goes, the run's own holds it ─▶ its container ─┘
//! ```
//!
//! A pool keeps `size` containers of one image, each started exactly as a
//! cold start starts one (same code, same isolation) with the pool's
//! memory and disk. A run whose `memory` and `disk` are at most those takes
//! the oldest, and the container is held to what the run asked for before
//! the run has it: its memory cgroup's limit lowered to the run's `memory`
//! (swap held to it, as for any run; a container already using more is
//! not taken), and of its disk all but the run's `disk` set aside in a
//! file outside what the container sees (`fallocate`, blocks the file
//! system then counts as used). A run that asks for more, or finds the
//! pool empty, starts cold.
//!
//! A warm container serves exactly one run: its end (the run's stop, the
//! container's own end) tears it down as any container's, and the pool
//! starts another in its place. Nothing is ever handed to a second run.
//!
//! Each warm container's memory and disk are claimed of the server's
//! budgets (not a tenant's: no one asked yet) through the server's
//! [`Reserve`] from before its start until a run takes it (the run's own
//! claim, its tenant's, holds it from then on) or it goes; when the
//! budgets have no room, the pool holds fewer and tries again. The refill
//! runs on the host's tracker and ends when the host closes; the host's
//! close stops every container, warm ones included, so a server that stops
//! leaves nothing of its pool.
//!
//! The pool imports nothing of the container's module, which keeps it
//! ([`crate::container`]): what it keeps is an [`OciContainer`] (module
//! [`run`](crate::run)), and it starts one by the function its runtime
//! hands its refill, so imports go one way.

use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use runloop_proto::error_chain::Chain;
use runloop_runtime::{Container, ContainerLimits, Reserve, Reserved, RunTenant, StartError};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::cgroup::Version;
use crate::run::OciContainer;

/// The most a failing refill waits before it tries again.
const LONGEST_PAUSE: Duration = Duration::from_secs(30);
/// How often a pool looks at its containers when nothing wakes it (one
/// may have ended while it waited; the budgets may have room again).
const LOOK: Duration = Duration::from_secs(1);
/// The file that sets a warm disk's room aside, at its file system's top
/// (the container sees only `upper/` and `tmp/` below it).
const SET_ASIDE: &str = "set-aside";

/// The tenant a warm container is started for: no one's (tenant names
/// have no spaces).
pub const POOL_TENANT: &str = "warm pool";

/// What a pool keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Containers kept started.
    pub size: usize,
    /// Each one's memory, bytes: runs asking for more start cold.
    pub memory: u64,
    /// Each one's disk, bytes: runs asking for more start cold.
    pub disk: u64,
}

/// One image's pool.
#[derive(Debug)]
pub(crate) struct Pool {
    config: PoolConfig,
    /// The host's cgroup version: how a taken container's memory limit
    /// is lowered.
    cgroups: Version,
    ready: Mutex<VecDeque<Warm>>,
    /// A container was taken, or went: the refill looks again.
    wake: Notify,
}

/// A warm container and its claim.
struct Warm {
    container: OciContainer,
    reserved: Box<dyn Reserved>,
}

impl std::fmt::Debug for Warm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warm")
            .field("container", &self.container)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool of `config`'s containers, on a host of `cgroups`.
    pub(crate) fn new(config: PoolConfig, cgroups: Version) -> Pool {
        Pool {
            config,
            cgroups,
            ready: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
        }
    }

    fn ready(&self) -> std::sync::MutexGuard<'_, VecDeque<Warm>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Containers ready now.
    pub(crate) fn len(&self) -> usize {
        self.ready().len()
    }

    /// A warm container held to `limits`, if one fits and is there; `None`:
    /// the run starts cold.
    pub(crate) async fn take(&self, limits: &ContainerLimits) -> Option<OciContainer> {
        if limits.memory > self.config.memory || limits.disk > self.config.disk {
            return None;
        }
        loop {
            let mut warm = self.ready().pop_front()?;
            self.wake.notify_one();
            if warm.container.ended().now_or_never().is_some() {
                debug!("a warm container had ended; it goes");
                continue;
            }
            match self.hold(&warm.container, limits).await {
                Ok(()) => {
                    warm.reserved.used();
                    return Some(warm.container);
                }
                Err(why) => {
                    warn!(%why, "a warm container could not be held to a run's limits; it goes");
                    continue;
                }
            }
        }
    }

    /// Holds a warm container to the run's `limits`: its memory limit
    /// lowered, all of its disk but the run's set aside.
    async fn hold(&self, container: &OciContainer, limits: &ContainerLimits) -> Result<(), String> {
        let cgroups = self.cgroups;
        let cgroup = container.runtime().cgroup().to_owned();
        let run = container.runtime().dir().to_owned();
        let (memory, disk) = (self.config.memory, self.config.disk);
        let (run_memory, run_disk) = (limits.memory, limits.disk);
        tokio::task::spawn_blocking(move || {
            if run_memory < memory {
                lower_memory(cgroups, &cgroup, run_memory)?;
            }
            if run_disk < disk {
                set_aside(
                    &crate::disk::mount_point(&run).join(SET_ASIDE),
                    disk - run_disk,
                )?;
            }
            Ok(())
        })
        .await
        .map_err(|error| error.to_string())?
    }
}

/// Lowers the memory limit of the cgroup at `path` to `bytes` (swap held
/// to it); refused when the cgroup already uses more.
fn lower_memory(version: Version, path: &str, bytes: u64) -> Result<(), String> {
    let root = PathBuf::from(runloop_runtime::cgroup::ROOT);
    let path = path.trim_start_matches('/');
    let (dir, usage, limits): (PathBuf, &str, &[&str]) = match version {
        Version::V1 => (
            root.join("memory").join(path),
            "memory.usage_in_bytes",
            // The memory limit first: memory and swap may not be below it.
            &["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"],
        ),
        Version::V2 => (root.join(path), "memory.current", &["memory.max"]),
    };
    let read = |name: &str| std::fs::read_to_string(dir.join(name));
    let used: u64 = read(usage)
        .map_err(|error| format!("cannot read {usage} of {}: {error}", dir.display()))?
        .trim()
        .parse()
        .map_err(|error| format!("{usage} of {}: {error}", dir.display()))?;
    if used > bytes {
        return Err(format!(
            "it uses {used} bytes, more than the run's memory {bytes}"
        ));
    }
    for name in limits {
        let file = dir.join(name);
        if !file.exists() {
            continue;
        }
        std::fs::write(&file, bytes.to_string())
            .map_err(|error| format!("cannot write {}: {error}", file.display()))?;
    }
    Ok(())
}

/// Allocates `bytes` in a new file at `path` (root's, unreadable), so
/// that the file system has that much less room for anything else.
fn set_aside(path: &std::path::Path, bytes: u64) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::File::options()
        .write(true)
        .create_new(true)
        .mode(0o000)
        .open(path)
        .map_err(|error| format!("cannot make {}: {error}", path.display()))?;
    rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, bytes).map_err(|errno| {
        format!(
            "cannot set {bytes} bytes aside in {}: {errno}",
            path.display()
        )
    })
}

/// Keeps `pool` full of containers that `start` starts cold (its
/// runtime's), each claimed of `reserve`, until `closing` (the host's
/// close); then lets every warm container go (the host's close stops
/// them).
pub(crate) async fn refill<S, Starting>(
    pool: Arc<Pool>,
    start: S,
    closing: CancellationToken,
    reserve: Arc<dyn Reserve>,
) where
    S: Fn(ContainerLimits) -> Starting,
    Starting: Future<Output = Result<OciContainer, StartError>>,
{
    // No one's run yet: the pool's containers are no tenant's, and run in
    // a cgroup of their own below the tenants' (a name no tenant can
    // have); a run that takes one keeps it there.
    let limits = ContainerLimits {
        memory: pool.config.memory,
        disk: pool.config.disk,
        tenant: RunTenant {
            name: Arc::from(POOL_TENANT),
            ..RunTenant::default()
        },
    };
    let mut pause = Duration::from_millis(250);
    loop {
        // Ended while they waited: they go, and are replaced.
        pool.ready()
            .retain_mut(|warm| warm.container.ended().now_or_never().is_none());
        let mut failed = false;
        while pool.len() < pool.config.size && !closing.is_cancelled() {
            let Some(reserved) = reserve.claim(limits.memory, limits.disk) else {
                debug!("the server's budgets have no room for another warm container now");
                break;
            };
            let started = tokio::select! {
                () = closing.cancelled() => break,
                started = start(limits.clone()) => started,
            };
            match started {
                Ok(container) => {
                    pause = Duration::from_millis(250);
                    pool.ready().push_back(Warm {
                        container,
                        reserved,
                    });
                }
                Err(error) => {
                    warn!(error = %Chain(&error), "a warm container did not start; trying again later");
                    failed = true;
                    break;
                }
            }
        }
        let wait = if failed {
            let wait = pause;
            pause = (pause * 2).min(LONGEST_PAUSE);
            wait
        } else {
            LOOK
        };
        tokio::select! {
            () = closing.cancelled() => break,
            () = pool.wake.notified(), if !failed => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
    // Dropped, each is stopped and torn down on the host's tracker (the
    // host is closing: its close waits for them), and its claim given back.
    pool.ready().clear();
}
