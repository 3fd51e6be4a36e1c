//! The tokio runtime of the extension, one per process, and the bridge that
//! turns its futures into asyncio awaitables and runs them to completion for
//! the blocking API.
//!
//! Why one per process and not one for good: `os.fork()` copies the memory
//! of a runtime but none of its threads, so a runtime made before a fork is
//! dead in the child, and anything that waits on it waits forever. The
//! runtime is therefore keyed by the process id: a child that connects gets
//! a runtime of its own, and every handle remembers the process that made it
//! ([`Owned`]) and refuses to work, with an error that says why, in another.
//! What a dead runtime owned in a child is leaked, never dropped: dropping
//! it would wake threads that are not there.
//!
//! The blocking API waits in slices of [`SLICE`], with the GIL released,
//! and runs Python's signal handlers between them, so Ctrl-C interrupts a
//! wait within one slice; a caller's `timeout` in seconds ([`seconds`])
//! bounds the whole wait ([`bounded`]), for the client and its loops alike.
//!
//! At the interpreter's exit the runtime's threads are still there, and a
//! thread that takes the GIL while the interpreter finalizes crashes it.
//! Every way this crate's threads take the GIL goes through [`attach`],
//! which counts them; [`at_exit`] (registered with `atexit`) closes the
//! door and waits for those inside to leave.

use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3_async_runtimes::TaskLocals;
use pyo3_async_runtimes::generic::{self, ContextExt};

use crate::errors::{self, Failure};

/// How long a blocking call waits before it looks at Python's signals.
pub const SLICE: Duration = Duration::from_millis(25);

/// A bound on a wait from Python's seconds (`None`: no bound).
pub(crate) fn seconds(value: Option<f64>, what: &str) -> PyResult<Option<Duration>> {
    value
        .map(|s| {
            Duration::try_from_secs_f64(s).map_err(|_| {
                PyValueError::new_err(format!("{what} must be a number of seconds, not {s}"))
            })
        })
        .transpose()
}

/// `fut`, or [`Failure::Timeout`] naming `what` when `limit` passes first.
pub(crate) async fn bounded<T>(
    limit: Option<Duration>,
    what: &'static str,
    fut: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    match limit {
        Some(limit) => tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| Failure::Timeout(what, limit.as_secs_f64()))?,
        None => fut.await,
    }
}

/// The variable that sets the runtime's worker threads (tokio's own name);
/// one when it is not set.
///
/// One worker, because a Python caller's loops are read faster than its
/// one Python thread takes them: a second worker adds no throughput, and
/// its cost is in the paced regime, where each chunk comes alone and the
/// two workers hand the connection's reading task and the loop's pump to
/// each other, parking and waking per chunk. `python bench.py --rate
/// 20000` (one loop, 40,000 chunks from `runloop __sse-agent`, 3 rounds,
/// load average about 3): the package's CPU per chunk 20.9 µs with two
/// workers, 9.3 µs with one (pure Python: 13.7 and 10.2 µs); unpaced,
/// 250,510 and 246,435 chunks/s (1.56× and 1.81× pure Python's).
const WORKERS: &str = "TOKIO_WORKER_THREADS";

/// The runtime of this process, and the process it was made in.
static RUNTIME: Mutex<Option<(u32, &'static tokio::runtime::Runtime)>> = Mutex::new(None);

/// This process's runtime, made on first use (and again in a forked child).
pub fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    let pid = std::process::id();
    let mut slot = RUNTIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((made_in, runtime)) = *slot
        && made_in == pid
    {
        return Ok(runtime);
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if std::env::var_os(WORKERS).is_none() {
        builder.worker_threads(1);
    }
    let runtime = builder
        .enable_all()
        .thread_name("runloop")
        .build()
        .map_err(|error| errors::plain(&format!("cannot start the client's runtime: {error}")))?;
    // Leaked on purpose: it lives as long as the process, and a runtime a
    // fork left behind must never be dropped (see the module's docs).
    let runtime: &'static tokio::runtime::Runtime = Box::leak(Box::new(runtime));
    *slot = Some((pid, runtime));
    Ok(runtime)
}

/// Set at the interpreter's exit: no thread of the runtime takes the GIL again.
static EXITING: AtomicBool = AtomicBool::new(false);

/// Threads of the runtime that hold or wait for the GIL.
static ATTACHED: AtomicUsize = AtomicUsize::new(0);

/// How long [`at_exit`] waits for threads that hold the GIL to let it go.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// Runs `f` with the GIL from a thread of the runtime, unless the
/// interpreter is exiting (then `None`).
pub fn attach<R>(f: impl FnOnce(Python<'_>) -> R) -> Option<R> {
    ATTACHED.fetch_add(1, Ordering::SeqCst);
    let result = if EXITING.load(Ordering::SeqCst) {
        None
    } else {
        Some(Python::attach(f))
    };
    ATTACHED.fetch_sub(1, Ordering::SeqCst);
    result
}

/// Called by `atexit`: from now on no thread of the runtime takes the GIL,
/// and those that hold it are waited for (the GIL released meanwhile).
#[pyfunction]
pub fn at_exit(py: Python<'_>) {
    EXITING.store(true, Ordering::SeqCst);
    py.detach(|| {
        let began = Instant::now();
        while ATTACHED.load(Ordering::SeqCst) > 0 && began.elapsed() < EXIT_GRACE {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// The runtime as pyo3-async-runtimes sees it.
pub struct Tokio;

tokio::task_local! {
    /// The event loop (and contextvars) of the Python task a future serves.
    static LOCALS: TaskLocals;
}

impl generic::Runtime for Tokio {
    type JoinError = tokio::task::JoinError;
    type JoinHandle = tokio::task::JoinHandle<()>;

    fn spawn<F>(fut: F) -> Self::JoinHandle
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match runtime() {
            Ok(runtime) => runtime.spawn(fut),
            // Not reached: `awaitable` made the runtime before spawning.
            Err(_) => tokio::spawn(fut),
        }
    }

    /// pyo3-async-runtimes takes the GIL only in these (to complete an
    /// asyncio future): each goes through [`attach`]'s count.
    fn spawn_blocking<F>(f: F) -> Self::JoinHandle
    where
        F: FnOnce() + Send + 'static,
    {
        let counted = move || {
            // `f` takes the GIL itself; the count around it is what matters.
            ATTACHED.fetch_add(1, Ordering::SeqCst);
            if !EXITING.load(Ordering::SeqCst) {
                f();
            }
            ATTACHED.fetch_sub(1, Ordering::SeqCst);
        };
        match runtime() {
            Ok(runtime) => runtime.spawn_blocking(counted),
            Err(_) => tokio::task::spawn_blocking(counted),
        }
    }
}

impl ContextExt for Tokio {
    fn scope<F, R>(locals: TaskLocals, fut: F) -> Pin<Box<dyn Future<Output = R> + Send>>
    where
        F: Future<Output = R> + Send + 'static,
    {
        Box::pin(LOCALS.scope(locals, fut))
    }

    fn get_task_locals() -> Option<TaskLocals> {
        LOCALS.try_with(Clone::clone).ok()
    }
}

/// `fut` as an asyncio awaitable of the running event loop; cancelling it
/// drops `fut`.
///
/// pyo3-async-runtimes hands a result to its event loop with
/// `call_soon_threadsafe`, and prints the error when that loop has been
/// closed meanwhile (a caller that closed its loop under an open stream).
/// It is given the loop behind a [`GuardedLoop`], which drops a result no
/// one can receive any more instead.
pub fn awaitable<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    runtime()?;
    let event_loop = pyo3_async_runtimes::get_running_loop(py)?;
    let guarded = Bound::new(
        py,
        GuardedLoop {
            event_loop: event_loop.unbind(),
        },
    )?;
    let locals = TaskLocals::new(guarded.into_any()).copy_context(py)?;
    generic::future_into_py_with_locals::<Tokio, _, _>(py, locals, fut)
}

/// An event loop as pyo3-async-runtimes uses it (`create_future`,
/// `call_soon_threadsafe`), that lets a callback for a closed loop go.
#[pyclass(module = "runloop._native", frozen)]
pub struct GuardedLoop {
    event_loop: Py<PyAny>,
}

#[pymethods]
impl GuardedLoop {
    fn create_future<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.event_loop.bind(py).call_method0("create_future")
    }

    #[pyo3(signature = (*args, **kwargs))]
    fn call_soon_threadsafe(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let event_loop = self.event_loop.bind(py);
        let closed = || -> PyResult<bool> { event_loop.call_method0("is_closed")?.is_truthy() };
        if closed()? {
            return Ok(());
        }
        match event_loop.call_method("call_soon_threadsafe", args, kwargs) {
            Ok(_) => Ok(()),
            // Closed between the look and the call.
            Err(_) if closed()? => Ok(()),
            Err(error) => Err(error),
        }
    }
}

/// Runs `fut` to its end on this process's runtime with the GIL released,
/// running Python's signal handlers every [`SLICE`]: an exception one raises
/// (KeyboardInterrupt) ends the wait, and drops `fut`.
pub fn block<F, T>(py: Python<'_>, fut: F) -> PyResult<T>
where
    F: Future<Output = T> + Send,
    T: Send,
{
    let runtime = runtime()?;
    let mut fut = std::pin::pin!(fut);
    loop {
        let step = py
            .detach(|| runtime.block_on(async { tokio::time::timeout(SLICE, fut.as_mut()).await }));
        match step {
            Ok(value) => return Ok(value),
            Err(_) => py.check_signals()?,
        }
    }
}

/// A value that belongs to the process that made it: in a forked child it
/// refuses to be used, and is leaked rather than dropped.
pub struct Owned<T> {
    pid: u32,
    value: ManuallyDrop<T>,
}

impl<T> Owned<T> {
    /// `value`, made in this process.
    pub fn new(value: T) -> Self {
        Owned {
            pid: std::process::id(),
            value: ManuallyDrop::new(value),
        }
    }

    /// The value, unless this is a forked child of the process that made it.
    pub fn get(&self) -> PyResult<&T> {
        if self.pid == std::process::id() {
            Ok(&self.value)
        } else {
            Err(errors::forked(self.pid))
        }
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            // SAFETY: dropped once, here, and never touched again.
            unsafe { ManuallyDrop::drop(&mut self.value) }
        }
    }
}

impl errors::Failure {
    /// The exception, taking the GIL for it (in a future's last step) as
    /// [`attach`] allows: none once the interpreter is exiting. Here, not
    /// in errors.rs, so that the errors know nothing of the runtime.
    pub fn raise(self) -> PyErr {
        attach(|py| self.into_pyerr(py)).unwrap_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err("the interpreter is exiting")
        })
    }
}
