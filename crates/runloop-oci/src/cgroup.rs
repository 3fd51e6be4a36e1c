//! Control groups: where runc puts each container, and what the kernel
//! says about it afterwards.
//!
//! runc creates the container's cgroup (named after the container) with
//! the run's memory limit and the host's pids limit, and removes it on
//! `runc delete`. This module only reads: whether the controllers the
//! runtime relies on are there (checked at startup), whether swap is
//! accounted (so the limit can forbid swapping past it), and how many
//! processes the kernel's OOM killer killed in a container — which is how
//! a container that ran out of memory is told from one that crashed. Both
//! cgroup v1 (hybrid hosts) and v2 are read.

use std::fs;
use std::path::PathBuf;

const ROOT: &str = "/sys/fs/cgroup";

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
    for controller in ["memory", "pids"] {
        if !root.join(controller).join("cgroup.procs").exists() {
            return Err(format!(
                "no {controller} cgroup controller is mounted at {ROOT}/{controller}"
            ));
        }
    }
    Ok(Version::V1)
}

/// The cgroup path runc is given for a container: its own, at the top.
pub fn path(id: &str) -> String {
    format!("/{id}")
}

impl Version {
    /// Whether swap is accounted, so that a limit on memory plus swap can
    /// hold a container to its memory limit.
    pub fn accounts_swap(self) -> bool {
        match self {
            Version::V1 => PathBuf::from(ROOT)
                .join("memory/memory.memsw.limit_in_bytes")
                .exists(),
            Version::V2 => true,
        }
    }

    /// How many processes the OOM killer killed in the container's cgroup
    /// (`None` when the cgroup is gone or does not say).
    pub fn oom_kills(self, id: &str) -> Option<u64> {
        let (file, key) = match self {
            Version::V1 => (
                PathBuf::from(ROOT)
                    .join("memory")
                    .join(id)
                    .join("memory.oom_control"),
                "oom_kill",
            ),
            Version::V2 => (
                PathBuf::from(ROOT).join(id).join("memory.events"),
                "oom_kill",
            ),
        };
        let text = fs::read_to_string(file).ok()?;
        text.lines().find_map(|line| {
            let (name, value) = line.split_once(' ')?;
            (name == key).then(|| value.trim().parse().ok()).flatten()
        })
    }

    /// The container's cgroup directories that still exist.
    pub fn leftovers(self, id: &str) -> Vec<PathBuf> {
        let root = PathBuf::from(ROOT);
        match self {
            Version::V2 => vec![root.join(id)],
            Version::V1 => fs::read_dir(&root)
                .map(|entries| {
                    entries
                        .flatten()
                        .map(|entry| entry.path().join(id))
                        .collect()
                })
                .unwrap_or_default(),
        }
        .into_iter()
        .filter(|dir| dir.is_dir())
        .collect()
    }
}
