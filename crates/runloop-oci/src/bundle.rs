//! Bundles: the runtime-spec configuration (`config.json`) runc runs a
//! container from, built from the image's configuration and the run's
//! limits.
//!
//! It starts from the runtime spec's defaults — those of `runc spec`: the
//! capability set `CAP_AUDIT_WRITE`, `CAP_KILL`, `CAP_NET_BIND_SERVICE`,
//! `noNewPrivileges`, the standard `/proc`, `/dev`, `/sys` mounts, masked
//! and read-only kernel paths, and pid, mount, ipc, uts, network and cgroup
//! namespaces — and adds what the run needs:
//!
//! - the process: the image's Entrypoint and Cmd, its Env plus `PORT`, its
//!   WorkingDir and User (resolved to ids in the image);
//! - the root: the run's overlay, writable (writes go to the run's disk);
//!   `/tmp` bound from the run's disk;
//! - the network namespace made for the run, joined by path;
//! - the memory limit (with swap, where accounted, held to the same
//!   figure: no swapping past it), a pids limit, and no device access
//!   beyond runc's standard set (`/dev/null`, `/dev/zero`, …).

use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    LinuxDeviceCgroupBuilder, LinuxMemoryBuilder, LinuxNamespaceBuilder, LinuxNamespaceType,
    LinuxPidsBuilder, MountBuilder, RootBuilder, Spec, UserBuilder,
};

use crate::image::Process;
use crate::user::Ids;

/// The path every image's environment gets when it names none.
const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The agent program's port when the image's `PORT` names none (protocol §10).
pub const DEFAULT_PORT: u16 = 8080;

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
}

/// Why a configuration could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the container's configuration: {0}")]
pub struct BundleError(#[from] oci_spec::OciSpecError);

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

        let mut env: Vec<String> = self
            .process
            .env
            .iter()
            .filter(|pair| !pair.starts_with("PORT="))
            .cloned()
            .collect();
        if !env.iter().any(|pair| pair.starts_with("PATH=")) {
            env.insert(0, DEFAULT_PATH.to_owned());
        }
        env.push(format!("PORT={}", port(self.process)));
        let mut process = spec.process().clone().unwrap_or_default();
        process.set_args(Some(self.process.args.clone()));
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

        let mut mounts = spec.mounts().clone().unwrap_or_default();
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
            .collect::<Result<Vec<_>, _>>()?;
        linux.set_namespaces(Some(namespaces));
        linux.set_cgroups_path(Some(PathBuf::from(&self.cgroup)));
        let memory = i64::try_from(self.memory).unwrap_or(i64::MAX);
        let mut limit = LinuxMemoryBuilder::default().limit(memory);
        if self.swap {
            limit = limit.swap(memory);
        }
        let mut resources = linux.resources().clone().unwrap_or_default();
        resources.set_memory(Some(limit.build()?));
        resources.set_pids(Some(
            LinuxPidsBuilder::default()
                .limit(i64::from(self.pids))
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
        };
        let spec = serde_json::to_value(bundle.spec().expect("spec")).expect("json");
        assert_eq!(
            spec["process"]["args"],
            serde_json::json!(["/agent", "--listen"])
        );
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
        assert_eq!(spec["linux"]["cgroupsPath"], "/runloop-k");
        let namespaces = spec["linux"]["namespaces"].as_array().expect("namespaces");
        assert!(
            namespaces
                .contains(&serde_json::json!({"type": "network", "path": "/run/netns/runloop-k"}))
        );
        for kind in ["pid", "mount", "ipc", "uts"] {
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
