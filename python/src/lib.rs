//! The extension module `runloop._native`: the Rust client of the run-loop
//! protocol, carried into Python.
//!
//! The Python package (`python/runloop`) gives it Python's shapes — async
//! context managers, iterators, the exception hierarchy, the blocking
//! twin — and this module does all the work underneath: the framing, the
//! authorization, the sequence rules, the outcome and the transcript are
//! `runloop_client`'s, never rewritten in Python. It builds on the client
//! and the protocol's types only (no server, proxy or runtime):
//! `python -m runloop run`'s demo server is the `runloop` command, run as
//! a child process (`runloop/_demo.py`).
//!
//! ```text
//! client.rs    Client, Run: connect, start, stop, close
//! run_loop.rs  Loop: a loop read by a task of the runtime, handed over in batches
//! events.rs    Chunk, Error, Outcome: what a loop hands to Python
//! errors.rs    the exceptions, made from runloop/_errors.py's classes
//! runtime.rs   the runtime of this process, awaitables, blocking waits, fork
//! value.rs     JSON values as Python's json module reads them
//! ```

/// jemalloc for the extension's own allocations (Python's are its own):
/// see the dependency's note in Cargo.toml.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod client;
mod errors;
mod events;
mod run_loop;
mod runtime;
mod value;

use std::time::Instant;

use futures_util::StreamExt;
use pyo3::prelude::*;
use runloop_client::{Client, Event, RunRequest};

use crate::errors::Failure;
use crate::runtime::block;

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
        let run = client.start(RunRequest::server(image).disk(0)).await?;
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

/// The checkout this extension was built from (`python/`'s parent), for
/// `python -m runloop run`'s word on how to install the `runloop` command.
const CHECKOUT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(client::connect, m)?)?;
    m.add_function(wrap_pyfunction!(client::connect_blocking, m)?)?;
    m.add_function(wrap_pyfunction!(rust_client_loop, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::at_exit, m)?)?;
    m.add_class::<client::NativeClient>()?;
    m.add_class::<client::NativeRun>()?;
    m.add_class::<run_loop::NativeLoop>()?;
    m.add_class::<events::Chunk>()?;
    m.add_class::<events::Error>()?;
    m.add_class::<events::Outcome>()?;
    m.add("BATCH", run_loop::BATCH)?;
    m.add("CHECKOUT", CHECKOUT)?;
    // A debug build measures the optimiser's absence: the bench says so.
    m.add("DEBUG", cfg!(debug_assertions))?;
    Ok(())
}
