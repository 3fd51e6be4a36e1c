//! The exceptions the extension raises, made from the classes of
//! `runloop/_errors.py`.
//!
//! The hierarchy is written in Python because one class,
//! `ConnectTimeout`, has two bases (`ConnectError` and the builtin
//! `TimeoutError`), which an exception made in Rust cannot have. A future
//! reports why it failed as a [`Failure`], which needs no GIL; it becomes
//! the exception when the result is handed to Python.
//!
//! An exception's message is the Rust error's whole chain, each cause once
//! (`top: cause: cause`, [`Chain`]), since a Rust error's own words are its
//! layer's sentence alone. No `__cause__` is set, so a traceback says each
//! cause once, in the message.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use runloop_client::{ConnectError, RunError};
use runloop_proto::error_chain::Chain;

use crate::value;

/// Why a call failed, before it is a Python exception.
#[derive(Debug)]
pub enum Failure {
    /// `ConnectError`: the server could not be reached, TLS failed, or the
    /// server turned the connection away (a refused credential, a close
    /// with its reason).
    Connect(String),
    /// `ConnectTimeout`: connecting took longer than allowed.
    ConnectTimeout(f64),
    /// `ConnectionLost`: the connection ended before the server's answer,
    /// otherwise than by a refusal (it broke, the server sent what cannot
    /// be read, …); the message names which.
    Lost(String),
    /// `Timeout`: a wait (named) took longer than its bound, in seconds.
    Timeout(&'static str, f64),
    /// `RunRefused`, with the server's error value.
    Refused(String, runloop_proto::ErrorValue),
    /// `RunNotServed`: a bare finish.
    NotServed,
    /// `RunloopError`, anything else.
    Other(String),
    /// `ValueError`: the arguments.
    Value(String),
}

impl From<ConnectError> for Failure {
    fn from(error: ConnectError) -> Self {
        Failure::Connect(Chain(&error).to_string())
    }
}

impl From<RunError> for Failure {
    fn from(error: RunError) -> Self {
        let message = Chain(&error).to_string();
        match error {
            RunError::Refused(value) => Failure::Refused(message, value),
            RunError::NotServed => Failure::NotServed,
            // Turned away: a refused credential (a close with no frame,
            // protocol §3), none where one was wanted, or a server that
            // closed the connection and said why. Not connected.
            RunError::CredentialRefused | RunError::NoCredential | RunError::Closed { .. } => {
                Failure::Connect(message)
            }
            // Anything else that ended the connection first: named by the
            // client (a broken socket, a message over the limit, …).
            RunError::ConnectionEnded(_) => Failure::Lost(message),
            RunError::Encode(_) => Failure::Value(message),
            _ => Failure::Other(message),
        }
    }
}

impl Failure {
    /// The exception.
    pub fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let made = match self {
            Failure::Connect(message) => make(py, "ConnectError", (message,)),
            Failure::ConnectTimeout(seconds) => make(
                py,
                "ConnectTimeout",
                (format!("connecting took longer than {seconds} s"),),
            ),
            Failure::Lost(message) => make(py, "ConnectionLost", (message,)),
            Failure::Timeout(what, seconds) => make(
                py,
                "Timeout",
                (format!(
                    "{what} did not come within {seconds} s (timeout={seconds})"
                ),),
            ),
            Failure::Refused(message, error) => match value::to_python(py, &error.0) {
                Ok(error) => make(py, "RunRefused", (message, error)),
                Err(failed) => Err(failed),
            },
            Failure::NotServed => make(py, "RunNotServed", ("the server did not serve the run",)),
            Failure::Other(message) => make(py, "RunloopError", (message,)),
            Failure::Value(message) => return PyValueError::new_err(message),
        };
        made.unwrap_or_else(|error| error)
    }
}

/// An instance of `runloop._errors.<class>` as the error to raise.
fn make<'py, A>(py: Python<'py>, class: &str, args: A) -> PyResult<PyErr>
where
    A: pyo3::call::PyCallArgs<'py>,
{
    let class = py.import("runloop._errors")?.getattr(class)?;
    Ok(PyErr::from_value(class.call1(args)?))
}

/// A `RunloopError` with `message`.
pub fn plain(message: &str) -> PyErr {
    Python::attach(|py| {
        make(py, "RunloopError", (message,))
            .unwrap_or_else(|_| PyRuntimeError::new_err(message.to_owned()))
    })
}

/// A `UsedAfterFork`: a handle made in process `pid`, used in a child of it.
pub fn forked(pid: u32) -> PyErr {
    Python::attach(|py| {
        make(
            py,
            "UsedAfterFork",
            (format!(
                "this handle belongs to process {pid}, and this is a child it forked \
                 (pid {}): a connection cannot cross os.fork(), connect again in the child",
                std::process::id()
            ),),
        )
        .unwrap_or_else(|error| error)
    })
}

/// A `TranscriptTooLarge`: the loop's transcript passed `limit` bytes of
/// chunk JSON after `chunks` chunks and was let go.
pub fn transcript_too_large(limit: u64, chunks: u64) -> PyErr {
    Python::attach(|py| {
        make(
            py,
            "TranscriptTooLarge",
            (
                format!(
                    "the loop's transcript passed its bound of {limit} bytes of chunk JSON after \
                     {chunks} chunks and was let go (the loop itself went on): open the loop with \
                     a larger transcript_limit=, or transcript=False to keep none"
                ),
                limit,
            ),
        )
        .unwrap_or_else(|error| error)
    })
}
