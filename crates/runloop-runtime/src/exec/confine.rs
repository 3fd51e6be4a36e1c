//! Confinement: how the exec runtime holds its children to a run's
//! limits, and how a server cleans up after one that was killed.
//!
//! With cgroups (root, and the memory and pids controllers), every run
//! gets a cgroup of its own, below its tenant's, below one per server
//! process ([`cgroup::Tenants`]: the tenant's runs share its CPU weight):
//!
//! ```text
//! /sys/fs/cgroup/{memory,pids,cpu}/runloop-tenants/<server pid>.<start time>/tenant-<name>/<run>   (v1)
//! /sys/fs/cgroup/runloop-tenants/<server pid>.<start time>/tenant-<name>/<run>                     (v2)
//! ```
//!
//! (`runloop-exec/<server pid>.<start time>/`, where they were before, is
//! still made and swept: it says which servers run exec runs.)
//!
//! The child joins its run's cgroup before it runs a single instruction
//! of the program, so its memory limit counts everything the program and
//! its descendants use, and the run's end kills every process in it.
//!
//! A server killed outright (SIGKILL, a crash) cannot stop its runs: its
//! direct children die with it (`PR_SET_PDEATHSIG`), but their
//! descendants live on, still held by their cgroups' limits. The next
//! server to start on the machine finds the server cgroups whose process
//! is gone (no process with that pid and start time) and kills and
//! removes them before it runs anything. Until then, they run. (A server
//! judges another one alive by `/proc`, so servers that share a cgroup
//! hierarchy must share a pid namespace too, as processes of one host do.)
//!
//! Without cgroups (not root, no controllers) a run's memory is the
//! child's `RLIMIT_DATA` and its processes are its process group, which
//! is what [`Confinement::shortfall`] tells the operator at startup.

use std::sync::OnceLock;

use tracing::{info, warn};

use crate::cgroup::{self, Cgroup};

/// The cgroup below which every server keeps its runs' cgroups.
pub const PARENT: &str = "runloop-exec";

/// How the exec runtime holds its children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confinement {
    /// A cgroup per run, below this server's own.
    Cgroups(Cgroup),
    /// No cgroups, and why: memory as `RLIMIT_DATA`, processes as a
    /// process group.
    Rlimit(String),
}

impl Confinement {
    /// This process's confinement, found once: a cgroup of its own below
    /// [`PARENT`] when the host allows it, after the leftovers of servers
    /// that are gone were removed; else `RLIMIT_DATA`, with the reason.
    pub fn host() -> &'static Confinement {
        static HOST: OnceLock<Confinement> = OnceLock::new();
        HOST.get_or_init(|| {
            let confinement = Confinement::detect();
            match confinement.shortfall() {
                Some(shortfall) => warn!("{shortfall}"),
                None => info!("exec agent programs run in a cgroup each (memory, pids)"),
            }
            confinement
        })
    }

    fn detect() -> Confinement {
        let version = match cgroup::detect() {
            Ok(version) => version,
            Err(why) => return Confinement::Rlimit(why),
        };
        let parent = Cgroup::new(version, PARENT);
        sweep(&parent);
        // The tenants' cgroups, where the runs go: those of servers gone
        // are removed now too, before anything runs.
        let _ = cgroup::Tenants::of_host();
        let own = parent.child(&cgroup::own_server_name());
        match own.create(None) {
            Ok(()) => Confinement::Cgroups(own),
            Err(error) => {
                Confinement::Rlimit(format!("cannot make the cgroup {}: {error}", own.path()))
            }
        }
    }

    /// What is not enforced for exec agent programs, in words for the
    /// operator; `None` with cgroups.
    pub fn shortfall(&self) -> Option<String> {
        match self {
            Confinement::Cgroups(_) => None,
            Confinement::Rlimit(why) => Some(format!(
                "exec agent programs run without cgroups ({why}): a run's memory is held only as its \
                 program's RLIMIT_DATA, which counts neither shared memory nor its children; the \
                 number of its processes is not limited; and a descendant that leaves its process \
                 group (setsid) outlives the run"
            )),
        }
    }

    /// Removes this server's own cgroup, once its runs are gone (a server
    /// that shuts down calls it last; what is left is swept by the next).
    pub fn release(&self) {
        if let Confinement::Cgroups(own) = self
            && own.children().is_empty()
        {
            let _ = own.remove();
        }
        if let Some(tenants) = cgroup::Tenants::of_host() {
            tenants.release();
        }
    }
}

/// Kills and removes the runs of every server below `parent` whose
/// process is gone.
fn sweep(parent: &Cgroup) {
    for server in parent.children() {
        let name = server.path().rsplit('/').next().unwrap_or_default();
        if cgroup::alive(name) {
            continue;
        }
        let mut killed = 0;
        let runs = server.children();
        for run in &runs {
            killed += run.procs().len();
            if let Err(error) = run.remove() {
                warn!(cgroup = run.path(), %error, "cannot remove a leftover run's cgroup");
            }
        }
        if let Err(error) = server.remove() {
            warn!(cgroup = server.path(), %error, "cannot remove a leftover server's cgroup");
            continue;
        }
        if !runs.is_empty() {
            warn!(
                cgroup = server.path(),
                runs = runs.len(),
                killed,
                "removed the runs of an exec server that ended without stopping them"
            );
        }
    }
}
