//! The attach runtime: a proxy that already runs somewhere (a container
//! started by any orchestrator), reached at a `ws://` URL.
//!
//! There is nothing to start and nothing to stop, and no way to tell when
//! the container ends: the server only talks to it. Note that a proxy takes
//! one registration in its life (protocol §10), so an attached proxy serves one
//! run; the next run's registration is refused by the proxy itself.

use std::future;

use super::{BoxFuture, Container, ContainerLimits, Runtime, StartError};

/// A runtime whose every container is the proxy at one URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attach {
    url: String,
}

impl Attach {
    /// Attaches to the proxy at `url` (`ws://host:port`, no path).
    pub fn new(url: impl Into<String>) -> Self {
        let url = url.into();
        Attach {
            url: url.trim_end_matches('/').to_owned(),
        }
    }

    /// The proxy's URL.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Runtime for Attach {
    fn start(
        &self,
        _limits: ContainerLimits,
    ) -> BoxFuture<'_, Result<Box<dyn Container>, StartError>> {
        let container: Box<dyn Container> = Box::new(Attached {
            url: self.url.clone(),
        });
        Box::pin(future::ready(Ok(container)))
    }
}

#[derive(Debug)]
struct Attached {
    url: String,
}

impl Container for Attached {
    fn proxy_url(&self) -> &str {
        &self.url
    }

    fn ended(&mut self) -> BoxFuture<'_, String> {
        Box::pin(future::pending())
    }

    fn stop(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn attach_hands_out_the_url() {
        let runtime = Attach::new("ws://127.0.0.1:14979/");
        let container = runtime
            .start(ContainerLimits::new(1, 0))
            .await
            .expect("starts");
        assert_eq!(container.proxy_url(), "ws://127.0.0.1:14979");
        container.stop().await;
    }
}
