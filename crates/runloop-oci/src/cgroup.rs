//! Control groups: where runc puts each container, and what the kernel
//! says about it afterwards.
//!
//! runc creates the container's cgroup (named after the container) with
//! the run's memory limit and the host's pids limit, and removes it on
//! `runc delete`. This crate only reads them — whether the controllers
//! are there (checked at startup), whether swap is accounted, how many
//! processes the OOM killer killed in a container — and removes what a
//! killed server left; the code that does it is runloop's
//! [`runloop_runtime::cgroup`], which the exec runtime uses too.

pub use runloop_runtime::cgroup::{Cgroup, Version, detect};

/// The cgroup path runc is given for a container: its own, at the top.
pub fn path(id: &str) -> String {
    format!("/{id}")
}
