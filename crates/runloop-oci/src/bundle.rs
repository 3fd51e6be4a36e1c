//! Bundles: the runtime-spec configuration (`config.json`) runc runs a
//! container from, built from the image's configuration and the run's
//! limits.
//!
//! It starts from the runtime spec's defaults — those of `runc spec`: the
//! capability set `CAP_AUDIT_WRITE`, `CAP_KILL`, `CAP_NET_BIND_SERVICE`,
//! `noNewPrivileges`, the standard `/proc`, `/dev`, `/sys` mounts, and pid,
//! mount, ipc, uts, network and cgroup namespaces — and adds what the run
//! needs and what keeps a hostile image in:
//!
//! - the process: the image's Entrypoint and Cmd, its Env plus `PORT`, its
//!   WorkingDir and User (resolved to ids in the image), started by the
//!   init ([`crate::init`]) as PID 1 when the host has one; at most
//!   `nofile` open files (`RLIMIT_NOFILE`);
//! - a user namespace: the container's ids are a range of unprivileged
//!   host ids ([`IdMapping`]), so its root is not the host's;
//! - the syscall filter ([`crate::seccomp`]): given to runc as the
//!   profile, or, once the host has read back the program runc makes of it
//!   ([`crate::filter`]), handed to the init, which installs it before the
//!   image's process starts;
//! - the root: the run's overlay, writable (writes go to the run's disk);
//!   `/tmp` bound from the run's disk;
//! - with egress, the run's resolver configuration bound read-only at
//!   `/etc/resolv.conf`;
//! - `/sys`: the host's, bound read-only (a user namespace may not mount a
//!   sysfs for a network namespace it does not own), with the parts that
//!   name the host's devices and interfaces masked ([`MASKED`]: other
//!   runs' loop devices are in `/sys/block`); `/proc` with the kernel's
//!   global files masked or read-only ([`READ_ONLY`]);
//! - the network namespace made for the run, joined by path;
//! - the memory limit (with swap, where accounted, held to the same
//!   figure: no swapping past it), a CPU quota, a pids limit, and no
//!   device access beyond runc's standard set (`/dev/null`, `/dev/zero`,
//!   …).

use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    LinuxCpuBuilder, LinuxDeviceCgroupBuilder, LinuxIdMappingBuilder, LinuxMemoryBuilder,
    LinuxNamespaceBuilder, LinuxNamespaceType, LinuxPidsBuilder, MountBuilder, PosixRlimitBuilder,
    PosixRlimitType, RootBuilder, Spec, UserBuilder,
};

use runloop_proto::error_chain::Chain;

use crate::image::Process;
use crate::user::{IdMapping, IdRange, Ids};

/// Paths made empty and unreadable in every container: the kernel's
/// memory, keys and timers as Docker masks them, and the parts of `/sys`
/// and `/proc` that list the host's block devices (every run's loop
/// device), network interfaces, firmware and power controls.
pub const MASKED: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/interrupts",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/partitions",
    "/proc/diskstats",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
    "/sys/block",
    "/sys/class/block",
    "/sys/dev/block",
    "/sys/devices/virtual/block",
    "/sys/class/net",
    "/sys/devices/virtual/net",
    "/sys/kernel/debug",
    "/sys/kernel/tracing",
    "/sys/kernel/security",
    "/sys/fs/bpf",
];

/// Paths a container may read and not write: the kernel's settings and
/// triggers.
pub const READ_ONLY: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The CPU quota's period, microseconds (the kernel's default).
pub const CPU_PERIOD: u64 = 100_000;

/// The path every image's environment gets when it names none.
const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The agent program's port when the image's `PORT` names none (protocol §10).
pub const DEFAULT_PORT: u16 = 8080;

/// Host threads a gVisor sandbox holds for itself, besides its guest's:
/// its kernel's Go runtime and the gofer. Measured 55–61 for a sandbox
/// with one agent on a 2-CPU host (`pids.current` of the run's cgroup);
/// the Go runtime's share grows with the CPUs, hence the margin.
pub const SANDBOX_OWN_THREADS: u32 = 256;

/// The host pids limit of a container whose agent may have `pids`
/// processes. Under runsc the host cgroup holds the whole sandbox, and
/// under its ptrace platform each guest process is a stub process and a
/// tracer thread: without room for those, a sandbox near its bound
/// fails to make a thread of its own kernel and ends (Go's fatal exit,
/// status 2) instead of refusing the agent's `fork`.
pub fn host_pids(pids: u32, sandbox: bool) -> u32 {
    if sandbox {
        pids.saturating_mul(2).saturating_add(SANDBOX_OWN_THREADS)
    } else {
        pids
    }
}

/// What one run's configuration is made of.
#[derive(Debug, Clone)]
pub struct Bundle<'a> {
    /// The image's process.
    pub process: &'a Process,
    /// Its user, as ids.
    pub ids: Ids,
    /// The run's directory (`rootfs/` and `disk/tmp` are in it).
    pub run: &'a Path,
    /// The container's host name.
    pub hostname: &'a str,
    /// The network namespace to join.
    pub netns: PathBuf,
    /// The cgroup path.
    pub cgroup: String,
    /// Memory limit, bytes.
    pub memory: u64,
    /// Whether swap is accounted (then it is held to the memory limit).
    pub swap: bool,
    /// Processes at once.
    pub pids: u32,
    /// The host ids of the container's ids.
    pub mapping: IdMapping,
    /// CPUs' worth of time per period (a fraction is a share of one).
    pub cpus: f64,
    /// Open files at once (`RLIMIT_NOFILE`, soft and hard).
    pub nofile: u64,
    /// Where the init is bound into the container, when it runs one.
    pub init: Option<InitMount>,
    /// A resolver configuration bound read-only at `/etc/resolv.conf`
    /// (runs with egress, [`crate::egress`]).
    pub resolv_conf: Option<PathBuf>,
    /// Whether the runtime is a sandbox with its own kernel (runsc): then
    /// no user namespace (the sandbox takes no id mapping here) and a
    /// sysfs of its own rather than the host's bound.
    pub sandbox: bool,
    /// The syscall filter as runc compiles the profile, made once: the
    /// init installs it (with an init, and not in a sandbox); `None`: runc
    /// is given the profile.
    pub filter: Option<&'a crate::filter::Prepared>,
}

/// The init binary: where it is on the host, bound read-only into the
/// container at [`crate::init::PATH`].
#[derive(Debug, Clone)]
pub struct InitMount {
    /// The binary on the host.
    pub source: PathBuf,
}

/// Why a configuration could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the container's configuration")]
pub struct BundleError(#[from] oci_spec::OciSpecError);

/// Writes `spec` as the bundle's `config.json` at `path`; why not, in
/// words that go down to the system's error (oci-spec's own says only
/// "io operation failed" and leaves the rest to its source).
pub(crate) fn save(spec: &Spec, path: &Path) -> Result<(), String> {
    spec.save(path)
        .map_err(|error| format!("cannot write {}: {}", path.display(), Chain(&error)))
}

/// The port the agent program listens on: the image's `PORT` when it is a
/// number in 1..=65535, else [`DEFAULT_PORT`].
pub fn port(process: &Process) -> u16 {
    process
        .env
        .iter()
        .rev()
        .find_map(|pair| pair.strip_prefix("PORT="))
        .and_then(|port| port.parse::<u16>().ok())
        .filter(|port| *port != 0)
        .unwrap_or(DEFAULT_PORT)
}

impl Bundle<'_> {
    /// The configuration.
    pub fn spec(&self) -> Result<Spec, BundleError> {
        let mut spec = Spec::default();
        spec.set_hostname(Some(self.hostname.to_owned()));
        spec.set_root(Some(
            RootBuilder::default()
                .path(super::disk::rootfs(self.run))
                .readonly(false)
                .build()?,
        ));

        let prepared = self.filter.filter(|_| self.init.is_some() && !self.sandbox);
        let variable = format!("{}=", crate::filter::VARIABLE);
        let mut env: Vec<String> = self
            .process
            .env
            .iter()
            .filter(|pair| !pair.starts_with("PORT=") && !pair.starts_with(&variable))
            .cloned()
            .collect();
        if !env.iter().any(|pair| pair.starts_with("PATH=")) {
            env.insert(0, DEFAULT_PATH.to_owned());
        }
        env.push(format!("PORT={}", port(self.process)));
        env.extend(prepared.map(|prepared| prepared.entry().to_owned()));
        let mut process = spec.process().clone().unwrap_or_default();
        let args = match &self.init {
            Some(_) => crate::init::wrap(&self.process.args),
            None => self.process.args.clone(),
        };
        process.set_args(Some(args));
        process.set_rlimits(Some(vec![
            PosixRlimitBuilder::default()
                .typ(PosixRlimitType::RlimitNofile)
                .hard(self.nofile)
                .soft(self.nofile)
                .build()?,
        ]));
        process.set_env(Some(env));
        process.set_cwd(PathBuf::from(&self.process.cwd));
        process.set_terminal(Some(false));
        process.set_no_new_privileges(Some(true));
        process.set_user(
            UserBuilder::default()
                .uid(self.ids.uid)
                .gid(self.ids.gid)
                .additional_gids(self.ids.groups.clone())
                .build()?,
        );
        spec.set_process(Some(process));

        let mut mounts: Vec<_> = spec
            .mounts()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|mount| {
                if mount.destination() == Path::new("/sys") && !self.sandbox {
                    MountBuilder::default()
                        .destination("/sys")
                        .typ("bind")
                        .source("/sys")
                        .options(
                            ["rbind", "ro", "nosuid", "nodev", "noexec"]
                                .map(String::from)
                                .to_vec(),
                        )
                        .build()
                } else {
                    Ok(mount)
                }
            })
            .collect::<Result<_, _>>()?;
        if let Some(init) = &self.init {
            mounts.push(
                MountBuilder::default()
                    .destination(crate::init::PATH)
                    .typ("bind")
                    .source(&init.source)
                    .options(["bind", "ro", "nosuid", "nodev"].map(String::from).to_vec())
                    .build()?,
            );
        }
        if let Some(resolv_conf) = &self.resolv_conf {
            mounts.push(
                MountBuilder::default()
                    .destination("/etc/resolv.conf")
                    .typ("bind")
                    .source(resolv_conf)
                    .options(
                        ["bind", "ro", "nosuid", "nodev", "noexec"]
                            .map(String::from)
                            .to_vec(),
                    )
                    .build()?,
            );
        }
        mounts.push(
            MountBuilder::default()
                .destination("/tmp")
                .typ("bind")
                .source(super::disk::tmp(self.run))
                .options(
                    ["rbind", "rw", "nosuid", "nodev"]
                        .map(String::from)
                        .to_vec(),
                )
                .build()?,
        );
        spec.set_mounts(Some(mounts));

        let mut linux = spec.linux().clone().unwrap_or_default();
        let namespaces = linux
            .namespaces()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|namespace| {
                if namespace.typ() == LinuxNamespaceType::Network {
                    LinuxNamespaceBuilder::default()
                        .typ(LinuxNamespaceType::Network)
                        .path(self.netns.clone())
                        .build()
                } else {
                    Ok(namespace)
                }
            })
            .chain((!self.sandbox).then(|| {
                LinuxNamespaceBuilder::default()
                    .typ(LinuxNamespaceType::User)
                    .build()
            }))
            .collect::<Result<Vec<_>, _>>()?;
        linux.set_namespaces(Some(namespaces));
        let mapping = |range: IdRange| {
            LinuxIdMappingBuilder::default()
                .container_id(0u32)
                .host_id(range.start)
                .size(range.count)
                .build()
        };
        if !self.sandbox {
            linux.set_uid_mappings(Some(vec![mapping(self.mapping.uids)?]));
            linux.set_gid_mappings(Some(vec![mapping(self.mapping.gids)?]));
        }
        linux.set_masked_paths(Some(MASKED.iter().map(|path| (*path).to_owned()).collect()));
        linux.set_readonly_paths(Some(
            READ_ONLY.iter().map(|path| (*path).to_owned()).collect(),
        ));
        if prepared.is_none() {
            linux.set_seccomp(Some(crate::seccomp::profile(self.sandbox)?));
        }
        linux.set_cgroups_path(Some(PathBuf::from(&self.cgroup)));
        let memory = i64::try_from(self.memory).unwrap_or(i64::MAX);
        let mut limit = LinuxMemoryBuilder::default().limit(memory);
        if self.swap {
            limit = limit.swap(memory);
        }
        let mut resources = linux.resources().clone().unwrap_or_default();
        resources.set_memory(Some(limit.build()?));
        // At least 1 ms a period: the kernel's smallest quota.
        let quota = (self.cpus * CPU_PERIOD as f64).round().max(1000.0) as i64;
        resources.set_cpu(Some(
            LinuxCpuBuilder::default()
                .quota(quota)
                .period(CPU_PERIOD)
                .build()?,
        ));
        resources.set_pids(Some(
            LinuxPidsBuilder::default()
                .limit(i64::from(host_pids(self.pids, self.sandbox)))
                .build()?,
        ));
        resources.set_devices(Some(vec![
            LinuxDeviceCgroupBuilder::default()
                .allow(false)
                .access("rwm")
                .build()?,
        ]));
        linux.set_resources(Some(resources));
        spec.set_linux(Some(linux));
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_not_written_says_why_down_to_the_system() {
        let dir = tempfile::tempdir().expect("a directory");
        let path = dir.path().join("gone").join("config.json");
        let why = save(&Spec::default(), &path).expect_err("no such directory");
        assert_eq!(
            why,
            format!(
                "cannot write {}: io operation failed: {}",
                path.display(),
                std::io::Error::from_raw_os_error(libc::ENOENT)
            )
        );
    }

    #[test]
    fn the_spec_carries_the_image_and_the_limits() {
        let process = Process {
            args: vec!["/agent".into(), "--listen".into()],
            env: vec!["PORT=9000".into(), "A=1".into()],
            cwd: "/srv".into(),
            user: None,
            stop_signal: None,
        };
        let bundle = Bundle {
            process: &process,
            ids: Ids {
                uid: 1000,
                gid: 1000,
                groups: vec![50],
            },
            run: Path::new("/store/runs/k"),
            hostname: "k",
            netns: PathBuf::from("/run/netns/runloop-k"),
            cgroup: "/runloop-k".into(),
            memory: 64 << 20,
            swap: true,
            pids: 128,
            mapping: IdMapping::both(crate::user::DEFAULT_RANGE),
            cpus: 1.5,
            nofile: 4096,
            init: Some(InitMount {
                source: PathBuf::from("/store/init"),
            }),
            resolv_conf: Some(PathBuf::from("/store/runs/k/resolv.conf")),
            sandbox: false,
            filter: None,
        };
        let spec = serde_json::to_value(bundle.spec().expect("spec")).expect("json");
        assert_eq!(
            spec["process"]["args"],
            serde_json::json!([crate::init::PATH, "--", "/agent", "--listen"])
        );
        assert_eq!(
            spec["process"]["rlimits"],
            serde_json::json!([{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}])
        );
        let mapping =
            serde_json::json!([{"containerID": 0, "hostID": 2_000_000_000u32, "size": 65536}]);
        assert_eq!(spec["linux"]["uidMappings"], mapping);
        assert_eq!(spec["linux"]["gidMappings"], mapping);
        assert_eq!(spec["linux"]["resources"]["cpu"]["quota"], 150_000);
        assert_eq!(spec["linux"]["resources"]["cpu"]["period"], 100_000);
        assert_eq!(spec["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ERRNO");
        for path in ["/proc/kcore", "/proc/keys", "/sys/firmware", "/sys/block"] {
            assert!(
                spec["linux"]["maskedPaths"]
                    .as_array()
                    .expect("masked")
                    .contains(&serde_json::json!(path)),
                "{path}"
            );
        }
        assert!(
            spec["linux"]["readonlyPaths"]
                .as_array()
                .expect("read-only")
                .contains(&serde_json::json!("/proc/sys"))
        );
        let mounts = spec["mounts"].as_array().expect("mounts");
        let sys = mounts
            .iter()
            .find(|mount| mount["destination"] == "/sys")
            .expect("/sys");
        assert_eq!(sys["type"], "bind");
        assert!(
            sys["options"]
                .as_array()
                .expect("options")
                .contains(&serde_json::json!("ro"))
        );
        let resolv_conf = mounts
            .iter()
            .find(|mount| mount["destination"] == "/etc/resolv.conf")
            .expect("/etc/resolv.conf");
        assert_eq!(resolv_conf["source"], "/store/runs/k/resolv.conf");
        assert!(
            resolv_conf["options"]
                .as_array()
                .expect("options")
                .contains(&serde_json::json!("ro"))
        );
        let init = mounts
            .iter()
            .find(|mount| mount["destination"] == crate::init::PATH)
            .expect("the init");
        assert_eq!(init["source"], "/store/init");
        assert_eq!(
            spec["process"]["env"],
            serde_json::json!([DEFAULT_PATH, "A=1", "PORT=9000"])
        );
        assert_eq!(spec["process"]["cwd"], "/srv");
        assert_eq!(spec["process"]["noNewPrivileges"], true);
        assert_eq!(
            spec["process"]["user"]["additionalGids"],
            serde_json::json!([50])
        );
        let bounding: std::collections::BTreeSet<&str> =
            spec["process"]["capabilities"]["bounding"]
                .as_array()
                .expect("a capability set")
                .iter()
                .filter_map(serde_json::Value::as_str)
                .collect();
        assert_eq!(
            bounding,
            ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"].into()
        );
        assert_eq!(spec["root"]["path"], "/store/runs/k/rootfs");
        assert_eq!(spec["linux"]["resources"]["memory"]["limit"], 64 << 20);
        assert_eq!(spec["linux"]["resources"]["memory"]["swap"], 64 << 20);
        assert_eq!(spec["linux"]["resources"]["pids"]["limit"], 128);
        // A sandbox's own threads get room besides the agent's 128.
        assert_eq!(host_pids(128, true), 2 * 128 + SANDBOX_OWN_THREADS);
        assert_eq!(host_pids(u32::MAX, true), u32::MAX);
        assert_eq!(spec["linux"]["cgroupsPath"], "/runloop-k");
        let namespaces = spec["linux"]["namespaces"].as_array().expect("namespaces");
        assert!(
            namespaces
                .contains(&serde_json::json!({"type": "network", "path": "/run/netns/runloop-k"}))
        );
        for kind in ["pid", "mount", "ipc", "uts", "user"] {
            assert!(
                namespaces.contains(&serde_json::json!({"type": kind})),
                "{kind}"
            );
        }
        let tmp = spec["mounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .find(|mount| mount["destination"] == "/tmp")
            .expect("/tmp");
        assert_eq!(tmp["source"], "/store/runs/k/disk/tmp");
        assert_eq!(port(&process), 9000);
        assert_eq!(port(&Process::default()), DEFAULT_PORT);
    }
}
