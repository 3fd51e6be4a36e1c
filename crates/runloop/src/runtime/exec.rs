//! The exec runtime: an agent program started as a child process, with a
//! proxy of this crate beside it in the server's process (protocol §12).
//!
//! ```text
//! server ──ws──▶ proxy (task, 127.0.0.1:P1) ──HTTP──▶ child process ($PORT = P2, own process group)
//!                                                     stdout/stderr ──lines──▶ tracing
//! ```
//!
//! The life of a child, and why each step is there:
//!
//! 1. **Start.** A free loopback port is picked (bound, read, released) and
//!    handed to the program as `$PORT`. The child gets its own process group
//!    (so a signal reaches whatever it forks too), `PR_SET_PDEATHSIG` =
//!    `SIGKILL` (so it dies with the server even if the server is killed
//!    outright), and the request's memory limit as `RLIMIT_DATA` (below).
//!    stdin is closed; stdout and stderr are read line by line into the
//!    server's log, each line bounded.
//! 2. **Ready.** The start resolves once the program accepts TCP on its
//!    port. If it exits first, the start fails with its exit status; if it
//!    neither listens nor exits within the startup timeout, it is killed and
//!    the start fails.
//! 3. **Running.** A supervisor task owns the child. If the child exits by
//!    itself, [`Container::ended`] resolves with its status; the proxy's
//!    loop in progress sees its event stream break and reports it.
//! 4. **Stop.** `SIGTERM` to the whole group, a grace period, then
//!    `SIGKILL` to the group; the child is reaped before `stop` resolves.
//!    A container dropped without `stop` still terminates its child (the
//!    supervisor sees the drop), and if the supervisor itself is dropped
//!    (the runtime shuts down) its guard kills the group, and tokio reaps
//!    the child on a best-effort basis (`kill_on_drop`); a child left
//!    unreaped by a dying server is reaped by init.
//!
//! # Why `RLIMIT_DATA` and not `RLIMIT_AS`
//!
//! `RLIMIT_AS` caps the whole virtual address space, and runtimes reserve
//! far more address space than they use: thread stacks, Go and JVM heaps,
//! V8's cage, glibc's per-thread malloc arenas (64 MiB each). An agent
//! program using 100 MiB can need gigabytes of address space, so a limit
//! on it refuses programs that are well within their memory. Since Linux
//! 4.7, `RLIMIT_DATA` counts the private writable mappings (heap, anonymous
//! memory, writable data): the memory a program actually asked to use, not
//! what it merely reserved (reservations are mapped without write access).
//! Neither counts resident pages the way a cgroup would; `RLIMIT_DATA` is
//! the closest a process limit gets. The disk limit is not applied: no
//! process limit bounds the bytes written across files (that takes a file
//! system quota or a container).
//!
//! # What is not covered
//!
//! The port is released before the child binds it, so another process can
//! take it in between (the readiness check would then talk to that
//! process). `PR_SET_PDEATHSIG` fires when the *thread* that spawned the
//! child ends, which for a tokio worker thread is the end of the runtime.
//! A descendant that leaves the process group (`setsid`) escapes the group
//! signals, and if the server is killed outright, its grandchildren outlive
//! it (the death signal is not inherited).

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::output::log_lines;
use super::{BoxFuture, Container, ContainerLimits, Runtime, StartError};
use crate::proxy::{Proxy, ProxyHandle};

/// A runtime that runs one program, with arguments, per container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exec {
    program: String,
    args: Vec<String>,
    grace: Duration,
    startup_timeout: Duration,
}

impl Exec {
    /// Runs `program` with `args`; a 5 s grace after `SIGTERM` and 60 s for
    /// the program to listen.
    pub fn new(
        program: impl Into<String>,
        args: impl IntoIterator<Item = impl Into<String>>,
    ) -> Exec {
        Exec {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            grace: Duration::from_secs(5),
            startup_timeout: Duration::from_secs(60),
        }
    }

    /// How long a stopped child has between `SIGTERM` and `SIGKILL`.
    pub fn with_grace(mut self, grace: Duration) -> Exec {
        self.grace = grace;
        self
    }

    /// How long the program has to accept TCP on its port.
    pub fn with_startup_timeout(mut self, timeout: Duration) -> Exec {
        self.startup_timeout = timeout;
        self
    }

    /// The program.
    pub fn program(&self) -> &str {
        &self.program
    }

    /// Its arguments.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// Starts one child and its proxy; resolves once both accept
    /// connections. [`Runtime::start`] is this, boxed.
    pub async fn spawn(&self, limits: ContainerLimits) -> Result<ExecContainer, StartError> {
        let port = free_port().map_err(|error| {
            StartError::with_source("cannot find a free port for the agent program", error)
        })?;
        let mut child = self.command(port, limits.memory).spawn().map_err(|error| {
            StartError::with_source(
                format_args!("cannot start the agent program {:?}", self.program),
                error,
            )
        })?;
        // `id` is `None` only once the child has been reaped; it was just spawned.
        let pid = child.id().unwrap_or_default();
        let group = Group::new(pid);
        let program: Arc<str> = Arc::from(self.program.as_str());
        info!(%program, pid, port, memory = limits.memory, "agent program started");
        let logs = [
            child
                .stdout
                .take()
                .map(|out| tokio::spawn(log_lines(out, Arc::clone(&program), pid, "stdout"))),
            child
                .stderr
                .take()
                .map(|err| tokio::spawn(log_lines(err, Arc::clone(&program), pid, "stderr"))),
        ]
        .into_iter()
        .flatten()
        .collect();

        let agent = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let ready = async {
            listening(&mut child, agent, self.startup_timeout).await?;
            let proxy = Proxy::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), agent)
                .await
                .map_err(|error| format!("cannot bind the proxy: {error}"))?;
            let url = format!("ws://{}", proxy.local_addr());
            Ok::<_, String>((proxy, url))
        };
        let (proxy, url) = match ready.await {
            Ok(ready) => ready,
            Err(why) => {
                warn!(%program, pid, %why, "agent program did not start");
                group.signal(libc::SIGKILL);
                let status = child.wait().await;
                debug!(pid, status = %describe(status), "reaped");
                return Err(StartError::new(why));
            }
        };
        let (proxy_stop, proxy_task) = proxy.spawn();
        let stop = CancellationToken::new();
        let (exited_tx, exited) = watch::channel(None);
        let supervisor = tokio::spawn(supervise(child, group, stop.clone(), self.grace, exited_tx));
        info!(%program, pid, %url, "exec container ready");
        Ok(ExecContainer {
            url,
            pid,
            grace: self.grace,
            stop,
            proxy_stop,
            supervisor: Some(supervisor),
            proxy: Some(proxy_task),
            logs,
            exited,
        })
    }

    fn command(&self, port: u16, memory: u64) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        let parent = std::process::id();
        // SAFETY: `child_setup` runs between fork and exec and only makes
        // system calls (prctl, getppid, getrlimit, setrlimit); it does not
        // allocate, lock or touch memory shared with other threads.
        unsafe {
            command.pre_exec(move || child_setup(parent, memory));
        }
        command
    }
}

impl Runtime for Exec {
    fn start(
        &self,
        limits: ContainerLimits,
    ) -> BoxFuture<'_, Result<Box<dyn Container>, StartError>> {
        Box::pin(async move {
            let container: Box<dyn Container> = Box::new(self.spawn(limits).await?);
            Ok(container)
        })
    }
}

/// In the child, before exec: die with the server, and the memory limit.
fn child_setup(parent: u32, memory: u64) -> io::Result<()> {
    // SAFETY: plain system calls on integers and a local struct.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
            return Err(io::Error::last_os_error());
        }
        // The server may have died before the death signal was armed.
        if libc::getppid() as u32 != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_DATA, &mut limit) == -1 {
            return Err(io::Error::last_os_error());
        }
        // Only ever lower: an unprivileged server cannot raise the hard limit.
        let memory = libc::rlim_t::try_from(memory).unwrap_or(libc::RLIM_INFINITY);
        let capped = memory.min(limit.rlim_max);
        limit.rlim_cur = capped;
        limit.rlim_max = capped;
        if libc::setrlimit(libc::RLIMIT_DATA, &limit) == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A loopback port no one listens on right now.
fn free_port() -> io::Result<u16> {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// Waits until the program accepts TCP at `agent`, exits, or runs out of time.
async fn listening(child: &mut Child, agent: SocketAddr, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        if TcpStream::connect(agent).await.is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the agent program did not listen on {agent} within {timeout:?}"
            ));
        }
        tokio::select! {
            status = child.wait() => {
                return Err(format!(
                    "the agent program exited before it listened on {agent}: {}",
                    describe(status)
                ));
            }
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Owns the child until it is gone: reports its exit, or terminates it.
async fn supervise(
    mut child: Child,
    group: Group,
    stop: CancellationToken,
    grace: Duration,
    exited: watch::Sender<Option<String>>,
) {
    let pid = group.pgid;
    let reason = tokio::select! {
        status = child.wait() => {
            let reason = format!("the agent program exited by itself: {}", describe(status));
            warn!(pid, %reason, "agent program ended");
            // Whatever it left behind in its group goes with it.
            group.signal(libc::SIGKILL);
            reason
        }
        () = stop.cancelled() => {
            group.signal(libc::SIGTERM);
            let status = match tokio::time::timeout(grace, child.wait()).await {
                Ok(status) => {
                    group.signal(libc::SIGKILL);
                    status
                }
                Err(_) => {
                    warn!(pid, ?grace, "agent program ignored SIGTERM; killing its group");
                    group.signal(libc::SIGKILL);
                    child.wait().await
                }
            };
            let reason = format!("the agent program was stopped: {}", describe(status));
            info!(pid, %reason, "agent program ended");
            reason
        }
    };
    group.disarm();
    exited.send_replace(Some(reason));
}

/// A process group that is killed when this guard is dropped armed.
struct Group {
    pgid: u32,
    armed: bool,
}

impl Group {
    fn new(pgid: u32) -> Group {
        Group { pgid, armed: true }
    }

    fn signal(&self, signal: libc::c_int) {
        let Ok(pgid) = libc::pid_t::try_from(self.pgid) else {
            return;
        };
        if pgid <= 1 {
            return;
        }
        // SAFETY: a system call on integers; ESRCH (no such group) is fine.
        unsafe {
            libc::killpg(pgid, signal);
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.armed {
            self.signal(libc::SIGKILL);
        }
    }
}

/// An exit status in words.
fn describe(status: io::Result<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => format!("exit status {code}"),
            (None, Some(signal)) => format!("killed by signal {signal}"),
            (None, None) => status.to_string(),
        },
        Err(error) => format!("its status could not be read: {error}"),
    }
}

/// One exec container: the child's pid, its proxy, and the tasks that
/// watch them.
#[derive(Debug)]
pub struct ExecContainer {
    url: String,
    pid: u32,
    grace: Duration,
    stop: CancellationToken,
    proxy_stop: ProxyHandle,
    supervisor: Option<JoinHandle<()>>,
    proxy: Option<JoinHandle<io::Result<()>>>,
    logs: Vec<JoinHandle<()>>,
    exited: watch::Receiver<Option<String>>,
}

impl ExecContainer {
    /// The child's process id (and process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Stops the proxy and the child (`SIGTERM` to its group, the grace,
    /// `SIGKILL`), reaps it, and says how it ended.
    pub async fn terminate(mut self) -> String {
        self.proxy_stop.shutdown();
        self.stop.cancel();
        if let Some(supervisor) = self.supervisor.take()
            && let Err(error) = supervisor.await
        {
            warn!(pid = self.pid, %error, "the supervisor task failed");
        }
        let reason =
            self.exited.borrow().clone().unwrap_or_else(|| {
                "the agent program's supervisor ended without a word".to_owned()
            });
        if let Some(proxy) = self.proxy.take() {
            match proxy.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => warn!(pid = self.pid, %error, "the proxy failed"),
                Err(error) => warn!(pid = self.pid, %error, "the proxy task failed"),
            }
        }
        // The pipes end with the group; a descendant that left the group may
        // hold them open, so its output is not waited for past the grace.
        for mut log in std::mem::take(&mut self.logs) {
            if tokio::time::timeout(self.grace, &mut log).await.is_err() {
                log.abort();
            }
        }
        info!(pid = self.pid, %reason, "exec container stopped");
        reason
    }
}

impl Container for ExecContainer {
    fn proxy_url(&self) -> &str {
        &self.url
    }

    fn ended(&mut self) -> BoxFuture<'_, String> {
        Box::pin(async move {
            match self.exited.wait_for(Option::is_some).await {
                Ok(reason) => reason.clone().unwrap_or_default(),
                Err(_) => "the agent program's supervisor is gone".to_owned(),
            }
        })
    }

    fn stop(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            (*self).terminate().await;
        })
    }
}

impl Drop for ExecContainer {
    /// Dropped without `stop`, the container still ends: the supervisor
    /// terminates and reaps the child, the proxy shuts down.
    fn drop(&mut self) {
        self.proxy_stop.shutdown();
        self.stop.cancel();
    }
}
