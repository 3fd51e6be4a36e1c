//! The processes under test: the server (or the forwarder) runs as a child
//! process, so its memory is its own and can be read from `/proc`.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use crate::BenchError;

/// How to start the programs under test; the CLI re-runs itself.
pub trait Spawn: Send + Sync {
    /// A provider server on `listen` that accepts `token` and serves the
    /// image `bench` from the proxy at `proxy` (`ws://host:port`).
    fn server(&self, listen: SocketAddr, proxy: &str, token: &str) -> Command;
    /// The raw forwarder on `listen` in front of `upstream`.
    fn forwarder(&self, listen: SocketAddr, upstream: &str) -> Command;
}

/// A child process under test, killed when dropped.
#[derive(Debug)]
pub(crate) struct Child {
    child: tokio::process::Child,
    pid: u32,
}

/// A loopback address that was free a moment ago.
pub(crate) fn free_addr() -> Result<SocketAddr, BenchError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

impl Child {
    /// Starts `command` and waits until it accepts connections on `addr`.
    pub(crate) async fn start(mut command: Command, addr: SocketAddr) -> Result<Child, BenchError> {
        command
            .kill_on_drop(true)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let mut child = command.spawn()?;
        let pid = child
            .id()
            .ok_or(BenchError::Exited("the program under test".into()))?;
        loop {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(Child { child, pid });
            }
            if let Some(status) = child.try_wait()? {
                return Err(BenchError::Exited(format!(
                    "the program under test ({status})"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A `/proc/<pid>/status` figure in bytes (`VmRSS`, `VmHWM`).
    pub(crate) fn memory(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|line| line.starts_with(field))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// Stops the child and reaps it.
    pub(crate) async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
