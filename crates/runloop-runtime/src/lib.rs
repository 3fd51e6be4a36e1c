//! Runtimes: where a run's agent lives, and how the server reaches its proxy.
//!
//! The server does not care whether an agent is a container, a child
//! process or a task in its own process. It asks a [`Runtime`] for a
//! [`Container`], talks to that container's proxy over the `/agent/*` paths
//! (protocol §10), and stops it when the run ends. The [`Catalog`] decides which
//! runtime serves which `server` image name.
//!
//! `registry` images go through a [`Registry`] instead, which pulls the
//! image and hands back a runtime for it (`runloop-oci` has one).
//!
//! The trait is object-safe (boxed futures) so a catalog can hold runtimes of
//! different kinds side by side.

mod attach;
mod builtin;
mod catalog;
pub mod cgroup;
pub mod exec;
pub mod output;
pub mod supervised;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use runloop_proto::ErrorKind;

pub use attach::Attach;
pub use builtin::Builtin;
pub use catalog::{AgentSpec, Catalog, CatalogError, RuntimeSpec, SpecError};
pub use exec::{Confinement, DiskPolicy, Exec, ExecConfig, ExecContainer, ExecProcess};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The limits a run asked for (protocol §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerLimits {
    /// Memory limit, bytes.
    pub memory: u64,
    /// Bytes the container may write to its own file system.
    pub disk: u64,
}

/// Why a container did not start. The message reaches the caller inside the
/// run's error response, so it says what failed without leaking secrets;
/// the error underneath, if there is one, stays its source.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct StartError {
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StartError {
    /// A start that failed for the reason `message` says.
    pub fn new(message: impl Into<String>) -> Self {
        StartError {
            message: message.into(),
            source: None,
        }
    }

    /// A start that failed doing `what`, because of `source`: the message
    /// is `what`, a colon and the source's words.
    pub fn with_source(
        what: impl fmt::Display,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        let source = source.into();
        StartError {
            message: format!("{what}: {source}"),
            source: Some(source),
        }
    }
}

/// Why a `registry` image will not run: the kind of the run's error
/// response (`policy` for a registry the server does not pull from,
/// `registry` for anything the registry or the image got wrong) and what
/// happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RegistryError {
    /// The error response's `kind`: [`ErrorKind::Policy`] or
    /// [`ErrorKind::Registry`].
    pub kind: ErrorKind,
    /// What happened, for the caller.
    pub message: String,
}

/// Where `registry` images come from (protocol §5): pulls one, checked, and
/// hands back a runtime that runs it. A server without one refuses
/// `registry` images.
pub trait Registry: Send + Sync + fmt::Debug {
    /// The runtime for the image at `reference`, pulled if need be.
    fn resolve(&self, reference: &str) -> BoxFuture<'_, Result<Arc<dyn Runtime>, RegistryError>>;
}

/// Starts containers of one kind.
pub trait Runtime: Send + Sync + fmt::Debug {
    /// Starts one container. Resolves once its proxy accepts connections.
    fn start(
        &self,
        limits: ContainerLimits,
    ) -> BoxFuture<'_, Result<Box<dyn Container>, StartError>>;

    /// What keeps this runtime, as configured, from serving the runs
    /// callers usually ask for, in words for the operator; `None` when
    /// nothing does. A server says it at startup, so that a catalog that
    /// will refuse its runs does not start silently.
    fn caveat(&self) -> Option<String> {
        None
    }
}

/// One running container, as the server sees it.
pub trait Container: Send + fmt::Debug {
    /// The proxy's base URL (`ws://host:port`); the server appends
    /// `/agent/register` and `/agent/run`.
    fn proxy_url(&self) -> &str;

    /// Resolves with a reason when the container ends by itself; pending
    /// forever for a container that cannot tell. Cancel-safe: the server
    /// polls it inside `select!` and may call it again.
    fn ended(&mut self) -> BoxFuture<'_, String>;

    /// Stops the container and releases all it holds (processes, ports,
    /// tasks). Resolves when it is gone.
    fn stop(self: Box<Self>) -> BoxFuture<'static, ()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_error_says_what_failed_and_keeps_why_as_its_source() {
        let error = StartError::with_source("cannot bind", std::io::Error::other("no ports"));
        assert_eq!(error.to_string(), "cannot bind: no ports");
        let source = std::error::Error::source(&error).expect("a source");
        assert_eq!(source.to_string(), "no ports");
        assert!(std::error::Error::source(&StartError::new("refused")).is_none());
    }
}
