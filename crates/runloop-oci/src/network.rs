//! Container networks: a network namespace per run with nothing in it but
//! loopback, and the host's one way in — TCP sockets made inside it.
//!
//! ```text
//! host netns                                   run's netns (runloop-KEY): lo only
//!   proxy (127.0.0.1) ── link ── socket made ─────▶ agent program on 127.0.0.1:$PORT
//!                                in the run's netns
//! ```
//!
//! Why no routed address: a route is the host's, shared by every server on
//! it, and outlives the process that made it. With addresses handed out per
//! server, two servers on one host (a rolling restart is exactly that), or a
//! server and the leftovers of a killed one, gave two runs the same
//! address, and one tenant's prompt reached another tenant's agent; a route
//! removed before the last request went out sent that request (the caller's
//! registration) wherever the host's default route led. Here there is
//! nothing to share and nothing to route: the namespace has only `lo`, and
//! the host reaches it by making a socket *in* it ([`Netns::connect`]).
//! A socket keeps the namespace it was made in, so a connection made that
//! way can only ever reach a process of that namespace, and only the run's
//! processes are in it. A namespace whose container is gone has nothing
//! listening: the connection is refused, it cannot go anywhere else.
//!
//! So the agent program listens on `127.0.0.1:$PORT` under this runtime as
//! under exec (protocol §10), and the container reaches nothing beyond
//! itself: no other run, no service of the host, no other machine. Egress
//! (agents that call model APIs need it) is the operator's opt-in, a veth
//! added to this namespace by module [`egress`](crate::egress): a way out,
//! never the way in — the host still dials through sockets made here.
//!
//! The namespace is made before runc starts (runc joins it by path), in
//! the server's own process — a thread that `unshare`s it, brings `lo` up
//! and binds it at `/run/netns/runloop-KEY`, as `ip netns add` would, in
//! half a millisecond rather than the two `ip` runs' five
//! ([`runloop_runtime::netns`]) — and is held open from the start; the host
//! dials through that descriptor, never through the name, so a namespace
//! made again under the same name is never the one dialled. It is named
//! after the run so that a server started after a crash finds and removes
//! it. Whether the agent listens is asked of the kernel's socket
//! diagnostics in the namespace ([`Netns::diag`]), not by connecting.

use std::ffi::OsStr;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use runloop_runtime::netns::{self, Diag};
use tokio::net::TcpStream;

use crate::command::{self, CommandError};

/// The name of a run's network namespace.
pub fn namespace(key: &str) -> String {
    format!("runloop-{key}")
}

/// Where a run's network namespace is bound (what runc joins).
pub fn namespace_path(key: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(namespace(key))
}

/// The host end of the veth pair runs had before they had loopback only:
/// removed with the namespace, for the leftovers of servers of that time.
fn old_host_interface(key: &str) -> String {
    format!("rl{key}")
}

/// The `ip` program (iproute2), for this module and [`crate::egress`].
pub(crate) fn ip() -> &'static OsStr {
    OsStr::new("ip")
}

/// Why a run's network could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// `ip` failed.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// The namespace could not be made, bound or opened.
    #[error("cannot make the network namespace {path}")]
    Open {
        /// Its path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
}

/// A run's network namespace, held open: what the host dials through.
#[derive(Debug, Clone)]
pub struct Netns {
    name: Arc<str>,
    netns: netns::Netns,
}

/// Makes the run's namespace, with its loopback up, bound at
/// [`namespace_path`], and holds it open.
pub async fn create(key: &str) -> Result<Netns, NetworkError> {
    let path = namespace_path(key);
    let netns = netns::Netns::create_at(&path)
        .await
        .map_err(|source| NetworkError::Open { path, source })?;
    Ok(Netns {
        name: Arc::from(namespace(key)),
        netns,
    })
}

/// Removes the run's namespace and, from servers of the veth time, its
/// host interface. Absent is fine. A namespace still held open (by a
/// [`Netns`]) lives on, empty, until the last holder lets go.
pub async fn remove(key: &str) -> Result<(), CommandError> {
    let path = namespace_path(key);
    netns::remove_at(&path).map_err(|error| CommandError {
        command: format!("umount {}", path.display()),
        why: error.to_string(),
    })?;
    let host = old_host_interface(key);
    if PathBuf::from("/sys/class/net").join(&host).exists() {
        match command::run(ip(), ["link", "del", &host], None).await {
            Err(error) if !error.says("Cannot find device") => return Err(error),
            _ => {}
        }
    }
    Ok(())
}

impl Netns {
    /// The namespace's name (`runloop-KEY`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A TCP connection to `127.0.0.1:port` inside the namespace: the
    /// socket is made there, then connected here.
    pub async fn connect(&self, port: u16) -> io::Result<TcpStream> {
        self.netns.connect(port).await
    }

    /// The proxy's dial to `127.0.0.1:port` inside the namespace.
    pub fn dialer(&self, port: u16) -> netns::Dialer {
        self.netns.dialer(port)
    }

    /// The namespace's socket diagnostics: who listens on a port there.
    pub async fn diag(&self) -> io::Result<Diag> {
        self.netns.diag().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_run_key() {
        assert_eq!(namespace("0123456789ab"), "runloop-0123456789ab");
        assert_eq!(
            namespace_path("0123456789ab"),
            PathBuf::from("/run/netns/runloop-0123456789ab")
        );
        assert_eq!(old_host_interface("0123456789ab").len(), 14);
    }
}
