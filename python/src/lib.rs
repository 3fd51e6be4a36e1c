//! The extension module `runloop._native`: the Rust client of the run-loop
//! protocol, carried into Python.
//!
//! The Python package (`python/runloop`) gives it Python's shapes — async
//! context managers, iterators, the exception hierarchy, the blocking
//! twin — and this module does all the work underneath: the framing, the
//! authorization, the sequence rules, the outcome and the transcript are
//! `runloop::client`'s, never rewritten in Python.
//!
//! ```text
//! client.rs    Client, Run, Loop: connect, start, loops read in batches, stop, close
//! events.rs    Chunk, Error, Outcome: what a loop hands to Python
//! errors.rs    the exceptions, made from runloop/_errors.py's classes
//! runtime.rs   the runtime of this process, awaitables, blocking waits, fork
//! value.rs     JSON values as Python's json module reads them
//! ```

mod client;
mod errors;
mod events;
mod runtime;
mod value;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use pyo3::prelude::*;
use runloop::client::{Client, Event};
use runloop::runtime::Catalog;
use runloop::server::{Credentials, Server, ServerConfig, ServerHandle};

use crate::errors::Failure;
use crate::runtime::{Owned, block};

/// How long closing the demo server waits for its connections to end.
const DEMO_CLOSE_GRACE: Duration = Duration::from_secs(5);

/// A provider server with the built-in demo agent on a loopback port, in
/// this process: `python -m runloop run`'s server, as `runloop run`
/// without `--url` has one.
#[pyclass(module = "runloop._native", name = "DemoServer", frozen)]
struct DemoServer {
    handle: Owned<ServerHandle>,
    serving: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[pymethods]
impl DemoServer {
    /// Binds 127.0.0.1 on a free port and serves (any credential).
    #[staticmethod]
    fn start(py: Python<'_>) -> PyResult<DemoServer> {
        let started = block(py, async {
            let config = ServerConfig::new(Credentials::Any, Catalog::demo());
            let server = Server::bind("127.0.0.1:0", config).await?;
            Ok::<_, runloop::server::BindError>(server.spawn())
        })?;
        let (handle, serving) = started.map_err(|error| {
            Failure::Other(format!("cannot start the demo server: {error}")).into_pyerr(py)
        })?;
        Ok(DemoServer {
            handle: Owned::new(handle),
            serving: std::sync::Mutex::new(Some(serving)),
        })
    }

    /// The server's URL (`ws://127.0.0.1:PORT`).
    #[getter]
    fn url(&self) -> PyResult<String> {
        Ok(self.handle.get()?.url())
    }

    /// Shuts the server down and waits (5 s at most) until it has.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.handle.get()?.shutdown();
        let serving = self
            .serving
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(serving) = serving {
            block(py, async move {
                let _ = tokio::time::timeout(DEMO_CLOSE_GRACE, serving).await;
            })?;
        }
        Ok(())
    }
}

/// The bench's yardstick: one loop read by the Rust client alone, in Rust
/// (connect, start `image`, the loop, stop, close), counting its chunks.
/// Returns `(chunks, seconds of the loop, outcome kind)`.
#[pyfunction]
fn rust_client_loop(
    py: Python<'_>,
    url: String,
    token: String,
    image: String,
    prompt: String,
) -> PyResult<(u64, f64, &'static str)> {
    let counted = block(py, async move {
        let client = Client::connect(&url, &token).await?;
        let request = runloop_proto::agents_run::RunRequest::new(
            runloop_proto::agents_run::Container::new(
                runloop_proto::agents_run::Image::Server(runloop_proto::agents_run::ImageRef {
                    name: image,
                    digest: client::ANY_DIGEST.to_owned(),
                }),
                1 << 30,
                0,
            ),
            serde_json::value::RawValue::from_string("{}".to_owned())
                .map_err(|error| Failure::Value(error.to_string()))?,
        );
        let run = client.start(request).await?;
        let began = Instant::now();
        let mut stream = run.run_loop(prompt);
        let mut chunks = 0u64;
        let mut ending = "broken";
        while let Some(event) = stream.next().await {
            match event {
                Event::Chunk { .. } => chunks += 1,
                Event::Error(_) => {}
                Event::End(outcome) => ending = outcome.name(),
            }
        }
        let seconds = began.elapsed().as_secs_f64();
        run.stop().await;
        client.close().await;
        Ok::<_, Failure>((chunks, seconds, ending))
    })?;
    counted.map_err(|f| f.into_pyerr(py))
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(client::connect, m)?)?;
    m.add_function(wrap_pyfunction!(client::connect_blocking, m)?)?;
    m.add_function(wrap_pyfunction!(rust_client_loop, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::at_exit, m)?)?;
    m.add_class::<client::NativeClient>()?;
    m.add_class::<client::NativeRun>()?;
    m.add_class::<client::NativeLoop>()?;
    m.add_class::<events::Chunk>()?;
    m.add_class::<events::Error>()?;
    m.add_class::<events::Outcome>()?;
    m.add_class::<DemoServer>()?;
    m.add("BATCH", client::BATCH)?;
    Ok(())
}
