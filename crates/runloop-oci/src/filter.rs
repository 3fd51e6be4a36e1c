//! The syscall filter made once: the program runc compiles from the
//! profile ([`crate::seccomp`]), read back from a container of its own when
//! the host opens, and installed in every later container by the init.
//!
//! ```text
//! host opens:  runc run (profile in config.json) ─▶ init --hold, filtered ─▶ ptrace: the filter's BPF
//! each run:    config.json without the profile, RUNLOOP_SECCOMP_BPF=<that BPF> ─▶ init installs it ─▶ agent
//! ```
//!
//! Why: runc compiles the profile with libseccomp, and patches the result
//! with its own stub, on every start; for this profile (some 400 calls,
//! three x86 ABIs) that was 20 ms of a 70 ms `runc run` (PROFILING.md,
//! "Where a start goes"). The program depends on nothing but the profile
//! and the runc on the machine, so the host asks runc once — a container
//! of its own whose process is the init, which only says `held` — and
//! reads the filter back from the kernel (`PTRACE_SECCOMP_GET_FILTER`, the
//! program the kernel runs, byte for byte). Later containers get no
//! profile in their configuration; the init ([`crate::init`]), the first
//! thing that runs in them, installs that same program on itself before it
//! starts the image's process, which inherits it, as it inherited runc's.
//! No-new-privileges is set by runc before the init runs, as before, so
//! the init needs no privilege to install it. The variable is not passed
//! on to the agent.
//!
//! What the agent gets is the filter runc would have given it; the
//! container's own first moments (the init's start, our static binary)
//! run before it rather than after. Where it cannot be read back (no
//! ptrace, a kernel without `CONFIG_CHECKPOINT_RESTORE`), without the init
//! (`--container-init false`) and under runsc (whose kernel applies the
//! profile itself), runc is given the profile as before.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use oci_spec::runtime::{
    LinuxBuilder, MountBuilder, ProcessBuilder, RootBuilder, Spec, UserBuilder,
};
use runloop_proto::error_chain::Chain;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::cgroup::{self, Version};
use crate::runc::{self, Runc};

/// The environment variable the init reads the filter from.
pub const VARIABLE: &str = "RUNLOOP_SECCOMP_BPF";

/// How long the host waits for its filter container to say `held`.
const HOLD_TIMEOUT: Duration = Duration::from_secs(30);

/// A container's syscall filter, as the kernel runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// Each filter's BPF program (`struct sock_filter`s), oldest first.
    filters: Vec<Vec<u8>>,
    /// The environment entry that hands it to the init.
    entry: Arc<str>,
}

impl Prepared {
    /// The filters `filters` (oldest first).
    pub fn new(filters: Vec<Vec<u8>>) -> Prepared {
        let hex: Vec<String> = filters
            .iter()
            .map(|filter| filter.iter().map(|byte| format!("{byte:02x}")).collect())
            .collect();
        let entry = format!("{VARIABLE}={}", hex.join(","));
        Prepared {
            filters,
            entry: Arc::from(entry),
        }
    }

    /// Each filter's program, oldest first.
    pub fn filters(&self) -> &[Vec<u8>] {
        &self.filters
    }

    /// Its instructions, all filters together.
    pub fn instructions(&self) -> usize {
        self.filters.iter().map(|filter| filter.len() / 8).sum()
    }

    /// `RUNLOOP_SECCOMP_BPF=…`, for the container's environment.
    pub fn entry(&self) -> &str {
        &self.entry
    }
}

/// What a filter container needs of the host.
#[derive(Debug, Clone, Copy)]
pub struct Maker<'a> {
    /// runc.
    pub runc: &'a Runc,
    /// The cgroup hierarchy (for the teardown).
    pub cgroups: Version,
    /// The store's run directories: the container is one run, removed as
    /// runs are (a crash leaves it to the next server's sweep).
    pub runs: &'a Path,
    /// The init binary on the host.
    pub init: &'a Path,
}

/// The filter of a container whose configuration holds the profile
/// (`prepared` `None`: runc compiles it) or that gets `prepared` the
/// init's way: a container of the init alone, holding; its filters read
/// back, then it is removed.
pub async fn read_back(maker: Maker<'_>, prepared: Option<&Prepared>) -> Result<Prepared, String> {
    let key = crate::random_name();
    let dir = maker.runs.join(&key);
    let id = runc::id(&key);
    let read = hold_and_read(maker, &dir, &id, prepared).await;
    if let Err(error) = maker.runc.kill(&id, "SIGKILL", true).await
        && !error.says("does not exist")
        && !error.says("not running")
    {
        tracing::warn!(%id, %error, "cannot kill the filter's container");
    }
    crate::teardown::teardown(maker.runc, maker.cgroups, maker.runs, &key).await;
    read
}

async fn hold_and_read(
    maker: Maker<'_>,
    dir: &Path,
    id: &str,
    prepared: Option<&Prepared>,
) -> Result<Prepared, String> {
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&rootfs)
        .map_err(|error| format!("cannot make {}: {error}", rootfs.display()))?;
    let spec = spec(&rootfs, maker.init, &cgroup::path(id), prepared).map_err(|error| {
        format!(
            "cannot make the filter container's configuration: {}",
            Chain(&error)
        )
    })?;
    let config = dir.join("config.json");
    // As bundle::save says it (this module stays below bundle, which
    // imports it).
    spec.save(&config)
        .map_err(|error| format!("cannot write {}: {}", config.display(), Chain(&error)))?;
    let mut child = maker
        .runc
        .run_command(dir, id)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|error| format!("cannot start runc: {error}"))?;
    let stdout = child.stdout.take().ok_or("runc has no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let held = tokio::time::timeout(HOLD_TIMEOUT, lines.next_line()).await;
    match held {
        Ok(Ok(Some(line))) if line == "held" => {}
        other => {
            let _ = child.start_kill();
            let why = runc::last_error(dir).unwrap_or_else(|| format!("{other:?}"));
            return Err(format!("the filter's container did not start: {why}"));
        }
    }
    let pid = maker
        .runc
        .pid(id)
        .await
        .map_err(|error| format!("cannot find the filter container's process: {error}"))?;
    let filters = tokio::task::spawn_blocking(move || read_filters(pid))
        .await
        .map_err(|error| error.to_string())?
        .map_err(|error| format!("cannot read the filter back from the kernel: {error}"))?;
    let _ = child.start_kill();
    let _ = child.wait().await;
    if filters.is_empty() {
        return Err("the filter's container runs without a filter".to_owned());
    }
    Ok(Prepared::new(filters))
}

/// The filter container's configuration: runc's defaults, the init held
/// as its process, and the profile (or `prepared`, the init's way).
fn spec(
    rootfs: &Path,
    init: &Path,
    cgroup: &str,
    prepared: Option<&Prepared>,
) -> Result<Spec, oci_spec::OciSpecError> {
    let mut spec = Spec::default();
    spec.set_root(Some(
        RootBuilder::default()
            .path(rootfs.to_path_buf())
            .readonly(true)
            .build()?,
    ));
    let mut env = vec!["PATH=/".to_owned()];
    env.extend(prepared.map(|prepared| prepared.entry().to_owned()));
    spec.set_process(Some(
        ProcessBuilder::default()
            .args(vec![crate::init::PATH.to_owned(), "--hold".to_owned()])
            .env(env)
            .cwd(PathBuf::from("/"))
            .user(UserBuilder::default().uid(0u32).gid(0u32).build()?)
            .no_new_privileges(true)
            .terminal(false)
            .build()?,
    ));
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    mounts.push(
        MountBuilder::default()
            .destination(crate::init::PATH)
            .typ("bind")
            .source(init)
            .options(["bind", "ro", "nosuid", "nodev"].map(String::from).to_vec())
            .build()?,
    );
    spec.set_mounts(Some(mounts));
    let mut linux = spec
        .linux()
        .clone()
        .unwrap_or(LinuxBuilder::default().build()?);
    if prepared.is_none() {
        linux.set_seccomp(Some(crate::seccomp::profile(false)?));
    }
    linux.set_cgroups_path(Some(PathBuf::from(cgroup)));
    spec.set_linux(Some(linux));
    Ok(spec)
}

/// Every seccomp filter of process `pid`, oldest first, as the kernel
/// runs it (`PTRACE_SECCOMP_GET_FILTER`); blocking, and on one thread
/// (the tracer is the thread that attached).
pub fn read_filters(pid: i32) -> io::Result<Vec<Vec<u8>>> {
    const PTRACE_SECCOMP_GET_FILTER: libc::c_uint = 0x420c;
    // SAFETY: ptrace requests on integers and on buffers that outlive the
    // calls; the tracee is detached before returning.
    unsafe {
        if libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) == -1 {
            return Err(io::Error::last_os_error());
        }
        let read = (|| {
            if libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            let mut status = 0;
            if libc::waitpid(pid, &mut status, libc::__WALL) == -1 {
                return Err(io::Error::last_os_error());
            }
            let mut filters = Vec::new();
            for index in 0.. {
                let count = libc::ptrace(
                    PTRACE_SECCOMP_GET_FILTER,
                    pid,
                    index as libc::c_long,
                    std::ptr::null_mut::<u8>(),
                );
                if count == -1 {
                    let error = io::Error::last_os_error();
                    // Past the oldest filter.
                    if error.raw_os_error() == Some(libc::ENOENT) && index > 0 {
                        break;
                    }
                    return Err(error);
                }
                let mut program = vec![0u8; usize::try_from(count).unwrap_or(0) * 8];
                if libc::ptrace(
                    PTRACE_SECCOMP_GET_FILTER,
                    pid,
                    index as libc::c_long,
                    program.as_mut_ptr(),
                ) != count
                {
                    return Err(io::Error::last_os_error());
                }
                filters.push(program);
            }
            // Index 0 is the newest.
            filters.reverse();
            Ok(filters)
        })();
        libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0);
        read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_is_hex_per_filter_oldest_first() {
        let prepared = Prepared::new(vec![vec![0, 1, 2, 3, 4, 5, 6, 0xff], vec![0xab; 8]]);
        assert_eq!(
            prepared.entry(),
            "RUNLOOP_SECCOMP_BPF=00010203040506ff,abababababababab"
        );
        assert_eq!(prepared.instructions(), 2);
    }
}
