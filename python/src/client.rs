//! The client's handles for Python: a connection, a run, a loop, each with
//! an awaitable and a blocking form of every call that waits.
//!
//! ```text
//! connect / connect_blocking ──▶ Client ──start──▶ Run ──open_loop──▶ Loop ──next_batch──▶ [Chunk | Error, …]
//!                                                                            └─ outcome(), transcript()
//! ```
//!
//! Everything of the protocol is `runloop::client`'s; this module only
//! carries its values across. A loop is read in batches: one await takes
//! the next event and then every event already queued behind it (up to
//! [`BATCH`]), so a Python caller pays one crossing of the event loop per
//! batch, not per chunk, when the server is ahead of it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use runloop_client::{Client, ClientConfig, ClientTls, Event, Run, RunLoop};
use runloop_proto::agents_run::{
    Container, DIGEST_RULE, Image, ImageRef, RunRequest, is_valid_digest, is_valid_name,
};
use runloop_proto::run_loop::{Broken, Outcome as WireOutcome, Transcript};
use serde_json::value::RawValue;

use crate::errors::{self, Failure};
use crate::events::{Chunk, Error, Outcome};
use crate::runtime::{Owned, awaitable, block};

/// The most events one batch carries.
pub const BATCH: usize = 512;

/// The digest sent when a caller names none: any unpinned catalog entry
/// accepts it (as `runloop run` sends).
pub const ANY_DIGEST: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// The configuration of a connection, checked before any dial.
fn config(ca: &[PathBuf]) -> PyResult<ClientConfig> {
    let tls = if ca.is_empty() {
        None
    } else {
        Some(ClientTls::new(ca).map_err(|error| {
            Failure::Connect(format!("cannot use the certificate authorities: {error}")).raise()
        })?)
    };
    // The package bounds connecting itself (`connect_timeout`, named).
    let mut config = ClientConfig::default().connect_timeout(None);
    config.tls = tls;
    Ok(config)
}

fn seconds(value: Option<f64>, what: &str) -> PyResult<Option<Duration>> {
    value
        .map(|s| {
            Duration::try_from_secs_f64(s).map_err(|_| {
                PyValueError::new_err(format!("{what} must be a number of seconds, not {s}"))
            })
        })
        .transpose()
}

async fn dial(
    url: String,
    token: String,
    config: ClientConfig,
    timeout: Option<Duration>,
) -> Result<NativeClient, Failure> {
    let connecting = Client::connect_with(&url, &token, config);
    let client = match timeout {
        Some(limit) => tokio::time::timeout(limit, connecting)
            .await
            .map_err(|_| Failure::ConnectTimeout(limit.as_secs_f64()))??,
        None => connecting.await?,
    };
    Ok(NativeClient {
        client: Owned::new(client),
    })
}

/// Connects to `url` with `token`: an awaitable of a [`NativeClient`].
#[pyfunction]
#[pyo3(signature = (url, token, ca, connect_timeout))]
pub fn connect(
    py: Python<'_>,
    url: String,
    token: String,
    ca: Vec<PathBuf>,
    connect_timeout: Option<f64>,
) -> PyResult<Bound<'_, PyAny>> {
    let config = config(&ca)?;
    let timeout = seconds(connect_timeout, "connect_timeout")?;
    awaitable(py, async move {
        dial(url, token, config, timeout)
            .await
            .map_err(Failure::raise)
    })
}

/// Connects to `url` with `token`, blocking (the GIL released).
#[pyfunction]
#[pyo3(signature = (url, token, ca, connect_timeout))]
pub fn connect_blocking(
    py: Python<'_>,
    url: String,
    token: String,
    ca: Vec<PathBuf>,
    connect_timeout: Option<f64>,
) -> PyResult<NativeClient> {
    let config = config(&ca)?;
    let timeout = seconds(connect_timeout, "connect_timeout")?;
    block(py, dial(url, token, config, timeout))?.map_err(|f| f.into_pyerr(py))
}

/// What `start` is asked for, as the package passes it: `(name, digest,
/// image JSON, memory, disk, agent JSON)`.
type Spec = (
    Option<String>,
    Option<String>,
    Option<String>,
    u64,
    u64,
    String,
);

/// A run request from the package's arguments: a catalog image by `name`
/// (and `digest`), or `image` as its JSON (`{"registry": {...}}`, …).
fn request((name, digest, image, memory, disk, agent): Spec) -> PyResult<RunRequest> {
    let image = match (image.as_deref(), name) {
        (Some(json), None) => serde_json::from_str::<Image>(json).map_err(|error| {
            PyValueError::new_err(format!(
                "image must be {{\"server\": {{\"name\", \"digest\"}}}}, {{\"registry\": \
                 {{\"reference\"}}}} or {{\"client\": {{\"name\", \"digest\"}}}}: {error}"
            ))
        })?,
        (None, Some(name)) => {
            if !is_valid_name(&name) {
                return Err(PyValueError::new_err(format!(
                    "{name:?} is not an image name (a repository path without a host)"
                )));
            }
            let digest = digest.unwrap_or_else(|| ANY_DIGEST.to_owned());
            if !is_valid_digest(&digest) {
                return Err(PyValueError::new_err(format!(
                    "{digest:?} is not a digest: {DIGEST_RULE}"
                )));
            }
            Image::Server(ImageRef { name, digest })
        }
        (Some(_), Some(_)) => {
            return Err(PyValueError::new_err(
                "give an image name or image=, not both",
            ));
        }
        (None, None) => return Err(PyValueError::new_err("give an image name or image=")),
    };
    let agent = RawValue::from_string(agent)
        .map_err(|error| PyValueError::new_err(format!("agent is not JSON: {error}")))?;
    Ok(RunRequest::new(Container::new(image, memory, disk), agent))
}

async fn start(client: Client, request: RunRequest) -> Result<NativeRun, Failure> {
    let run = client.start(request).await?;
    Ok(NativeRun {
        id: run.id().to_owned(),
        run: Owned::new(run),
    })
}

/// A connection to a provider server.
#[pyclass(module = "runloop._native", name = "Client", frozen)]
pub struct NativeClient {
    client: Owned<Client>,
}

#[pymethods]
impl NativeClient {
    /// Opens a run: an awaitable of a [`NativeRun`].
    fn start<'py>(&self, py: Python<'py>, spec: Spec) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client.get()?.clone();
        let request = request(spec)?;
        awaitable(py, async move {
            start(client, request).await.map_err(Failure::raise)
        })
    }

    /// Opens a run, blocking.
    fn start_blocking(&self, py: Python<'_>, spec: Spec) -> PyResult<NativeRun> {
        let client = self.client.get()?.clone();
        let request = request(spec)?;
        block(py, start(client, request))?.map_err(|f| f.into_pyerr(py))
    }

    /// Closes the connection (every run on it ends): an awaitable.
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client.get()?.clone();
        awaitable(py, async move {
            client.close().await;
            Ok(())
        })
    }

    /// Closes the connection, blocking.
    fn close_blocking(&self, py: Python<'_>) -> PyResult<()> {
        let client = self.client.get()?.clone();
        block(py, async move { client.close().await })
    }

    /// Whether the connection is over.
    fn is_closed(&self) -> PyResult<bool> {
        Ok(self.client.get()?.is_closed())
    }
}

/// A run: a container the server started for this connection.
#[pyclass(module = "runloop._native", name = "Run", frozen)]
pub struct NativeRun {
    id: String,
    run: Owned<Run>,
}

#[pymethods]
impl NativeRun {
    /// The run's id, as the server minted it.
    #[getter]
    fn id(&self) -> &str {
        &self.id
    }

    /// Asks for one loop with `prompt`.
    #[pyo3(signature = (prompt, transcript = true))]
    fn open_loop(&self, prompt: String, transcript: bool) -> PyResult<NativeLoop> {
        let stream = self.run.get()?.run_loop(prompt);
        Ok(NativeLoop {
            state: Owned::new(Arc::new(tokio::sync::Mutex::new(LoopState {
                stream,
                transcript: transcript.then(Transcript::new),
                outcome: None,
            }))),
        })
    }

    /// Sends the run's stop now, without waiting for the run's end.
    fn stop_nowait(&self) -> PyResult<()> {
        // The first poll of `stop` queues the stop channel's frame; what
        // is left is the wait for the run's end, which is not wanted here.
        let _ = self.run.get()?.stop().now_or_never();
        Ok(())
    }

    /// Stops the run and waits for its end: an awaitable.
    fn stop<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let run = self.run.get()?.clone();
        awaitable(py, async move {
            run.stop().await;
            Ok(())
        })
    }

    /// Stops the run and waits for its end, blocking.
    fn stop_blocking(&self, py: Python<'_>) -> PyResult<()> {
        let run = self.run.get()?.clone();
        block(py, async move { run.stop().await })
    }

    /// Resolves when the run has ended (by a stop, its container's end, or
    /// the connection's): an awaitable.
    fn wait_ended<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let run = self.run.get()?.clone();
        awaitable(py, async move {
            run.ended().await;
            Ok(())
        })
    }

    /// Waits until the run has ended, blocking.
    fn wait_ended_blocking(&self, py: Python<'_>) -> PyResult<()> {
        let run = self.run.get()?.clone();
        block(py, async move { run.ended().await })
    }

    /// Whether the run has ended.
    fn is_ended(&self) -> PyResult<bool> {
        Ok(self.run.get()?.is_ended())
    }
}

/// What a loop's reading keeps between batches.
struct LoopState {
    stream: RunLoop,
    /// The loop coalesced so far, when asked for.
    transcript: Option<Transcript>,
    /// Set once the loop has ended.
    outcome: Option<WireOutcome>,
}

/// One item of a batch.
#[derive(IntoPyObject)]
enum Item {
    Chunk(Chunk),
    Error(Error),
}

impl LoopState {
    fn take(&mut self, event: Option<Event>, batch: &mut Vec<Item>) {
        match event {
            Some(Event::Chunk { chunk, json }) => {
                if let Some(transcript) = &mut self.transcript {
                    transcript.push(chunk.clone());
                }
                batch.push(Item::Chunk(Chunk::new(chunk, json)));
            }
            Some(Event::Error(error)) => batch.push(Item::Error(Error::new(error))),
            Some(Event::End(outcome)) => self.outcome = Some(outcome),
            // `End` always comes first; a stream that ends without it
            // would be the connection's end.
            None => self.outcome = Some(WireOutcome::Broken(Broken::ConnectionEnded)),
        }
    }
}

/// The next events of a loop: at least one unless it has ended (then none).
async fn next_batch(state: Arc<tokio::sync::Mutex<LoopState>>) -> Vec<Item> {
    let mut state = state.lock().await;
    let mut batch = Vec::new();
    if state.outcome.is_some() {
        return batch;
    }
    let event = state.stream.next().await;
    state.take(event, &mut batch);
    while batch.len() < BATCH && state.outcome.is_none() {
        match state.stream.next().now_or_never() {
            Some(event) => state.take(event, &mut batch),
            None => break,
        }
    }
    batch
}

/// One loop of a run, read in batches.
#[pyclass(module = "runloop._native", name = "Loop", frozen)]
pub struct NativeLoop {
    state: Owned<Arc<tokio::sync::Mutex<LoopState>>>,
}

#[pymethods]
impl NativeLoop {
    /// The next events (`Chunk`, `Error`), in order: an awaitable of a
    /// list, empty once the loop has ended.
    fn next_batch<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let state = Arc::clone(self.state.get()?);
        awaitable(py, async move { Ok(next_batch(state).await) })
    }

    /// The next events, blocking.
    fn next_batch_blocking(&self, py: Python<'_>) -> PyResult<Vec<Item>> {
        let state = Arc::clone(self.state.get()?);
        block(py, next_batch(state))
    }

    /// How the loop ended; `None` until it has (or while a batch is read).
    fn outcome(&self) -> PyResult<Option<Outcome>> {
        let Ok(state) = self.state.get()?.try_lock() else {
            return Ok(None);
        };
        Ok(state.outcome.clone().map(Outcome::new))
    }

    /// The loop coalesced so far (protocol §11), as chunks.
    fn transcript(&self) -> PyResult<Vec<Chunk>> {
        let Ok(state) = self.state.get()?.try_lock() else {
            return Err(errors::plain(
                "the loop is being read: ask for its transcript after its end",
            ));
        };
        let Some(transcript) = &state.transcript else {
            return Err(errors::plain(
                "this loop keeps no transcript (it was opened with transcript=False)",
            ));
        };
        transcript
            .chunks()
            .iter()
            .cloned()
            .map(Chunk::encoded)
            .collect()
    }
}
