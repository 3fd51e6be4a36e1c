//! A run's container as the server holds it: [`OciContainer`], the
//! supervised agent, and [`OciRun`], what the oci runtime says of it (its
//! run's key, directory and cgroup).
//!
//! Why a module of its own: the container's life ([`container`]) makes
//! them and its warm [`pool`] keeps and hands them out; with the types
//! here, both import them from below, the container's module imports the
//! pool and the pool nothing of the container's, so imports go one way
//! (`container → host → pool → run`, and `container → pool`, `container
//! → run`).
//!
//! [`container`]: crate::container
//! [`pool`]: crate::pool

use std::path::{Path, PathBuf};

use runloop_runtime::supervised::Supervised;

/// What the oci runtime says of a container: its run's key, directory
/// and cgroup.
#[derive(Debug)]
pub struct OciRun {
    key: String,
    dir: PathBuf,
    cgroup: String,
}

impl OciRun {
    /// The run `key`, whose directory is `dir` and whose container's
    /// cgroup is `cgroup`.
    pub(crate) fn new(key: String, dir: PathBuf, cgroup: String) -> OciRun {
        OciRun { key, dir, cgroup }
    }

    /// The run's key (its container is `runloop-KEY`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The run's directory in the store.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The container's cgroup path (below its tenant's).
    pub fn cgroup(&self) -> &str {
        &self.cgroup
    }
}

/// One running container, as the server sees it ([`Supervised`]).
pub type OciContainer = Supervised<OciRun>;
