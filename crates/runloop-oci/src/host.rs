//! The container host: what every container of a server shares — the
//! store, runc, the cgroup hierarchy, the tasks that own its runs — checked
//! once, when the server starts.
//!
//! A machine or user that cannot run containers learns it at startup, not
//! at the first run: [`Host::open`] checks for root, runc, the tools that
//! make disks and networks, overlayfs, loop devices and the memory and
//! pids cgroup controllers, and names what is missing.
//!
//! One server uses a store at a time: the host holds an exclusive `flock`
//! on `STORE/lock` for its life (the kernel drops it when the process
//! dies, however it dies). Holding it, the host owns every run directory
//! under `STORE/runs/`, and before it serves it removes the leftovers of
//! each one (container, cgroup, network, mounts, loop device, files): runs
//! of a server that was killed before it could stop them.
//!
//! A server that ends on purpose leaves nothing: [`Host::close`] stops
//! every container still running, waits for every supervisor and every
//! teardown of a start given up on, and then sweeps the store's runs
//! once more, all before the process exits. Runs have no address on the
//! host (module [`network`](crate::network)), or, with egress, one the
//! kernel holds for them alone (module [`egress`]), so the
//! leftovers of a killed server are never in another server's way,
//! whichever store it uses. With egress, the server's nft table goes
//! last, and a killed server's is removed by the next one on its store.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use runloop_proto::error_chain::Chain;
use rustix::fs::FlockOperation;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::cgroup;
use crate::command;
use crate::digest::{Digest, DigestError};
use crate::disk::{self, DiskError};
use crate::egress::{self, Egress, EgressNetwork};
use crate::filter::{Maker, Prepared};
use crate::image::ImageError;
use crate::runc::Runc;
use crate::store::{Store, StoreError, UnpackLimits};
use crate::teardown::teardown;
use crate::user::IdMapping;

/// Whether host uid `uid` with gid `gid` may pass through every directory
/// from `/` down to `store` (search permission); the first that stops it
/// is the error.
pub fn reachable(store: &Path, uid: u32, gid: u32) -> Result<(), HostError> {
    use std::os::unix::fs::MetadataExt;
    let canonical = fs::canonicalize(store).unwrap_or_else(|_| store.to_owned());
    for dir in canonical.ancestors().skip(1) {
        let Ok(meta) = fs::metadata(dir) else {
            continue;
        };
        let mode = meta.mode() & 0o7777;
        let passes = if meta.uid() == uid {
            mode & 0o100 != 0
        } else if meta.gid() == gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !passes {
            return Err(HostError::Unreachable {
                store: store.to_owned(),
                dir: dir.to_owned(),
                mode,
                owner: meta.uid(),
                group: meta.gid(),
                uid,
                gid,
            });
        }
    }
    Ok(())
}

/// How the host runs containers.
#[derive(Debug, Clone, PartialEq)]
pub struct HostConfig {
    /// The store: pulled blobs, unpacked images, runs.
    pub store: PathBuf,
    /// The OCI runtime's binary.
    pub runc: PathBuf,
    /// Which runtime it is.
    pub runtime: crate::runc::Kind,
    /// Time between the stop signal and SIGKILL.
    pub grace: Duration,
    /// How long an agent has to accept TCP on its port.
    pub startup_timeout: Duration,
    /// Processes one container may have at once.
    pub pids: u32,
    /// What one image may unpack to.
    pub unpack: UnpackLimits,
    /// The most the store's images (pulled blobs and unpacked roots) may
    /// take, bytes; past it the least recently used ones no run holds are
    /// removed ([`crate::gc`]). `None`: no bound.
    pub store_max_size: Option<u64>,
    /// How much of a container's output is logged.
    pub output: runloop_runtime::output::OutputLimit,
    /// The host ids of the containers' ids (their user namespace).
    pub ids: IdMapping,
    /// CPUs' worth of time one container may use.
    pub cpus: f64,
    /// Open files one container's process may have (`RLIMIT_NOFILE`).
    pub nofile: u64,
    /// Whether containers run the init as PID 1 ([`crate::init`]).
    pub init: bool,
    /// The network runs' egress addresses come from, when they have a
    /// way out ([`crate::egress`]); `None`: loopback only.
    pub egress: Option<EgressNetwork>,
    /// What each image's warm pool keeps unless its own says otherwise
    /// ([`crate::pool`]): none by default.
    pub warm: crate::pool::PoolConfig,
}

/// The CPU limit of a container unless told otherwise: half the
/// machine's CPUs, at least one — one agent cannot take the machine.
pub fn default_cpus() -> f64 {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    (cpus as f64 / 2.0).max(1.0)
}

/// The open-file limit of a container unless told otherwise.
pub const DEFAULT_NOFILE: u64 = 4096;

impl HostConfig {
    /// Defaults around `store`: `runc` from `PATH`, a
    /// 5 s grace, 60 s to listen, 1024 processes, images up to 8 GiB and
    /// a million entries unpacked, no bound on the store, the default output budget, the ids of
    /// [`IdMapping::default_for_host`], [`default_cpus`], [`DEFAULT_NOFILE`]
    /// open files, the init, no egress, and no warm pool (1 GiB of memory
    /// and disk a warm container, when one is kept).
    pub fn new(store: impl Into<PathBuf>) -> HostConfig {
        HostConfig {
            store: store.into(),
            runc: PathBuf::from("runc"),
            runtime: crate::runc::Kind::Runc,
            grace: Duration::from_secs(5),
            startup_timeout: Duration::from_secs(60),
            pids: 1024,
            unpack: UnpackLimits {
                max_bytes: 8 << 30,
                max_entries: 1_000_000,
            },
            store_max_size: None,
            output: runloop_runtime::output::OutputLimit::default(),
            ids: IdMapping::default_for_host(),
            cpus: default_cpus(),
            nofile: DEFAULT_NOFILE,
            init: true,
            egress: None,
            warm: crate::pool::PoolConfig {
                size: 0,
                memory: 1 << 30,
                disk: 1 << 30,
            },
        }
    }

    /// The store a server uses unless told otherwise: `/var/lib/runloop`
    /// for root, `$XDG_DATA_HOME/runloop` (or `~/.local/share/runloop`)
    /// for anyone else.
    pub fn default_store() -> PathBuf {
        if rustix::process::geteuid().is_root() {
            return PathBuf::from("/var/lib/runloop");
        }
        std::env::var_os("XDG_DATA_HOME")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/share"))
            })
            .unwrap_or_else(std::env::temp_dir)
            .join("runloop")
    }
}

/// Why the host cannot run containers, or cannot serve an image.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Not root.
    #[error(
        "running containers needs root (runc, mounts, loop devices, network namespaces); this server runs as uid {0}"
    )]
    NotRoot(u32),
    /// A tool or kernel feature is missing.
    #[error("cannot run containers: {0}")]
    Missing(String),
    /// The store.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store's directory of disk templates cannot be made.
    #[error("cannot run containers: the store's disk templates cannot be made")]
    Templates(#[source] DiskError),
    /// Another server holds the store.
    #[error("the store {0} is in use by another server; give each server its own --store")]
    Locked(PathBuf),
    /// A directory above the store that the containers' user cannot pass:
    /// every container would fail in runc with "permission denied".
    #[error(
        "the store {store} is below {dir} (mode {mode:04o}, owner {owner}:{group}), which the \
         containers' user (host uid {uid}, gid {gid}) cannot pass through: every container would \
         fail in runc with \"error preparing rootfs: … permission denied\"; let others pass \
         (chmod o+x {dir}) or put the store where they can (--store /var/lib/runloop)"
    )]
    Unreachable {
        /// The store.
        store: PathBuf,
        /// The directory that stops them.
        dir: PathBuf,
        /// Its mode.
        mode: u32,
        /// Its owner.
        owner: u32,
        /// Its group.
        group: u32,
        /// The containers' root, as a host uid.
        uid: u32,
        /// Their root group, as a host gid.
        gid: u32,
    },
    /// An image layout of the catalog.
    #[error("image layout {dir}")]
    Image {
        /// The layout.
        dir: PathBuf,
        /// What is wrong with it.
        #[source]
        source: ImageError,
    },
    /// A catalog pin that is not a digest this crate reads.
    #[error("image layout {dir}")]
    Pin {
        /// The layout.
        dir: PathBuf,
        /// The pin's problem.
        #[source]
        source: DigestError,
    },
    /// A catalog pin the layout does not match.
    #[error("image layout {dir} holds image {actual}, not the pinned {pinned}")]
    Mismatch {
        /// The layout.
        dir: PathBuf,
        /// The catalog's pin.
        pinned: Digest,
        /// The layout's manifest digest.
        actual: Digest,
    },
}

/// The container host.
#[derive(Debug)]
pub struct Host {
    config: HostConfig,
    store: Store,
    runc: Runc,
    cgroups: cgroup::Version,
    /// Supervisors, and teardowns of starts given up on.
    tasks: TaskTracker,
    /// Fires on [`Host::close`]: every container stops.
    closing: CancellationToken,
    init: Option<PathBuf>,
    /// Runs' way out, when the operator turned it on.
    egress: Option<Egress>,
    /// Runs' disks, formatted once per size.
    disks: disk::Templates,
    /// The syscall filter runc makes of the profile, read back once;
    /// `None`: runc is given the profile at every start.
    filter: Option<Prepared>,
    _lock: File,
}

impl Host {
    /// Checks that this machine can run containers, opens and locks the
    /// store, and removes what earlier servers on it left behind.
    pub async fn open(config: HostConfig) -> Result<Arc<Host>, HostError> {
        let uid = rustix::process::geteuid();
        if !uid.is_root() {
            return Err(HostError::NotRoot(uid.as_raw()));
        }
        let runc = Runc::of_kind(&config.runc, config.runtime);
        let name = config.runtime.name();
        let version = runc.version().await.map_err(|error| {
            HostError::Missing(format!(
                "{name} does not run (install it, e.g. apt-get install {name}): {error}"
            ))
        })?;
        let mut config = config;
        if config.runtime == crate::runc::Kind::Runsc {
            // gVisor's kernel is the boundary; its sandbox takes no id
            // mapping from the spec here, so images keep their own owners.
            config.ids = IdMapping::identity();
        }
        for (tool, flag, package) in [
            ("mkfs.ext4", "-V", "e2fsprogs"),
            ("mount", "--version", "mount"),
            ("losetup", "--version", "mount"),
            ("ip", "-V", "iproute2"),
            ("nft", "--version", "nftables"),
        ]
        .into_iter()
        .filter(|(tool, ..)| *tool != "nft" || config.egress.is_some())
        {
            command::run(OsStr::new(tool), [flag], None)
                .await
                .map_err(|error| {
                    HostError::Missing(format!("{tool} does not run (package {package}): {error}"))
                })?;
        }
        let filesystems = fs::read_to_string("/proc/filesystems").unwrap_or_default();
        if !filesystems
            .lines()
            .any(|line| line.trim_end().ends_with("\toverlay"))
        {
            return Err(HostError::Missing(
                "the kernel has no overlay file system (modprobe overlay)".to_owned(),
            ));
        }
        if !Path::new("/dev/loop-control").exists() {
            return Err(HostError::Missing(
                "there is no /dev/loop-control (modprobe loop)".to_owned(),
            ));
        }
        let cgroups = cgroup::detect().map_err(HostError::Missing)?;
        // The tenants' cgroups the runs go below; those of servers that
        // are gone are removed now, before anything runs.
        let _ = runloop_runtime::cgroup::Tenants::of_host();
        let store = Store::open(&config.store, config.unpack)?
            .with_ids(config.ids)?
            .with_max_size(config.store_max_size);
        // runc sets each container up as its root, an unprivileged host
        // id: it must pass through every directory above the store. Under
        // runsc the sandbox's gofer reaches the files as root.
        if config.runtime == crate::runc::Kind::Runc && !config.ids.is_identity() {
            reachable(store.dir(), config.ids.uids.start, config.ids.gids.start)?;
        }
        if !disk::overlay_safe(store.dir()) {
            return Err(HostError::Missing(format!(
                "the store's path {} holds `,`, `:` or `\\`, which overlay mounts cannot name",
                store.dir().display()
            )));
        }
        let lock_path = store.dir().join("lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| StoreError::Io {
                path: lock_path.clone(),
                source,
            })?;
        rustix::fs::flock(&lock, FlockOperation::NonBlockingLockExclusive)
            .map_err(|_| HostError::Locked(store.dir().to_owned()))?;
        let init = if config.init {
            Some(
                crate::init::install(store.dir()).map_err(|source| StoreError::Io {
                    path: store.dir().join("init"),
                    source,
                })?,
            )
        } else {
            None
        };

        let disks = disk::Templates::open(
            store.dir().join("disks"),
            (config.ids.uids.start, config.ids.gids.start),
        )
        .map_err(HostError::Templates)?;
        let host = Host {
            config,
            disks,
            store,
            runc,
            cgroups,
            tasks: TaskTracker::new(),
            closing: CancellationToken::new(),
            init,
            egress: None,
            filter: None,
            _lock: lock,
        };
        let mut host = host;
        host.sweep().await?;
        host.filter = host.prepare_filter().await;
        if let Some(network) = host.config.egress {
            host.egress = Some(
                Egress::open(network, host.store.dir())
                    .await
                    .map_err(|error| {
                        HostError::Missing(format!(
                            "container egress: {error}",
                            error = Chain(&error)
                        ))
                    })?,
            );
        }
        info!(store = %host.store.dir().display(), runc = %version, cgroups = ?host.cgroups, uids = %host.config.ids.uids, gids = %host.config.ids.gids, cpus = host.config.cpus, init = host.init.is_some(), store_max_size = ?host.config.store_max_size, "container host ready");
        match crate::runc::parse_version(&version) {
            _ if host.config.runtime != crate::runc::Kind::Runc => {}
            Some(parsed) => {
                if let Some(warning) = crate::runc::advisory(parsed) {
                    warn!(runc = %version, "{warning}");
                }
            }
            None => {
                warn!(runc = %version, "cannot read runc's version; it may predate the fixes for CVE-2025-31133, CVE-2025-52565 and CVE-2025-52881")
            }
        }
        Ok(Arc::new(host))
    }

    /// Removes the leftovers of every run in the store, and interrupted
    /// unpacks.
    async fn sweep(&self) -> Result<(), HostError> {
        let runs = self.store.runs();
        let entries = fs::read_dir(&runs).map_err(|source| StoreError::Io {
            path: runs.clone(),
            source,
        })?;
        for entry in entries.flatten() {
            let key = entry.file_name().to_string_lossy().into_owned();
            warn!(%key, "removing the leftovers of a run of an earlier server");
            self.teardown(&key).await;
        }
        egress::sweep(self.store.dir()).await;
        self.store.sweep()?;
        Ok(())
    }

    /// The filter runc makes of the profile, read back from a container
    /// of its own, when the containers are runc's and run the init.
    async fn prepare_filter(&self) -> Option<Prepared> {
        let init = self.init.as_deref()?;
        if self.runc.kind() != crate::runc::Kind::Runc {
            return None;
        }
        let maker = Maker {
            runc: &self.runc,
            cgroups: self.cgroups,
            runs: &self.store.runs(),
            init,
        };
        match crate::filter::read_back(maker, None).await {
            Ok(prepared) => {
                info!(
                    instructions = prepared.instructions(),
                    "the containers' syscall filter is compiled once, not at every start"
                );
                Some(prepared)
            }
            Err(why) => {
                warn!(%why, "runc compiles the containers' syscall filter at every start");
                None
            }
        }
    }

    /// The syscall filter read back once, if it was.
    pub fn filter(&self) -> Option<&Prepared> {
        self.filter.as_ref()
    }

    /// Ends every container of this host and removes all it made: stops
    /// the containers still running (their supervisors tear them down),
    /// waits for those and for the teardowns of starts given up on, then
    /// removes whatever run is still in the store. The server calls it last,
    /// before it exits; containers asked for afterwards are stopped at once.
    pub async fn close(&self) {
        self.closing.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        let runs = self.store.runs();
        for entry in fs::read_dir(&runs).into_iter().flatten().flatten() {
            let key = entry.file_name().to_string_lossy().into_owned();
            warn!(%key, "a run was still on the machine at shutdown; removing it");
            self.teardown(&key).await;
        }
        if let Some(egress) = &self.egress {
            egress.close().await;
        }
        if let Some(tenants) = runloop_runtime::cgroup::Tenants::of_host() {
            tenants.release();
        }
    }

    /// The tasks that own runs: what [`Host::close`] waits for.
    pub(crate) fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Fires when the host closes.
    pub(crate) fn closing(&self) -> &CancellationToken {
        &self.closing
    }

    /// The configuration.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// runc.
    pub fn runc(&self) -> &Runc {
        &self.runc
    }

    /// The cgroup hierarchy.
    pub fn cgroups(&self) -> cgroup::Version {
        self.cgroups
    }

    /// Runs' way out, if they have one.
    pub fn egress(&self) -> Option<&Egress> {
        self.egress.as_ref()
    }

    /// The runs' disk templates.
    pub fn disks(&self) -> &disk::Templates {
        &self.disks
    }

    /// The init binary containers run as PID 1, if they run one.
    pub fn init(&self) -> Option<&Path> {
        self.init.as_deref()
    }

    /// Removes everything of the run `key` ([`teardown`]).
    pub async fn teardown(&self, key: &str) {
        teardown(&self.runc, self.cgroups, &self.store.runs(), key).await;
    }
}

#[cfg(test)]
mod reach_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_store_below_a_directory_others_cannot_pass_is_named_with_its_fix() {
        let dir = tempfile::tempdir().expect("a directory");
        let store = dir.path().join("store");
        fs::create_dir(&store).expect("made");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let (uid, gid) = (2_000_000_000, 2_000_000_000);
        assert!(reachable(&store, uid, gid).is_ok());
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).expect("chmod");
        let refused = reachable(&store, uid, gid).expect_err("0700 stops them");
        let words = refused.to_string();
        assert!(
            words.contains(&format!("is below {} (mode 0700", dir.path().display()))
                && words.contains(&format!("chmod o+x {}", dir.path().display())),
            "{words}"
        );
        // Its owner, or its group with g+x, passes.
        let meta = fs::metadata(dir.path()).expect("meta");
        use std::os::unix::fs::MetadataExt;
        assert!(reachable(&store, meta.uid(), gid).is_ok());
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o710)).expect("chmod");
        assert!(reachable(&store, uid, meta.gid()).is_ok());
    }
}
