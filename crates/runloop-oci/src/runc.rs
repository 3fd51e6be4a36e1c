//! runc: the OCI runtime that runs each container, driven through its
//! command line.
//!
//! A container runs under `runc run --keep` in the foreground: runc stays
//! the parent of the container's first process, passes its stdout and
//! stderr through, and exits with its status when it ends — so the host
//! learns of the end by waiting for a child, with no polling. `--keep`
//! leaves the stopped container (and its cgroup) in place until `runc
//! delete`, so the cgroup's OOM count can be read after the end.
//! Containers are named `runloop-KEY`, and `runc list` shows them under
//! runc's default state directory like any other.
//!
//! Which runc matters: versions before 1.2.8 (and 1.3.x before 1.3.3) let
//! a malicious image turn runc's own setup writes (to `/dev/null`, the
//! masked paths, `/proc` files) against the host — CVE-2025-31133,
//! CVE-2025-52565 and CVE-2025-52881. The host logs the version it runs
//! and warns about those ([`advisory`]); what closes them is a fixed runc
//! or `--oci-runtime runsc`, whose kernel is not the host's.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use crate::command::{self, CommandError};

/// The container id of a run.
pub fn id(key: &str) -> String {
    format!("runloop-{key}")
}

/// Where runc logs its own messages about a run (JSON lines).
pub fn log(bundle: &Path) -> PathBuf {
    bundle.join("runc.log")
}

/// The last error runc logged for a run, if any: why a container did not
/// start (an entrypoint that does not exist, a bad working directory…).
pub fn last_error(bundle: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log(bundle)).ok()?;
    text.lines().rev().find_map(|line| {
        let entry: serde_json::Value = serde_json::from_str(line).ok()?;
        (entry["level"] == "error")
            .then(|| entry["msg"].as_str().map(str::to_owned))
            .flatten()
    })
}

/// A runc version, as `runc --version` prints it (`runc version 1.1.5+ds1`).
pub fn parse_version(line: &str) -> Option<(u32, u32, u32)> {
    let version = line.split_whitespace().nth(2)?;
    let core = version.split(['+', '-', '~']).next()?;
    let mut parts = core.split('.').map(|part| part.parse::<u32>().ok());
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

/// The warning for a runc version without the fixes for the malicious
/// image CVEs of 2025, or `None` when it has them. (A distribution may
/// have backported the fixes without changing the version: the warning
/// then says so.)
pub fn advisory(version: (u32, u32, u32)) -> Option<String> {
    let fixed = match version {
        (1, 2, patch) => patch >= 8,
        (1, 3, patch) => patch >= 3,
        (major, minor, _) => (major, minor) > (1, 3),
    };
    (!fixed).then(|| {
        let (major, minor, patch) = version;
        format!(
            "runc {major}.{minor}.{patch} predates the fixes for CVE-2025-31133, CVE-2025-52565 and CVE-2025-52881 (runc 1.2.8, 1.3.3): a malicious image may reach the host through runc's own setup, unless the distribution backported them; use a fixed runc or --oci-runtime runsc"
        )
    })
}

/// Which OCI runtime runs the containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    /// runc: the container's processes run on the host's kernel, in
    /// namespaces, under the syscall filter.
    #[default]
    Runc,
    /// runsc (gVisor): the container's processes run on gVisor's own
    /// kernel in user space, which alone talks to the host's. Run with
    /// `--network=host` — the host network of the sandbox being the run's
    /// own namespace (gVisor's netstack does not start on every kernel)
    /// — `--oci-seccomp` (our filter, applied by gVisor's kernel) and
    /// `--overlay2=none` (the root's writes go to the run's disk).
    Runsc,
}

impl Kind {
    /// The runtime's command name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Runc => "runc",
            Kind::Runsc => "runsc",
        }
    }
}

/// The OCI runtime binary (runc, or runsc which takes the same commands).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runc {
    binary: PathBuf,
    kind: Kind,
}

impl Runc {
    /// runc at `binary` (a path, or a name looked up in `PATH`).
    pub fn new(binary: impl Into<PathBuf>) -> Runc {
        Runc::of_kind(binary, Kind::Runc)
    }

    /// The runtime `kind` at `binary`.
    pub fn of_kind(binary: impl Into<PathBuf>, kind: Kind) -> Runc {
        Runc {
            binary: binary.into(),
            kind,
        }
    }

    /// Which runtime it is.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    async fn run<I, S>(&self, args: I) -> Result<String, CommandError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        command::run(self.binary.as_os_str(), args, None).await
    }

    /// Its version line.
    pub async fn version(&self) -> Result<String, CommandError> {
        let out = self.run(["--version"]).await?;
        Ok(out.lines().next().unwrap_or_default().to_owned())
    }

    /// The command that runs the bundle at `bundle` as container `id`, in
    /// the foreground, keeping it after it ends; runc's own messages go to
    /// [`log`]`(bundle)`.
    pub fn run_command(&self, bundle: &Path, id: &str) -> Command {
        let mut command = Command::new(&self.binary);
        if self.kind == Kind::Runsc {
            command.args(["--network=host", "--oci-seccomp", "--overlay2=none"]);
        }
        command
            .arg("--log")
            .arg(log(bundle))
            .args(["--log-format", "json", "run"]);
        // runsc has no --keep: its cgroup goes with the container.
        if self.kind == Kind::Runc {
            command.arg("--keep");
            // No session keyring of its own: the kernel counts keys per
            // host user (200 by default, kernel.keys.maxkeys), every
            // container of a server is the same host user, so a keyring
            // each capped the host near 200 containers, and one tenant's
            // runs could take the rest's. The container has no use for
            // one: its filter refuses keyctl, add_key and request_key.
            command.arg("--no-new-keyring");
        }
        command
            .arg("--bundle")
            .arg(bundle)
            .arg(id)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// Sends `signal` to the container's first process, or with `all` to
    /// every process in it.
    pub async fn kill(&self, id: &str, signal: &str, all: bool) -> Result<(), CommandError> {
        let mut args = vec!["kill"];
        if all {
            args.push("--all");
        }
        args.extend([id, signal]);
        self.run(args).await.map(drop)
    }

    /// The host pid of the container's first process (`runc state`).
    pub async fn pid(&self, id: &str) -> Result<i32, CommandError> {
        let state = self.run(["state", id]).await?;
        serde_json::from_str::<serde_json::Value>(&state)
            .ok()
            .and_then(|state| state["pid"].as_i64())
            .and_then(|pid| i32::try_from(pid).ok())
            .filter(|pid| *pid > 0)
            .ok_or_else(|| CommandError {
                command: format!("runc state {id}"),
                why: format!("no pid in its answer: {}", state.trim()),
            })
    }

    /// Deletes the container (killing what is left of it); absent is fine.
    pub async fn delete(&self, id: &str) -> Result<(), CommandError> {
        match self.run(["delete", "--force", id]).await {
            Err(error) if !error.says("does not exist") => Err(error),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_before_the_2025_fixes_are_named() {
        assert_eq!(parse_version("runc version 1.1.5+ds1"), Some((1, 1, 5)));
        assert_eq!(parse_version("runc version 1.3.3"), Some((1, 3, 3)));
        assert_eq!(parse_version("runc version 1.4.0-rc.1"), Some((1, 4, 0)));
        assert_eq!(parse_version("runc version"), None);
        assert_eq!(parse_version("runc version x.y"), None);
        for old in [(1, 1, 5), (1, 2, 7), (1, 3, 2), (1, 0, 0)] {
            let said = advisory(old).expect("warned");
            assert!(said.contains("CVE-2025-31133"), "{said}");
            assert!(said.contains("--oci-runtime runsc"), "{said}");
        }
        for fixed in [(1, 2, 8), (1, 3, 3), (1, 4, 0), (2, 0, 0)] {
            assert_eq!(advisory(fixed), None, "{fixed:?}");
        }
        assert!(
            advisory((1, 1, 5))
                .expect("warned")
                .starts_with("runc 1.1.5 predates")
        );
    }
}
