//! Runtimes: where a run's agent lives, and how the server reaches its proxy.
//!
//! The server does not care whether an agent is a container, a child
//! process or a task in its own process. It asks a [`Runtime`] for a
//! [`Container`], talks to that container's proxy over the `/agent/*` paths
//! (protocol §10), and stops it when the run ends. Where the proxy is a
//! task of the server's own process (every runtime but `attach`), the
//! container hands the server its paths as calls ([`LocalProxy`]): no
//! socket between them (protocol §12, "In-process paths"). The [`Catalog`] decides which
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
pub mod netns;
pub mod output;
pub mod steps;
pub mod supervised;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use runloop_proto::ErrorKind;

pub use attach::Attach;
pub use builtin::Builtin;
pub use catalog::{AgentSpec, Catalog, CatalogError, RuntimeSpec, SpecError};
pub use exec::{
    Confinement, DiskPolicy, Exec, ExecConfig, ExecContainer, ExecNetwork, ExecProcess,
};
pub use runloop_proxy::{Dial, Dialing, LocalProxy, LocalRun, PathEvent};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The limits a run asked for (protocol §5), and the tenant it runs for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerLimits {
    /// Memory limit, bytes.
    pub memory: u64,
    /// Bytes the container may write to its own file system.
    pub disk: u64,
    /// Whose run it is: what it shares with the tenant's other runs.
    pub tenant: RunTenant,
}

impl ContainerLimits {
    /// `memory` and `disk` for a run of [`RunTenant::default`].
    pub fn new(memory: u64, disk: u64) -> ContainerLimits {
        ContainerLimits {
            memory,
            disk,
            tenant: RunTenant::default(),
        }
    }
}

/// The tenant a run is for, as the runtimes see it: what its runs share
/// rather than hold each (protocol §12, "fair shares"). A runtime that
/// starts processes puts the tenant's runs under one cgroup of the
/// tenant's, of this CPU weight ([`cgroup::Tenants`]), and logs their
/// output at this rate together ([`output::TenantLog`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunTenant {
    /// The tenant's name (from the server's configuration, never from a
    /// caller).
    pub name: Arc<str>,
    /// The CPU weight its runs share, 1 to 10000 (cgroup v2's scale).
    pub cpu_weight: u32,
    /// Bytes of its runs' output logged per second, together; `None`: no
    /// rate but each run's own budget.
    pub log_rate: Option<u64>,
}

impl RunTenant {
    /// Its log rate, shared with its other runs in this process; `None`
    /// without a rate.
    pub fn log(&self) -> Option<output::TenantLog> {
        self.log_rate
            .map(|rate| output::TenantLog::of(&self.name, rate))
    }
}

impl Default for RunTenant {
    /// `anonymous`, weight 100 (the kernel's default), no log rate.
    fn default() -> RunTenant {
        RunTenant {
            name: Arc::from("anonymous"),
            cpu_weight: cgroup::DEFAULT_WEIGHT,
            log_rate: None,
        }
    }
}

/// Why a container did not start. The message says what failed without
/// leaking secrets; the error underneath, if there is one, is its source
/// and not in the message. The server puts the whole chain in the run's
/// error response.
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
    /// is `what`, and `source` says why.
    pub fn with_source(
        what: impl fmt::Display,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        StartError {
            message: what.to_string(),
            source: Some(source.into()),
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

/// Who a pull is for: the tenant whose run asked, and how many pulls it may
/// have under way at once (protocol §12, fair shares).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Puller {
    /// The tenant's name.
    pub tenant: String,
    /// Its pulls under way at once; `None`: only the server-wide cap holds
    /// it (a server without tokens, whose callers are one tenant).
    pub max_pulls: Option<usize>,
}

/// Where `registry` images come from (protocol §5): pulls one, checked, and
/// hands back a runtime that runs it. A server without one refuses
/// `registry` images.
pub trait Registry: Send + Sync + fmt::Debug {
    /// The runtime for the image at `reference`, pulled for `puller` if
    /// need be.
    fn resolve(
        &self,
        reference: &str,
        puller: Puller,
    ) -> BoxFuture<'_, Result<Arc<dyn Runtime>, RegistryError>>;

    /// Pulls under way at once, server-wide: what a tenant's share is half of.
    fn max_pulls(&self) -> usize;
}

/// What a runtime's warm pool claims of the server's run budget: a
/// container kept started for runs to come holds its memory and disk
/// against the server's budgets (no tenant's), from its start until a run
/// takes it or it goes. The server gives its pools one of these.
pub trait Reserve: Send + Sync + fmt::Debug {
    /// Claims `memory` and `disk` for one warm container; `None` when they
    /// do not fit the server's budgets now.
    fn claim(&self, memory: u64, disk: u64) -> Option<Box<dyn Reserved>>;
}

/// One warm container's claim: dropped, it is given back (the container
/// went away unused).
pub trait Reserved: Send + Sync {
    /// The container went to a run, whose own claim holds it from now on:
    /// the claim is given back, and the run is counted as served warm.
    fn used(self: Box<Self>);
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

    /// The proxy's paths in process, when the proxy is a task of this
    /// process: the server then uses them instead of the URL. `None` (the
    /// default): the proxy runs elsewhere.
    fn local_proxy(&self) -> Option<LocalProxy> {
        None
    }

    /// Resolves with a reason when the container ends by itself; pending
    /// forever for a container that cannot tell. Cancel-safe: the server
    /// polls it inside `select!` and may call it again.
    fn ended(&mut self) -> BoxFuture<'_, String>;

    /// Stops the container and releases all it holds (processes, ports,
    /// tasks). Resolves when it is gone.
    fn stop(self: Box<Self>) -> BoxFuture<'static, ()>;

    /// The file that holds the container's disk, when it is one file of
    /// the server's filesystem (a sparse disk image): the blocks it holds
    /// are what the container has written of its `disk`. The server
    /// counts the rest as still to be written when it admits the next
    /// run (protocol §12, "disk is real space"); `None` (the default): all
    /// of it.
    fn disk_file(&self) -> Option<&std::path::Path> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_error_says_what_failed_and_leaves_why_to_its_source() {
        let error = StartError::with_source("cannot bind", std::io::Error::other("no ports"));
        runloop_testkit::errors::assert_own_words_and_cause(&error, "cannot bind", "no ports");
        assert_eq!(
            runloop_proto::error_chain::Chain(&error).to_string(),
            "cannot bind: no ports"
        );
        assert!(std::error::Error::source(&StartError::new("refused")).is_none());
    }
}
