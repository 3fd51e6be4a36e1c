//! Control groups: the kernel's hold on a run's memory and processes,
//! shared by the runtimes that start processes (exec here, runc's
//! containers in `runloop-oci`).
//!
//! A process limit (`RLIMIT_DATA`) counts one process's private memory;
//! a memory cgroup counts every page its processes use — shared mappings,
//! page cache, children — and a pids cgroup bounds how many there are. A
//! process cannot leave its cgroup without the privilege to write to the
//! hierarchy, so "every process of the run" is a question the kernel
//! answers, whatever the processes do with sessions and groups.
//!
//! Both hierarchies are read and written: cgroup v1 (one hierarchy per
//! controller, as on hybrid hosts; `memory` and `pids` used) and v2 (one
//! unified hierarchy, controllers enabled down the path with
//! `cgroup.subtree_control`). A [`Cgroup`] is named by its path below the
//! hierarchy's root, the same in every v1 controller.
//!
//! Killing a cgroup cannot race its forks: v2's `cgroup.kill` does it in
//! the kernel; elsewhere `pids.max` is set to 0 first, so nothing in it can
//! fork again, and then every process in it gets `SIGKILL`.
//!
//! # A tenant's CPU
//!
//! Memory and processes are held per run; the CPU is divided (protocol
//! §12, "fair shares"). The kernel divides it between sibling cgroups by
//! weight, so a cgroup per run alone would give a tenant with eight runs
//! eight times the CPU of a tenant with one. [`Tenants`] puts every run of
//! one tenant, exec and oci alike, below one cgroup of the tenant's, of
//! the tenant's weight, below one of this server process's:
//!
//! ```text
//! runloop-tenants/<server pid>.<start time>/tenant-<name>/<run>
//!     cpu.weight (v2) = the tenant's weight        cpu.shares (v1) = weight × 1024 / 100
//! ```
//!
//! so whatever number of runs a tenant has, they take what one weight
//! takes when others want the CPU too (and all of it when nobody does).
//! Each tenant's cgroup is made with its first run and removed with its
//! last; the server's with the server ([`Tenants::release`]), and those of
//! a server killed outright by the next one's sweep.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Where the cgroup hierarchies are mounted.
pub const ROOT: &str = "/sys/fs/cgroup";

/// The controllers a run's cgroup must have.
const CONTROLLERS: [&str; 2] = ["memory", "pids"];

/// The CPU weight of a cgroup nobody set one for (cgroup v2's default).
pub const DEFAULT_WEIGHT: u32 = 100;

/// Whether the hierarchy of `version` has the cpu controller (found once):
/// the weights of tenants are written only where it is.
fn has_cpu(version: Version) -> bool {
    static V1: OnceLock<bool> = OnceLock::new();
    static V2: OnceLock<bool> = OnceLock::new();
    match version {
        Version::V1 => *V1.get_or_init(|| Path::new(ROOT).join("cpu/cpu.shares").exists()),
        Version::V2 => *V2.get_or_init(|| {
            fs::read_to_string(Path::new(ROOT).join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"))
        }),
    }
}

/// Which cgroup hierarchy the host runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// Legacy or hybrid: one hierarchy per controller.
    V1,
    /// Unified.
    V2,
}

/// The host's hierarchy, if it has the memory and pids controllers.
pub fn detect() -> Result<Version, String> {
    let root = PathBuf::from(ROOT);
    if let Ok(controllers) = fs::read_to_string(root.join("cgroup.controllers")) {
        let has = |name: &str| controllers.split_whitespace().any(|c| c == name);
        return if has("memory") && has("pids") {
            Ok(Version::V2)
        } else {
            Err(format!(
                "the unified cgroup hierarchy at {ROOT} lacks the memory or pids controller ({})",
                controllers.trim()
            ))
        };
    }
    for controller in CONTROLLERS {
        if !root.join(controller).join("cgroup.procs").exists() {
            return Err(format!(
                "no {controller} cgroup controller is mounted at {ROOT}/{controller}"
            ));
        }
    }
    Ok(Version::V1)
}

impl Version {
    /// Whether swap is accounted, so that a limit on memory plus swap can
    /// hold a cgroup to its memory limit.
    pub fn accounts_swap(self) -> bool {
        match self {
            Version::V1 => PathBuf::from(ROOT)
                .join("memory/memory.memsw.limit_in_bytes")
                .exists(),
            Version::V2 => true,
        }
    }
}

/// What a cgroup made by [`Cgroup::create`] holds its processes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Memory, bytes; swap (where accounted) is held to the same figure.
    pub memory: u64,
    /// Processes (and threads) at once.
    pub pids: u32,
}

/// One cgroup, by its path below the hierarchy's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    version: Version,
    path: String,
}

impl Cgroup {
    /// The cgroup at `path` (with or without a leading `/`).
    pub fn new(version: Version, path: &str) -> Cgroup {
        Cgroup {
            version,
            path: path.trim_matches('/').to_owned(),
        }
    }

    /// Its path below the root, without a leading `/`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Its hierarchy.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The cgroup `name` below this one.
    pub fn child(&self, name: &str) -> Cgroup {
        Cgroup::new(self.version, &format!("{}/{name}", self.path))
    }

    /// Its directory in `controller`'s hierarchy (v1), or in the unified one.
    fn dir(&self, controller: &str) -> PathBuf {
        match self.version {
            Version::V1 => Path::new(ROOT).join(controller).join(&self.path),
            Version::V2 => Path::new(ROOT).join(&self.path),
        }
    }

    /// Its directories: one per controller it is made in (v1: memory,
    /// pids and, where mounted, cpu), or one.
    fn dirs(&self) -> Vec<PathBuf> {
        match self.version {
            Version::V1 => CONTROLLERS
                .iter()
                .copied()
                .chain(has_cpu(Version::V1).then_some("cpu"))
                .map(|c| self.dir(c))
                .collect(),
            Version::V2 => vec![self.dir("")],
        }
    }

    /// Sets its CPU weight (1 to 10000, v2's scale; `cpu.shares` =
    /// weight × 1024 / 100 on v1). Nothing where there is no cpu
    /// controller.
    pub fn set_weight(&self, weight: u32) -> io::Result<()> {
        let weight = weight.clamp(1, 10_000);
        if !has_cpu(self.version) {
            return Ok(());
        }
        match self.version {
            Version::V1 => write(
                &self.dir("cpu").join("cpu.shares"),
                (u64::from(weight) * 1024 / 100).max(2),
            ),
            Version::V2 => write(&self.dir("").join("cpu.weight"), weight),
        }
    }

    /// Its CPU weight as the kernel holds it, in v2's scale (`None` when
    /// it cannot be read).
    pub fn weight(&self) -> Option<u32> {
        match self.version {
            Version::V1 => {
                let shares: u64 = fs::read_to_string(self.dir("cpu").join("cpu.shares"))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()?;
                u32::try_from(shares * 100 / 1024).ok()
            }
            Version::V2 => fs::read_to_string(self.dir("").join("cpu.weight"))
                .ok()?
                .trim()
                .parse()
                .ok(),
        }
    }

    /// Makes it (and the cgroups above it), held to `bounds` when given.
    /// On an error nothing of the cgroup itself is left.
    pub fn create(&self, bounds: Option<Bounds>) -> io::Result<()> {
        let made = self.make(bounds);
        if made.is_err() {
            for dir in self.dirs() {
                let _ = fs::remove_dir(dir);
            }
        }
        made
    }

    fn make(&self, bounds: Option<Bounds>) -> io::Result<()> {
        match self.version {
            Version::V1 => {
                for dir in self.dirs() {
                    fs::create_dir_all(&dir)?;
                }
                let Some(bounds) = bounds else {
                    return Ok(());
                };
                let memory = self.dir("memory");
                write(&memory.join("memory.limit_in_bytes"), bounds.memory)?;
                let memsw = memory.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write(&memsw, bounds.memory)?;
                }
                write(&self.dir("pids").join("pids.max"), bounds.pids)?;
            }
            Version::V2 => {
                // Every cgroup on the way down passes the controllers on.
                let controllers = if has_cpu(Version::V2) {
                    "+memory +pids +cpu"
                } else {
                    "+memory +pids"
                };
                let mut dir = PathBuf::from(ROOT);
                for part in self.path.split('/') {
                    write(&dir.join("cgroup.subtree_control"), controllers)?;
                    dir.push(part);
                    match fs::create_dir(&dir) {
                        Err(error) if error.kind() != io::ErrorKind::AlreadyExists => {
                            return Err(error);
                        }
                        _ => {}
                    }
                }
                let Some(bounds) = bounds else {
                    return Ok(());
                };
                write(&dir.join("memory.max"), bounds.memory)?;
                write(&dir.join("memory.swap.max"), 0)?;
                write(&dir.join("pids.max"), bounds.pids)?;
            }
        }
        Ok(())
    }

    /// Whether it exists (in every controller it is made in).
    pub fn exists(&self) -> bool {
        self.dirs().iter().all(|dir| dir.is_dir())
    }

    /// The open files a child writes to between fork and exec to join it.
    pub fn joiner(&self) -> io::Result<Joiner> {
        let files = self
            .dirs()
            .iter()
            .map(|dir| {
                fs::OpenOptions::new()
                    .write(true)
                    .open(dir.join("cgroup.procs"))
                    .map(OwnedFd::from)
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Joiner { files })
    }

    /// The processes in it now (from the memory hierarchy on v1, where a
    /// child joins first).
    pub fn procs(&self) -> Vec<u32> {
        fs::read_to_string(self.dir("memory").join("cgroup.procs"))
            .map(|text| {
                text.split_whitespace()
                    .filter_map(|pid| pid.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Sends `signal` to every process in it; how many there were.
    pub fn signal(&self, signal: libc::c_int) -> usize {
        let procs = self.procs();
        for &pid in &procs {
            if let Ok(pid) = libc::pid_t::try_from(pid)
                && pid > 1
            {
                // SAFETY: a system call on integers; ESRCH (gone) is fine.
                unsafe {
                    libc::kill(pid, signal);
                }
            }
        }
        procs.len()
    }

    /// Kills every process in it, forks included: `cgroup.kill` where the
    /// kernel has it, else no more forks (`pids.max` 0) and `SIGKILL` to
    /// each process until none is left or a second has passed. Blocking,
    /// for a short while at most; returns how many processes are left.
    pub fn kill(&self) -> usize {
        let kill_file = self.dir("").join("cgroup.kill");
        if self.version == Version::V2 && kill_file.exists() && write(&kill_file, 1).is_ok() {
            return self.wait_empty();
        }
        let _ = write(&self.dir("pids").join("pids.max"), 0);
        for _ in 0..100 {
            if self.signal(libc::SIGKILL) == 0 {
                return 0;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.procs().len()
    }

    fn wait_empty(&self) -> usize {
        for _ in 0..100 {
            if self.procs().is_empty() {
                return 0;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.procs().len()
    }

    /// Kills what is in it, then removes it (and nothing above it). A dead
    /// process leaves its cgroup once it is reaped, so the removal is
    /// retried for a second.
    pub fn remove(&self) -> io::Result<()> {
        self.kill();
        let mut last = Ok(());
        for _ in 0..100 {
            last = Ok(());
            for dir in self.dirs() {
                match fs::remove_dir(&dir) {
                    Err(error) if error.kind() != io::ErrorKind::NotFound => last = Err(error),
                    _ => {}
                }
            }
            if last.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        last
    }

    /// Kills and removes it and every cgroup below it, deepest first, in
    /// every hierarchy it is in (on v1 also those it was not made in,
    /// such as runc adds); what is left, with the first error.
    pub fn remove_tree(&self) -> io::Result<()> {
        let mut last = Ok(());
        for child in self.children() {
            if let Err(error) = child.remove_tree() {
                last = Err(error);
            }
        }
        self.kill();
        for dir in self.leftovers() {
            let mut removed = fs::remove_dir(&dir);
            // A dead process leaves its cgroup once it is reaped.
            for _ in 0..100 {
                if removed.is_ok()
                    || removed
                        .as_ref()
                        .is_err_and(|e| e.kind() == io::ErrorKind::NotFound)
                {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
                removed = fs::remove_dir(&dir);
            }
            if let Err(error) = removed
                && error.kind() != io::ErrorKind::NotFound
            {
                last = Err(error);
            }
        }
        last
    }

    /// The cgroups directly below it (in the memory hierarchy on v1).
    pub fn children(&self) -> Vec<Cgroup> {
        let mut names: Vec<String> = match fs::read_dir(self.dir("memory")) {
            Ok(entries) => entries
                .flatten()
                .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
                .filter_map(|entry| entry.file_name().into_string().ok())
                .collect(),
            Err(_) => Vec::new(),
        };
        // v1: a cgroup made in one controller but not yet the other.
        if self.version == Version::V1
            && let Ok(entries) = fs::read_dir(self.dir("pids"))
        {
            for name in entries
                .flatten()
                .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
                .filter_map(|entry| entry.file_name().into_string().ok())
            {
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        names.sort();
        names.into_iter().map(|name| self.child(&name)).collect()
    }

    /// How many processes the OOM killer killed in it (`None` when it is
    /// gone or does not say).
    pub fn oom_kills(&self) -> Option<u64> {
        let file = match self.version {
            Version::V1 => self.dir("memory").join("memory.oom_control"),
            Version::V2 => self.dir("").join("memory.events"),
        };
        let text = fs::read_to_string(file).ok()?;
        text.lines().find_map(|line| {
            let (name, value) = line.split_once(' ')?;
            (name == "oom_kill")
                .then(|| value.trim().parse().ok())
                .flatten()
        })
    }

    /// The most memory it has held at once, bytes (`None` when the kernel
    /// does not say).
    pub fn peak_memory(&self) -> Option<u64> {
        let file = match self.version {
            Version::V1 => self.dir("memory").join("memory.max_usage_in_bytes"),
            Version::V2 => self.dir("").join("memory.peak"),
        };
        fs::read_to_string(file).ok()?.trim().parse().ok()
    }

    /// Its directories that still exist, in every hierarchy (on v1 also
    /// controllers it was not made in, such as those runc adds).
    pub fn leftovers(&self) -> Vec<PathBuf> {
        let root = PathBuf::from(ROOT);
        match self.version {
            Version::V2 => vec![root.join(&self.path)],
            Version::V1 => fs::read_dir(&root)
                .map(|entries| {
                    entries
                        .flatten()
                        .map(|entry| entry.path().join(&self.path))
                        .collect()
                })
                .unwrap_or_default(),
        }
        .into_iter()
        .filter(|dir| dir.is_dir())
        .collect()
    }
}

/// Where this process keeps its tenants' cgroups, below which every
/// server process has one of its own.
pub const TENANTS: &str = "runloop-tenants";

/// The tenants' cgroups of this server process: one per tenant with a run,
/// of the tenant's CPU weight, holding its runs' cgroups (see the module's
/// "A tenant's CPU").
#[derive(Debug)]
pub struct Tenants {
    own: Cgroup,
    held: Mutex<HashMap<String, usize>>,
}

/// One run's hold on its tenant's cgroup: the cgroup is removed when the
/// last hold of it is dropped (a run drops it after its own cgroup is
/// gone).
#[derive(Debug)]
pub struct TenantHold {
    tenants: Arc<Tenants>,
    cgroup: Cgroup,
    dir: String,
}

impl TenantHold {
    /// The tenant's cgroup: where the run's own goes.
    pub fn cgroup(&self) -> &Cgroup {
        &self.cgroup
    }
}

impl Drop for TenantHold {
    fn drop(&mut self) {
        self.tenants.put_back(&self.dir, &self.cgroup);
    }
}

impl Tenants {
    /// This process's tenants' cgroups in the `version` hierarchy, below
    /// [`TENANTS`]`/<pid>.<start time>` (`server`); the trees of server
    /// processes that are gone are removed first, their runs killed.
    pub fn new(version: Version, server: &str) -> Tenants {
        let parent = Cgroup::new(version, TENANTS);
        for other in parent.children() {
            let name = other.path().rsplit('/').next().unwrap_or_default();
            if name == server || alive(name) {
                continue;
            }
            let runs: Vec<Cgroup> = other.children().iter().flat_map(Cgroup::children).collect();
            let killed: usize = runs.iter().map(|run| run.procs().len()).sum();
            match other.remove_tree() {
                Err(error) => {
                    tracing::warn!(cgroup = other.path(), %error, "cannot remove a leftover server's cgroups");
                }
                Ok(()) if !runs.is_empty() => tracing::warn!(
                    cgroup = other.path(),
                    runs = runs.len(),
                    killed,
                    "removed the runs of a server that ended without stopping them"
                ),
                Ok(()) => {}
            }
        }
        Tenants {
            own: parent.child(server),
            held: Mutex::new(HashMap::new()),
        }
    }

    /// This process's tenants' cgroups, made once (and the trees of
    /// servers that are gone removed then); `None` without cgroups.
    pub fn of_host() -> Option<Arc<Tenants>> {
        static HOST: OnceLock<Option<Arc<Tenants>>> = OnceLock::new();
        HOST.get_or_init(|| {
            let version = detect().ok()?;
            let tenants = Tenants::new(version, &own_server_name());
            tenants.own.create(None).ok()?;
            Some(Arc::new(tenants))
        })
        .clone()
    }

    /// This process's cgroup of tenants.
    pub fn own(&self) -> &Cgroup {
        &self.own
    }

    /// The cgroup of tenant `name`, made if it is not there, of CPU
    /// `weight` (a weight changed since its last run applies from now).
    pub fn hold(self: &Arc<Self>, name: &str, weight: u32) -> io::Result<TenantHold> {
        let dir = tenant_dir(name);
        let cgroup = self.own.child(&dir);
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let made = cgroup.create(None).and_then(|()| cgroup.set_weight(weight));
        if let Err(error) = made {
            if !held.contains_key(&dir) {
                let _ = cgroup.remove_tree();
            }
            return Err(error);
        }
        *held.entry(dir.clone()).or_default() += 1;
        Ok(TenantHold {
            tenants: Arc::clone(self),
            cgroup,
            dir,
        })
    }

    fn put_back(&self, dir: &str, cgroup: &Cgroup) {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(count) = held.get_mut(dir) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            held.remove(dir);
            // Runs gone, so are their cgroups: only the tenant's is left
            // (in every hierarchy runc made it in, on v1).
            for left in cgroup.leftovers() {
                let _ = fs::remove_dir(left);
            }
        }
    }

    /// Removes this process's cgroups of tenants that hold no run, and
    /// its own once none is left (a server that shuts down calls it).
    pub fn release(&self) {
        let held = self
            .held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if held.is_empty() {
            let _ = self.own.remove_tree();
        }
    }
}

/// The directory name of tenant `name`: `tenant-` and the name with every
/// byte but letters, digits, `-` and `_` written `%XX`, so that two names
/// never share one and none is `.` or `..`.
pub fn tenant_dir(name: &str) -> String {
    let mut dir = String::from("tenant-");
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' {
            dir.push(char::from(byte));
        } else {
            dir.push_str(&format!("%{byte:02X}"));
        }
    }
    dir
}

/// The name of a server process's cgroup: its pid and start time, which
/// no other process shares, so a later server can tell whether it is
/// still alive.
pub fn server_name(pid: u32, start: u64) -> String {
    format!("{pid}.{start}")
}

/// This process's [`server_name`].
pub fn own_server_name() -> String {
    server_name(std::process::id(), start_time("self").unwrap_or_default())
}

/// A process's start time (clock ticks since boot, field 22 of its
/// `stat`), `None` when there is no such process.
pub fn start_time(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; the
    // fields after its last `)` start with field 3.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the server process a [`server_name`] names still runs.
pub fn alive(server: &str) -> bool {
    server
        .split_once('.')
        .and_then(|(pid, start)| Some((start_time(pid)?, start.parse::<u64>().ok()?)))
        .is_some_and(|(now, then)| now == then)
}

/// Writes `value` to a cgroup file.
fn write(file: &Path, value: impl std::fmt::Display) -> io::Result<()> {
    let mut out = fs::OpenOptions::new().write(true).open(file)?;
    out.write_all(value.to_string().as_bytes())
        .map_err(|error| io::Error::new(error.kind(), format!("{}: {error}", file.display())))
}

/// A cgroup's `cgroup.procs` files, opened by the parent so that a child
/// can join the cgroup between fork and exec with nothing but `write`.
#[derive(Debug)]
pub struct Joiner {
    files: Vec<OwnedFd>,
}

impl Joiner {
    /// Moves the calling process into the cgroup. Async-signal-safe: it
    /// only calls `write`, so it may run in a child between fork and exec.
    pub fn join(&self) -> io::Result<()> {
        for file in &self.files {
            // SAFETY: writes one byte from a static buffer to an open fd.
            let written = unsafe { libc::write(file.as_raw_fd(), b"0".as_ptr().cast(), 1) };
            if written != 1 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_s_directory_is_its_name_escaped_one_to_one() {
        assert_eq!(tenant_dir("alice"), "tenant-alice");
        assert_eq!(tenant_dir("token #1"), "tenant-token%20%231");
        assert_eq!(tenant_dir(".."), "tenant-%2E%2E");
        assert_ne!(tenant_dir("a.b"), tenant_dir("a%2Eb"));
    }

    #[test]
    fn a_start_time_is_read_past_any_command_name() {
        let own = start_time("self").expect("this process has one");
        assert_eq!(start_time(&std::process::id().to_string()), Some(own));
        assert_eq!(start_time("0"), None);
        assert_eq!(server_name(12, 345), "12.345");
        assert!(alive(&own_server_name()));
        assert!(!alive("0.1"));
    }
}
