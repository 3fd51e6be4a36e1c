//! What a loop hands to Python: `Chunk`, `Error` and, at its end, `Outcome`.
//!
//! A chunk keeps the bytes it came in and the Rust reader's parse of them
//! (which the reader made anyway, to check the sequence): `json` is the
//! wire's text, and the typed accessors read the parse without touching
//! Python's `json`. The Python string and the `dict` of `data` are made on
//! first use and kept, so a caller that only counts chunks, or only reads
//! `kind` and `text`, pays for neither.
//!
//! The parse is shared (an `Arc`) with the loop's transcript, which takes
//! it over without a copy once Python has let the chunk go (run_loop.rs).

use std::sync::Arc;

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyString;
use runloop_client::ErrorValue;
use runloop_client::{AgenticLoopChunk, Outcome as WireOutcome};
use runloop_proto::error_chain::Chain;

use crate::value;

/// One chunk of a loop (protocol §8).
#[pyclass(module = "runloop", name = "Chunk", frozen)]
pub struct Chunk {
    chunk: Arc<AgenticLoopChunk>,
    json: Bytes,
    text: PyOnceLock<Py<PyString>>,
    data: PyOnceLock<Py<PyAny>>,
}

impl Chunk {
    /// A chunk and the JSON it came as.
    pub fn new(chunk: Arc<AgenticLoopChunk>, json: Bytes) -> Self {
        Chunk {
            chunk,
            json,
            text: PyOnceLock::new(),
            data: PyOnceLock::new(),
        }
    }

    /// A chunk that did not come off the wire (a transcript's): its JSON
    /// is its encoding.
    pub fn encoded(chunk: AgenticLoopChunk) -> PyResult<Self> {
        let json = serde_json::to_vec(&chunk)
            .map_err(|error| pyo3::exceptions::PyValueError::new_err(error.to_string()))?;
        Ok(Chunk::new(Arc::new(chunk), Bytes::from(json)))
    }

    fn json_str<'py>(&self, py: Python<'py>) -> &Bound<'py, PyString> {
        self.text
            .get_or_init(py, || {
                // The reader parsed these bytes as JSON, so they are UTF-8.
                PyString::new(py, &String::from_utf8_lossy(&self.json)).unbind()
            })
            .bind(py)
    }
}

#[pymethods]
impl Chunk {
    /// The chunk's `type`: `"assistant_text_content"`, `"tool_response"`, …
    #[getter]
    fn kind(&self) -> &'static str {
        self.chunk.kind().as_str()
    }

    /// The chunk's JSON text exactly as the server sent it.
    #[getter]
    fn json<'py>(&self, py: Python<'py>) -> Bound<'py, PyString> {
        self.json_str(py).clone()
    }

    /// The chunk parsed by `json.loads` (made once, then the same dict).
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let data = self.data.get_or_try_init(py, || {
            PyResult::Ok(value::loads(py, self.json_str(py))?.unbind())
        })?;
        Ok(data.bind(py).clone())
    }

    /// `text` of a reasoning, text or refusal fragment; else `None`.
    #[getter]
    fn text(&self) -> Option<&str> {
        match &*self.chunk {
            AgenticLoopChunk::AssistantReasoning(c)
            | AgenticLoopChunk::AssistantTextContent(c)
            | AgenticLoopChunk::AssistantRefusal(c) => Some(&c.text),
            _ => None,
        }
    }

    /// `id` of a tool call or a tool response; else `None`.
    #[getter]
    fn id(&self) -> Option<&str> {
        match &*self.chunk {
            AgenticLoopChunk::AssistantToolCall(c) => Some(&c.id),
            AgenticLoopChunk::ToolResponse(c) => Some(&c.id),
            _ => None,
        }
    }

    /// `name` of a tool call; else `None`.
    #[getter]
    fn name(&self) -> Option<&str> {
        match &*self.chunk {
            AgenticLoopChunk::AssistantToolCall(c) => Some(&c.name),
            _ => None,
        }
    }

    /// `arguments` of a tool call (a fragment of JSON text); else `None`.
    #[getter]
    fn arguments(&self) -> Option<&str> {
        match &*self.chunk {
            AgenticLoopChunk::AssistantToolCall(c) => c.arguments.as_deref(),
            _ => None,
        }
    }

    /// The tool call whose sub-agent produced the chunk; `None`: the main thread.
    #[getter]
    fn parent_tool_call_id(&self) -> Option<&str> {
        self.chunk.parent_tool_call_id()
    }

    /// Whether this is a fatal notification: the loop's last word, a failure.
    #[getter]
    fn is_fatal(&self) -> bool {
        self.chunk.is_fatal()
    }

    /// `message` of a notification (any JSON value); else `None`.
    #[getter]
    fn message<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match &*self.chunk {
            AgenticLoopChunk::Notification(c) => value::to_python(py, &c.message).map(Some),
            _ => Ok(None),
        }
    }

    /// `prompt` of a user chunk; else `None`.
    #[getter]
    fn prompt(&self) -> Option<&str> {
        match &*self.chunk {
            AgenticLoopChunk::User(c) => Some(&c.prompt),
            _ => None,
        }
    }

    /// `mimeType` of an image or audio chunk; else `None`.
    #[getter]
    fn mime_type(&self) -> Option<&str> {
        match &*self.chunk {
            AgenticLoopChunk::AssistantImageContent(c)
            | AgenticLoopChunk::AssistantAudioContent(c) => Some(&c.mime_type),
            _ => None,
        }
    }

    /// `(completion_tokens, prompt_tokens, total_tokens)` of a usage chunk
    /// (a delta); else `None`.
    #[getter]
    fn usage(&self) -> Option<(u64, u64, u64)> {
        match &*self.chunk {
            AgenticLoopChunk::Usage(c) => {
                Some((c.completion_tokens, c.prompt_tokens, c.total_tokens))
            }
            _ => None,
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("Chunk({})", self.json_str(py).repr()?))
    }
}

/// The error of a loop: there was no loop, or it did not finish (protocol §9).
#[pyclass(module = "runloop", name = "Error", frozen)]
pub struct Error {
    error: ErrorValue,
    json: String,
    value: PyOnceLock<Py<PyAny>>,
}

impl Error {
    /// The event for `error`.
    pub fn new(error: ErrorValue) -> Self {
        // A serde value always serializes.
        let json = serde_json::to_string(&error.0).unwrap_or_default();
        Error {
            error,
            json,
            value: PyOnceLock::new(),
        }
    }
}

#[pymethods]
impl Error {
    /// The error value as JSON text.
    #[getter]
    fn json(&self) -> &str {
        &self.json
    }

    /// The error value, parsed: any JSON value (often an object with `kind`).
    #[getter]
    fn value<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let value = self.value.get_or_try_init(py, || {
            PyResult::Ok(value::to_python(py, &self.error.0)?.unbind())
        })?;
        Ok(value.bind(py).clone())
    }

    fn __repr__(&self) -> String {
        format!("Error({:?})", self.json)
    }
}

/// How a loop ended.
#[pyclass(module = "runloop", name = "Outcome", frozen)]
pub struct Outcome {
    outcome: WireOutcome,
}

impl Outcome {
    /// The outcome of the Rust reader.
    pub fn new(outcome: WireOutcome) -> Self {
        Outcome { outcome }
    }
}

#[pymethods]
impl Outcome {
    /// `"finished"`, `"unfinished"`, `"no_loop"`, `"not_served"` or `"broken"`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.outcome.name()
    }

    /// Whether the loop finished and its last chunk was a fatal notification.
    #[getter]
    fn fatal(&self) -> bool {
        matches!(self.outcome, WireOutcome::Finished { fatal: true })
    }

    /// The loop's error value (`unfinished`, `no_loop`); else `None`.
    #[getter]
    fn error<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.outcome
            .error()
            .map(|error| value::to_python(py, &error.0))
            .transpose()
    }

    /// Why the sequence broke (`broken`); else `None`.
    #[getter]
    fn reason(&self) -> Option<String> {
        match &self.outcome {
            WireOutcome::Broken(why) => Some(Chain(why).to_string()),
            _ => None,
        }
    }

    /// Whether the loop finished and did not fail: the one good ending.
    #[getter]
    fn ok(&self) -> bool {
        self.outcome.is_success()
    }

    fn __repr__(&self) -> String {
        match &self.outcome {
            WireOutcome::Finished { fatal } => {
                format!("Outcome('finished', fatal={})", py_bool(*fatal))
            }
            WireOutcome::Unfinished(e) | WireOutcome::NoLoop(e) => {
                format!("Outcome({:?}, error={})", self.outcome.name(), e.0)
            }
            WireOutcome::Broken(why) => {
                format!("Outcome('broken', reason={:?})", Chain(why).to_string())
            }
            _ => format!("Outcome({:?})", self.outcome.name()),
        }
    }
}

fn py_bool(value: bool) -> &'static str {
    if value { "True" } else { "False" }
}
