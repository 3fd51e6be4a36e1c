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
//! The namespace is made before runc starts (runc joins it by path) and is
//! opened at once; the host dials through that descriptor, never through
//! the name, so a namespace made again under the same name is never the one
//! dialled. It is named after the run so that a server started after a
//! crash finds and removes it.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

use rustix::net::{AddressFamily, SocketFlags, SocketType};
use rustix::thread::LinkNameSpaceType;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tracing::warn;

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
    /// The namespace was made but cannot be opened.
    #[error("cannot open the network namespace {path}")]
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
    fd: Arc<OwnedFd>,
}

/// Makes the run's namespace, with its loopback up, and opens it.
pub async fn create(key: &str) -> Result<Netns, NetworkError> {
    let name = namespace(key);
    command::run(ip(), ["netns", "add", &name], None).await?;
    command::run(ip(), ["-n", &name, "link", "set", "lo", "up"], None).await?;
    let path = namespace_path(key);
    let file = File::open(&path).map_err(|source| NetworkError::Open {
        path: path.clone(),
        source,
    })?;
    Ok(Netns {
        name: Arc::from(name),
        fd: Arc::new(OwnedFd::from(file)),
    })
}

/// Removes the run's namespace and, from servers of the veth time, its
/// host interface. Absent is fine. A namespace still held open (by a
/// [`Netns`]) lives on, empty, until the last holder lets go.
pub async fn remove(key: &str) -> Result<(), CommandError> {
    let netns = namespace(key);
    if namespace_path(key).exists() {
        match command::run(ip(), ["netns", "del", &netns], None).await {
            Err(error) if !error.says("No such file") => return Err(error),
            _ => {}
        }
    }
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
    /// socket is made there (by the dialer thread), then connected here.
    pub async fn connect(&self, port: u16) -> io::Result<TcpStream> {
        let socket = self.socket().await?;
        socket
            .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .await
    }

    /// An unconnected TCP socket of the namespace.
    async fn socket(&self) -> io::Result<TcpSocket> {
        let (reply, answer) = oneshot::channel();
        dialer()?
            .send(Ask {
                netns: Arc::clone(&self.fd),
                reply,
            })
            .map_err(|_| gone())?;
        let fd = answer.await.map_err(|_| gone())??;
        Ok(TcpSocket::from_std_stream(std::net::TcpStream::from(fd)))
    }
}

/// One socket asked of the dialer thread.
struct Ask {
    netns: Arc<OwnedFd>,
    reply: oneshot::Sender<io::Result<OwnedFd>>,
}

fn gone() -> io::Error {
    io::Error::other("the thread that makes sockets in run namespaces is gone")
}

/// The dialer thread's queue, started on first use.
///
/// Why a thread of its own: `setns` moves the calling thread, and every
/// socket, file and name lookup that thread makes afterwards is in the
/// run's namespace. A thread of the async runtime's pools would carry that
/// into unrelated work (a registry pull's DNS lookup, say); this one does
/// nothing but make sockets, and goes back to the server's namespace after
/// each so that it holds no run's namespace alive.
fn dialer() -> io::Result<mpsc::Sender<Ask>> {
    static DIALER: OnceLock<Mutex<Option<mpsc::Sender<Ask>>>> = OnceLock::new();
    let slot = DIALER.get_or_init(|| Mutex::new(None));
    let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(sender) = slot.as_ref() {
        return Ok(sender.clone());
    }
    // The server's own namespace, to go back to: opened before any setns.
    let home = File::open("/proc/thread-self/ns/net")
        .or_else(|_| File::open("/proc/self/ns/net"))
        .map(OwnedFd::from)?;
    let (sender, asks) = mpsc::channel::<Ask>();
    std::thread::Builder::new()
        .name("runloop-netns-dialer".to_owned())
        .spawn(move || {
            for ask in asks {
                let made = socket_in(&ask.netns);
                if let Err(error) =
                    rustix::thread::move_into_link_name_space(home.as_fd(), Some(LinkNameSpaceType::Network))
                {
                    warn!(%error, "the socket maker cannot return to the server's network namespace");
                }
                let _ = ask.reply.send(made);
            }
        })?;
    *slot = Some(sender.clone());
    Ok(sender)
}

/// On the dialer thread: enters `netns` and makes a non-blocking,
/// close-on-exec TCP socket there.
fn socket_in(netns: &OwnedFd) -> io::Result<OwnedFd> {
    rustix::thread::move_into_link_name_space(netns.as_fd(), Some(LinkNameSpaceType::Network))
        .map_err(|errno| {
            io::Error::new(
                io::Error::from(errno).kind(),
                format!("cannot enter the run's network namespace: {errno}"),
            )
        })?;
    let socket = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    Ok(socket)
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
