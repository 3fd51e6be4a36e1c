//! How the proxy reaches its agent program: a connection of its own for
//! each call, made by a [`Dial`].
//!
//! ```text
//! standalone:    SocketAddr ──TcpStream::connect──▶ agent program at that address
//! in a runtime:  the run's dial ──a socket made in the run's network namespace──▶ 127.0.0.1:$PORT there
//! ```
//!
//! Why a dial and not an address: a runtime that gives each run a network
//! namespace of its own (protocol §10) reaches the agent program on the
//! run's own loopback, which no address of the server's names. The
//! runtime makes the socket inside the namespace and hands it over; the
//! proxy reads and writes it as any other, with nothing between (a
//! forwarder on the host's loopback would copy every byte once more and
//! cost a connection of its own per call).
//!
//! A standalone proxy (`runloop proxy`) dials an address: `SocketAddr` is
//! a [`Dial`].

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;

use tokio::net::TcpStream;

/// A connection being made, as [`Dial::connect`] returns it.
pub type Dialing<'a> = Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send + 'a>>;

/// Where, and how, the proxy connects to its agent program. Its `Display`
/// says where, in words a failed call is told in (`127.0.0.1:8080 in the
/// run's network namespace`).
pub trait Dial: fmt::Display + fmt::Debug + Send + Sync + 'static {
    /// The agent program's address as the program itself sees it (what a
    /// call's `Host` says).
    fn address(&self) -> SocketAddr;

    /// A new connection to the agent program, for one call.
    fn connect(&self) -> Dialing<'_>;

    /// A call's connection was lost before its answer ended (it could not
    /// be made, it closed, it broke): whether the runtime is now ending
    /// the agent for that and will say how it ended ([`AgentEnd`]), so the
    /// proxy waits for those words rather than a moment. The oci runtime
    /// ends a container whose memory ran out. By default, no.
    ///
    /// [`AgentEnd`]: super::AgentEnd
    fn lost(&self) -> bool {
        false
    }
}

/// An address dialed as it is, on the server's own network.
impl Dial for SocketAddr {
    fn address(&self) -> SocketAddr {
        *self
    }

    fn connect(&self) -> Dialing<'_> {
        Box::pin(TcpStream::connect(*self))
    }
}
