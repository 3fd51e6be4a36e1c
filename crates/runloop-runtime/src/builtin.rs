//! The builtin runtime: an agent program and a proxy as tasks of the
//! server's own process, each on its own loopback port.
//!
//! It is the embedded default (`demo=builtin:demo`): nothing to install,
//! nothing to start, and still the whole path of protocol §10 — the server
//! calls a real proxy (in process, as it does an exec or oci agent's),
//! which talks HTTP and SSE to a real agent program — so what a user sees
//! with it is what they would see with a container. There is nothing to limit in-process, so the request's memory
//! and disk limits are not applied.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::{BoxFuture, Container, ContainerLimits, Runtime, StartError};
use runloop_agent::{Agent, AgentHandle, AgentServer, demo::Demo};
use runloop_proxy::{LocalProxy, Proxy, ProxyHandle};

/// A runtime whose containers are one agent, served in-process.
#[derive(Clone)]
pub struct Builtin {
    agent: Arc<dyn Agent>,
    name: String,
}

impl fmt::Debug for Builtin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builtin")
            .field("agent", &self.name)
            .finish()
    }
}

impl Builtin {
    /// Serves `agent`; `name` is what logs call it.
    pub fn new(name: impl Into<String>, agent: Arc<dyn Agent>) -> Builtin {
        Builtin {
            agent,
            name: name.into(),
        }
    }

    /// The demo agent, unpaced.
    pub fn demo() -> Builtin {
        Builtin::new("demo", Arc::new(Demo::new()))
    }

    /// The name logs use for the agent.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Runtime for Builtin {
    fn start(
        &self,
        _limits: ContainerLimits,
    ) -> BoxFuture<'_, Result<Box<dyn Container>, StartError>> {
        Box::pin(async move {
            let started = self.spawn().await.map_err(|error| {
                StartError::with_source(
                    format_args!("cannot start the builtin agent {}", self.name),
                    error,
                )
            })?;
            let container: Box<dyn Container> = Box::new(started);
            Ok(container)
        })
    }
}

impl Builtin {
    async fn spawn(&self) -> io::Result<Served> {
        let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let agent = AgentServer::bind(loopback, Arc::clone(&self.agent)).await?;
        let agent_addr = agent.local_addr();
        let proxy = Proxy::bind(loopback, agent_addr).await?;
        let local = proxy.local();
        let (agent_handle, agent) = agent.spawn();
        let (proxy_handle, proxy) = proxy.spawn();
        let url = proxy_handle.url();
        info!(agent = %self.name, %url, %agent_addr, "builtin container started");
        Ok(Served {
            url,
            local,
            stop: (agent_handle, proxy_handle),
            tasks: [("agent program", Some(agent)), ("proxy", Some(proxy))],
            ended: None,
        })
    }
}

type Task = JoinHandle<io::Result<()>>;

/// One builtin container: its two tasks and the handles that end them.
struct Served {
    url: String,
    /// The proxy's paths in process: the server's way to it.
    local: LocalProxy,
    stop: (AgentHandle, ProxyHandle),
    tasks: [(&'static str, Option<Task>); 2],
    ended: Option<String>,
}

impl fmt::Debug for Served {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Served").field("url", &self.url).finish()
    }
}

impl Served {
    fn shut_down(&self) {
        self.stop.0.shutdown();
        self.stop.1.shutdown();
    }
}

/// Words for how a task ended.
fn how(name: &str, joined: Result<io::Result<()>, tokio::task::JoinError>) -> String {
    match joined {
        Ok(Ok(())) => format!("the {name} stopped"),
        Ok(Err(error)) => format!("the {name} failed: {error}"),
        Err(error) => format!("the {name} task ended: {error}"),
    }
}

impl Container for Served {
    fn proxy_url(&self) -> &str {
        &self.url
    }

    fn local_proxy(&self) -> Option<LocalProxy> {
        Some(self.local.clone())
    }

    /// Resolves if either task ends before `stop` (a failed socket, a panic).
    fn ended(&mut self) -> BoxFuture<'_, String> {
        Box::pin(async move {
            if let Some(reason) = &self.ended {
                return reason.clone();
            }
            let [(agent_name, agent), (proxy_name, proxy)] = &mut self.tasks;
            let (name, slot, joined) = match (agent.as_mut(), proxy.as_mut()) {
                (Some(agent), Some(proxy)) => tokio::select! {
                    joined = agent => (*agent_name, 0, joined),
                    joined = proxy => (*proxy_name, 1, joined),
                },
                // A task already reaped means `ended` resolved before.
                _ => return std::future::pending().await,
            };
            self.tasks[slot].1 = None;
            let reason = how(name, joined);
            warn!(url = %self.url, %reason, "builtin container ended by itself");
            self.ended = Some(reason.clone());
            reason
        })
    }

    fn stop(mut self: Box<Self>) -> BoxFuture<'static, ()> {
        self.shut_down();
        let tasks = std::mem::take(&mut self.tasks);
        let url = std::mem::take(&mut self.url);
        Box::pin(async move {
            for (name, task) in tasks {
                if let Some(task) = task {
                    let reason = how(name, task.await);
                    info!(%url, %reason, "builtin container stopping");
                }
            }
        })
    }
}

impl Drop for Served {
    /// A container dropped without `stop` still ends its tasks.
    fn drop(&mut self) {
        self.shut_down();
    }
}
