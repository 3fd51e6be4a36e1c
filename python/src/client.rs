//! The client's handles for Python: a connection, a run, a loop, each with
//! an awaitable and a blocking form of every call that waits, and a bound
//! on each wait.
//!
//! ```text
//! connect / connect_blocking ──▶ Client ──start──▶ Run ──open_loop──▶ Loop ──take / next_batch_blocking──▶ [Chunk | Error, …]
//!                                                                           └─ outcome(), transcript()
//! ```
//!
//! Everything of the protocol is `runloop_client`'s; this module only
//! carries its values across. A loop's handle is run_loop.rs's.

use std::path::PathBuf;
use std::time::Duration;

use futures_util::FutureExt;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use runloop_client::{
    Client, ClientConfig, ClientTls, Container, Image, ImageRef, Run, RunRequest,
};
use runloop_proto::agents_run::{DIGEST_RULE, is_valid_digest, is_valid_name};
use runloop_proto::error_chain::Chain;
use serde_json::value::RawValue;

use crate::errors::Failure;
use crate::run_loop::NativeLoop;
use crate::runtime::{Owned, awaitable, block, bounded, seconds};

/// The digest sent when a caller names none: any unpinned catalog entry
/// accepts it (as `runloop run` sends).
pub const ANY_DIGEST: &str = runloop_proto::agents_run::UNPINNED;

/// The configuration of a connection, checked before any dial. The
/// connect timeout is the package's own (it names `connect_timeout`).
fn config(ca: &[PathBuf]) -> PyResult<ClientConfig> {
    let config = ClientConfig::default().connect_timeout(None);
    if ca.is_empty() {
        return Ok(config);
    }
    let tls = ClientTls::new(ca).map_err(|error| {
        Failure::Connect(format!(
            "cannot use the certificate authorities: {}",
            Chain(&error)
        ))
        .raise()
    })?;
    Ok(config.tls(tls))
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

async fn start(
    client: Client,
    request: RunRequest,
    limit: Option<Duration>,
) -> Result<NativeRun, Failure> {
    // A start given up on stops its run when the answer comes (the
    // client's rule for a dropped `start`).
    let run = bounded(limit, "the run's start", async {
        Ok(client.start(request).await?)
    })
    .await?;
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
    fn start<'py>(
        &self,
        py: Python<'py>,
        spec: Spec,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client.get()?.clone();
        let request = request(spec)?;
        let limit = seconds(timeout, "timeout")?;
        awaitable(py, async move {
            start(client, request, limit).await.map_err(Failure::raise)
        })
    }

    /// Opens a run, blocking.
    fn start_blocking(
        &self,
        py: Python<'_>,
        spec: Spec,
        timeout: Option<f64>,
    ) -> PyResult<NativeRun> {
        let client = self.client.get()?.clone();
        let request = request(spec)?;
        let limit = seconds(timeout, "timeout")?;
        block(py, start(client, request, limit))?.map_err(|f| f.into_pyerr(py))
    }

    /// Closes the connection (every run on it ends): an awaitable. Bounded
    /// by the client's close grace (2 s).
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

/// Waits for `run`'s end, at most `limit`.
async fn ended(run: Run, limit: Option<Duration>, what: &'static str) -> Result<(), Failure> {
    bounded(limit, what, async {
        run.ended().await;
        Ok(())
    })
    .await
}

#[pymethods]
impl NativeRun {
    /// The run's id, as the server minted it.
    #[getter]
    fn id(&self) -> &str {
        &self.id
    }

    /// Asks for one loop with `prompt`; its transcript is kept up to
    /// `transcript_limit` bytes of chunk JSON (`None`: none is kept).
    #[pyo3(signature = (prompt, transcript_limit))]
    fn open_loop(&self, prompt: String, transcript_limit: Option<u64>) -> PyResult<NativeLoop> {
        NativeLoop::open(self.run.get()?.run_loop(prompt), transcript_limit)
    }

    /// Sends the run's stop now, without waiting for the run's end.
    fn stop_nowait(&self) -> PyResult<()> {
        // The first poll of `stop` queues the stop channel's frame; what
        // is left is the wait for the run's end, which is not wanted here.
        let _ = self.run.get()?.stop().now_or_never();
        Ok(())
    }

    /// Stops the run and waits for its end: an awaitable.
    fn stop<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let run = self.run.get()?.clone();
        let limit = seconds(timeout, "timeout")?;
        let _ = run.stop().now_or_never();
        awaitable(py, async move {
            ended(run, limit, "the run's end after its stop")
                .await
                .map_err(Failure::raise)
        })
    }

    /// Stops the run and waits for its end, blocking.
    fn stop_blocking(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let run = self.run.get()?.clone();
        let limit = seconds(timeout, "timeout")?;
        let _ = run.stop().now_or_never();
        block(py, ended(run, limit, "the run's end after its stop"))?.map_err(|f| f.into_pyerr(py))
    }

    /// Resolves when the run has ended (by a stop, its container's end, or
    /// the connection's): an awaitable.
    fn wait_ended<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let run = self.run.get()?.clone();
        let limit = seconds(timeout, "timeout")?;
        awaitable(py, async move {
            ended(run, limit, "the run's end")
                .await
                .map_err(Failure::raise)
        })
    }

    /// Waits until the run has ended, blocking.
    fn wait_ended_blocking(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let run = self.run.get()?.clone();
        let limit = seconds(timeout, "timeout")?;
        block(py, ended(run, limit, "the run's end"))?.map_err(|f| f.into_pyerr(py))
    }

    /// Whether the run has ended.
    fn is_ended(&self) -> PyResult<bool> {
        Ok(self.run.get()?.is_ended())
    }
}
