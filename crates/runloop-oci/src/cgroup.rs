//! Control groups: where runc puts each container, and what the kernel
//! says about it afterwards.
//!
//! runc creates the container's cgroup (named after the container) with
//! the run's memory limit and the host's pids limit, below the cgroup of
//! its tenant ([`runloop_runtime::cgroup::Tenants`]: a tenant's runs share
//! one CPU weight), and removes it on `runc delete`. This crate only reads them — whether the controllers
//! are there (checked at startup), whether swap is accounted, how many
//! processes the OOM killer killed in a container, or, for a runsc
//! sandbox whose cgroup went with it, whether the kernel's log says it
//! killed one ([`oom_logged`]) — and removes what a killed server left; the code that does it is runloop's
//! [`runloop_runtime::cgroup`], which the exec runtime uses too.

pub use runloop_runtime::cgroup::{Cgroup, Version, detect};

use runloop_runtime::cgroup::TENANTS;

/// The cgroup path of a container with no tenant's cgroup above it (no
/// cgroups for tenants on the host): its own, at the top.
pub fn path(id: &str) -> String {
    format!("/{id}")
}

/// Every cgroup of container `id` there may be, by its name alone: below
/// any server's tenant (`runloop-tenants/*/*/id`), or at the top, in any
/// hierarchy. What a teardown that knows only the run's key removes.
pub fn of_container(version: Version, id: &str) -> Vec<Cgroup> {
    let mut found = vec![Cgroup::new(version, &path(id))];
    for server in Cgroup::new(version, TENANTS).children() {
        for tenant in server.children() {
            found.push(tenant.child(id));
        }
    }
    found.retain(|cgroup| !cgroup.leftovers().is_empty());
    found
}

/// Whether the kernel's log says it killed a process of container `id`'s
/// cgroup at that cgroup's memory limit.
///
/// What names an OOM kill under runsc: the kernel kills the sandbox
/// itself, and runsc removes the sandbox's cgroup — its OOM count with
/// it — as the sandbox ends, before the container's end can be read
/// there. The log's `oom-kill:` line names the cgroup (`oom_memcg=` the
/// one whose limit was hit), and a run's cgroup is named after its
/// random key, so a line naming it is that run's. Reads `/dev/kmsg` to
/// its end without waiting; false when it cannot be read.
pub fn oom_logged(id: &str) -> bool {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;

    let Ok(mut log) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open("/dev/kmsg")
    else {
        return false;
    };
    // The memcg is the container's own, wherever it is in the tree.
    let own = format!("/{id}");
    let names = |text: &str| {
        text.split("oom_memcg=")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .is_some_and(|memcg| memcg.ends_with(&own))
    };
    // One record a read; a record is at most a few KiB.
    let mut record = vec![0u8; 8192];
    loop {
        match log.read(&mut record) {
            Ok(0) => return false,
            Ok(read) => {
                let text = String::from_utf8_lossy(&record[..read]);
                if text.contains("oom-kill:") && names(&text) {
                    return true;
                }
            }
            // A record overwritten while read: the next one follows.
            Err(error) if error.raw_os_error() == Some(rustix::io::Errno::PIPE.raw_os_error()) => {}
            Err(_) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oom_kill_is_read_from_the_kernels_log_by_the_cgroup_it_names() {
        if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
            return;
        }
        let (killed, other) = (
            format!("runloop-{}", crate::random_name()),
            format!("runloop-{}", crate::random_name()),
        );
        assert!(!oom_logged(&killed));
        // The kernel's line, as a root process may write one to the log.
        let line = format!(
            "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset={killed},mems_allowed=0,oom_memcg=/{killed},task_memcg=/{killed},task=exe,pid=1,uid=0\n"
        );
        std::fs::write("/dev/kmsg", line).expect("written to the kernel's log");
        assert!(oom_logged(&killed));
        assert!(!oom_logged(&other));
        // Below a tenant's cgroup, as runs are.
        let nested = format!("runloop-{}", crate::random_name());
        let line = format!(
            "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset={nested},mems_allowed=0,oom_memcg=/runloop-tenants/1.2/tenant-alice/{nested},task_memcg=/runloop-tenants/1.2/tenant-alice/{nested},task=exe,pid=1,uid=0\n"
        );
        std::fs::write("/dev/kmsg", line).expect("written to the kernel's log");
        assert!(oom_logged(&nested));
        // A name that only begins the same is another cgroup.
        assert!(!oom_logged(&killed[..killed.len() - 1]));
    }
}
