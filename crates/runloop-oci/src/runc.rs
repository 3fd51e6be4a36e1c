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

/// The runc binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runc {
    binary: PathBuf,
}

impl Runc {
    /// runc at `binary` (a path, or a name looked up in `PATH`).
    pub fn new(binary: impl Into<PathBuf>) -> Runc {
        Runc {
            binary: binary.into(),
        }
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
        command
            .arg("--log")
            .arg(log(bundle))
            .args(["--log-format", "json", "run", "--keep", "--bundle"])
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

    /// Deletes the container (killing what is left of it); absent is fine.
    pub async fn delete(&self, id: &str) -> Result<(), CommandError> {
        match self.run(["delete", "--force", id]).await {
            Err(error) if !error.says("does not exist") => Err(error),
            _ => Ok(()),
        }
    }
}
