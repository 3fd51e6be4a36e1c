//! JSON values handed to Python: parsed by Python's own `json` module, so a
//! caller gets the dicts, lists and numbers it would get from `json.loads`.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// `json.loads`, looked up once.
static LOADS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `json.loads(text)`.
pub fn loads<'py>(py: Python<'py>, text: impl IntoPyObject<'py>) -> PyResult<Bound<'py, PyAny>> {
    let loads = LOADS.get_or_try_init(py, || {
        PyResult::Ok(py.import("json")?.getattr("loads")?.unbind())
    })?;
    loads.bind(py).call1((text,))
}

/// A serde value as Python's `json.loads` reads its JSON text.
pub fn to_python<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value)
        .map_err(|error| pyo3::exceptions::PyValueError::new_err(error.to_string()))?;
    loads(py, &text)
}
