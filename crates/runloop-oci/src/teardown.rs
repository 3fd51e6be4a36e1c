//! A run's teardown: everything of one run removed by its key alone —
//! its runc container, the processes runc did not know of, its cgroup,
//! its network namespace and egress link, its mounts, loop device and files.
//!
//! By key alone because it serves three callers that know different
//! amounts of the run: a container's own supervisor at its end, a start
//! given up on half-way, and a server that sweeps what a killed server
//! left in its store (which knows only the run's directory name). It
//! takes the parts of the host it needs, not the host, so that the host
//! (which sweeps) and the container (which ends) both call down to it.

use std::path::Path;

use runloop_proto::error_chain::Chain;
use tracing::warn;

use crate::cgroup;
use crate::disk;
use crate::egress;
use crate::network;
use crate::runc::{self, Runc};

/// Removes everything of the run `key`: its container, cgroup, network,
/// mounts, loop device and files. Each step goes on whatever the last one
/// did; failures are logged.
pub async fn teardown(runc: &Runc, cgroups: cgroup::Version, runs: &Path, key: &str) {
    let id = runc::id(key);
    if let Err(error) = runc.delete(&id).await {
        warn!(%id, %error, "cannot delete the container");
    }
    // What runc did not know of (a runc killed while it made the
    // container leaves its `runc init` in the cgroup), wherever the
    // container's cgroup is (below its tenant's, by its name alone).
    for group in cgroup::of_container(cgroups, &id) {
        if !group.procs().is_empty() {
            let killing = group.clone();
            let _ = tokio::task::spawn_blocking(move || killing.kill()).await;
        }
        for dir in group.leftovers() {
            if let Err(error) = std::fs::remove_dir(&dir) {
                warn!(%id, dir = %dir.display(), %error, "cannot remove the container's cgroup");
            }
        }
    }
    let run = runs.join(key);
    if let Err(error) = egress::detach(key, &run).await {
        warn!(%id, error = %Chain(&error), "cannot remove the container's egress link");
    }
    if let Err(error) = network::remove(key).await {
        warn!(%id, error = %Chain(&error), "cannot remove the container's network");
    }
    if let Err(error) = disk::remove(&run).await {
        warn!(%id, error = %Chain(&error), "cannot remove the run's disk and files");
    }
}
