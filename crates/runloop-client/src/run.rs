//! A run on the caller's side: its id, its loops, and its stop.
//!
//! A run lives on the server until its scope finishes: when the caller stops
//! it, when its container ends, or when the connection ends. On this side a
//! [`Run`] and every [`RunLoop`] opened on it share the run, and when the last
//! of them is dropped without the run having ended, the run is stopped, so a
//! forgotten handle does not leave a container running.

use std::sync::Arc;

use runloop_proto::run_loop::RunLoopRequest;
use tokio_util::sync::CancellationToken;

use super::RunLoop;
use super::connection::Connection;

/// A running container, as the caller holds it.
#[derive(Debug, Clone)]
pub struct Run {
    inner: Arc<RunInner>,
}

#[derive(Debug)]
pub(super) struct RunInner {
    connection: Arc<Connection>,
    scope: u32,
    id: String,
    ended: CancellationToken,
}

impl Drop for RunInner {
    fn drop(&mut self) {
        if !self.ended.is_cancelled() {
            self.send_stop();
        }
    }
}

impl RunInner {
    /// Opens a stop channel; the scope's finish answers it.
    fn send_stop(&self) {
        self.connection.shared.stop(self.scope);
    }
}

impl Run {
    pub(super) fn new(
        connection: Arc<Connection>,
        scope: u32,
        id: String,
        ended: CancellationToken,
    ) -> Run {
        Run {
            inner: Arc::new(RunInner {
                connection,
                scope,
                id,
                ended,
            }),
        }
    }

    /// The run's id, as the server minted it.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The scope number the run lives in.
    pub fn scope(&self) -> u32 {
        self.inner.scope
    }

    /// Asks for one loop with `prompt`.
    pub fn run_loop(&self, prompt: impl Into<String>) -> RunLoop {
        self.run_loop_with(&RunLoopRequest::new(prompt))
    }

    /// Asks for one loop with a prepared request (its JSON goes as it is).
    pub fn run_loop_with(&self, request: &RunLoopRequest<'_>) -> RunLoop {
        let inner = &self.inner;
        match inner.connection.shared.open_loop(inner.scope, request) {
            Ok((channel, events)) => RunLoop::new(Arc::clone(inner), channel, events),
            Err(why) => RunLoop::ended(Arc::clone(inner), why),
        }
    }

    /// Stops the run and waits for its end (its scope's finish, or the end of
    /// the connection). Stopping a run that has ended does nothing.
    pub async fn stop(&self) {
        if !self.inner.ended.is_cancelled() {
            self.inner.send_stop();
        }
        self.ended().await;
    }

    /// Resolves when the run has ended.
    pub async fn ended(&self) {
        self.inner.ended.cancelled().await;
    }

    /// Whether the run has ended.
    pub fn is_ended(&self) -> bool {
        self.inner.ended.is_cancelled()
    }
}
