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

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the cgroup hierarchies are mounted.
pub const ROOT: &str = "/sys/fs/cgroup";

/// The controllers a run's cgroup uses.
const CONTROLLERS: [&str; 2] = ["memory", "pids"];

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

    /// Its directories: one per controller (v1), or one.
    fn dirs(&self) -> Vec<PathBuf> {
        match self.version {
            Version::V1 => CONTROLLERS.iter().map(|c| self.dir(c)).collect(),
            Version::V2 => vec![self.dir("")],
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
                let mut dir = PathBuf::from(ROOT);
                for part in self.path.split('/') {
                    write(&dir.join("cgroup.subtree_control"), "+memory +pids")?;
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
