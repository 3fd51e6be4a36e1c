//! The supervised agent: one agent program's process, from its spawn to its
//! last release, held the same way whichever runtime started it.
//!
//! ```text
//! spawned ─▶ Supervisor::listening (probe, back off, until ready, exited or late)
//!              │ not ready: Supervisor::give_up (kill all, reap, release)
//!              ▼
//!            Supervisor::serve ─▶ proxy in front ─▶ Supervised (a Container, its
//!                                                   paths in process for the server)
//!              supervisor task: exit by itself │ end now (kill) │ stop (signal, grace, kill)
//!                               └──▶ how it ended, in words ──▶ the proxy (AgentEnd), `ended`
//!                                    then release
//! ```
//!
//! Why one module: the exec and oci runtimes differ in how a process
//! starts, how it is signalled and how a socket to it is made (in the
//! run's own network namespace under both; exec on the host's network, its
//! operator's opt-in, checks who owns the port), and in nothing else. What a caller and an
//! operator see of an agent's life is written here once, so it reads the
//! same under both: the readiness loop and its two failures (`the agent
//! program did not listen on 127.0.0.1:PORT within 60 s …`, `… exited
//! before it listened …`, which says where the program's output went),
//! the crash-recovery policy, and the words of an end (`exited by itself:
//! exit status 3`, memory named when the kernel's OOM killer was in it,
//! `was stopped: …`). A runtime says only what is its own, as an
//! [`Agent`].
//!
//! The crash-recovery policy: an agent program that ends by itself is
//! over. How it ended is said at once — to the proxy, so a loop its death
//! cut short says so in words (`the agent program exited (exit status 3)
//! before its /run body ended`), and to [`Container::ended`], so the server
//! ends the run — and then every process of the run is killed and what it
//! held released. Nothing is restarted: a run's agent holds the state of
//! its registration, and another process would not.

use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use runloop_proxy::{Dial, LocalProxy, Proxy};
use tokio::process::Child;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::output::{OutputLimit, TenantLog, log_output};
use super::{BoxFuture, Container, StartError};

/// The pause between two readiness probes in a start's first
/// [`FINE`] — where an agent of a compiled language listens (a few
/// milliseconds) — shorter than the runtime's timer can sleep (its tick is
/// a millisecond), so it is slept on a blocking thread. A probe asks the
/// kernel, in the run's namespace, who listens on the port (no
/// connection, no socket table read whole), a few microseconds, and
/// connects once something does; the back-off it replaced (2, 4, 8, then
/// 10 ms) made a start wait up to 10 ms past its agent's listen.
const FINE_PAUSE: Duration = Duration::from_micros(250);
/// How long probes come at [`FINE_PAUSE`].
const FINE: Duration = Duration::from_millis(20);
/// The pause between two probes after [`FINE`]: the timer's own tick.
const PAUSE: Duration = Duration::from_millis(1);
/// How long probes come at [`PAUSE`]; then at [`LATE_PAUSE`]: a start
/// that takes this long is not waiting on its probe, and one that never
/// listens does not cost a probe a millisecond for its whole timeout.
const YOUNG: Duration = Duration::from_millis(500);
/// The pause between two probes of a start older than [`YOUNG`].
const LATE_PAUSE: Duration = Duration::from_millis(10);

/// The pause after a probe of a start `age` old.
async fn pause(age: Duration) {
    if age < FINE {
        // A blocking thread's sleep is as short as asked; if the pool
        // cannot run it, the timer's tick does.
        if tokio::task::spawn_blocking(|| std::thread::sleep(FINE_PAUSE))
            .await
            .is_err()
        {
            tokio::time::sleep(PAUSE).await;
        }
    } else if age < YOUNG {
        tokio::time::sleep(PAUSE).await;
    } else {
        tokio::time::sleep(LATE_PAUSE).await;
    }
}

/// What a runtime says of its agent program: how to reach it, signal it,
/// kill it and release what it held. The process itself (the [`Child`]
/// whose exit is the agent's end) is the [`Supervisor`]'s.
pub trait Agent: Send + Sync + 'static {
    /// What the agent is called in the words of its end (`the agent
    /// program`, `the container`).
    const WHAT: &'static str;

    /// One readiness probe: `Ok(true)` once the agent program listens
    /// where a connection made the runtime's way reaches it, and it is the
    /// run's own, `Ok(false)` while nothing listens. Called every quarter
    /// of a millisecond while a start is young, so it must be cheap.
    fn probe(&self) -> impl Future<Output = Result<bool, NotReady>> + Send;

    /// The process's exit status in words (`exit status 3`, `killed by
    /// signal 9`).
    fn describe(&self, status: io::Result<ExitStatus>) -> String {
        describe(status)
    }

    /// How many of the run's processes the kernel killed at its memory
    /// limit; `None` where that cannot be read.
    fn oom_kills(&self) -> Option<u64>;

    /// Asks every process of the run to stop.
    fn signal_stop(&self) -> impl Future<Output = ()> + Send;

    /// Kills every process of the run.
    fn kill(&self) -> impl Future<Output = ()> + Send;

    /// Releases what the run held, once its process has been reaped.
    fn release(self) -> impl Future<Output = ()> + Send;

    /// Where the supervisor task runs: on the runtime (`None`, the
    /// default), or on the tracker of a runtime that waits for its
    /// supervisors before it exits.
    fn tracker(&self) -> Option<TaskTracker> {
        None
    }
}

/// Why an agent did not become ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// Another process listens where the agent program should: a runtime
    /// that can tries another place.
    Taken,
    /// Its process exited first; the words say how.
    Exited(String),
    /// Time ran out, or a probe could not be made; the words say which.
    Failed(String),
}

impl NotReady {
    /// What the caller is told.
    pub fn words(self) -> String {
        match self {
            NotReady::Taken => "another process listens on the agent program's port".to_owned(),
            NotReady::Exited(why) | NotReady::Failed(why) => why,
        }
    }
}

/// An agent program's process from its spawn until it serves (or is given
/// up on): its output logged, the watches its end will be told on.
#[derive(Debug)]
pub struct Supervisor {
    name: Arc<str>,
    child: Child,
    logs: Vec<JoinHandle<()>>,
    grace: Duration,
    stop: CancellationToken,
    end_now: CancellationToken,
    exited: watch::Sender<Option<String>>,
}

impl Supervisor {
    /// Takes `child` (called `name` in the log, whose output is logged
    /// within `output` and its tenant's log rate, `tenant`); `stop` stops
    /// it once it serves, and a stopped
    /// agent has `grace` between its stop signal and the kill.
    pub fn new(
        mut child: Child,
        name: Arc<str>,
        output: OutputLimit,
        tenant: Option<TenantLog>,
        stop: CancellationToken,
        grace: Duration,
    ) -> Supervisor {
        let pid = child.id().unwrap_or_default();
        let logs = log_output(&mut child, Arc::clone(&name), pid, output, tenant);
        Supervisor {
            name,
            child,
            logs,
            grace,
            stop,
            end_now: CancellationToken::new(),
            exited: watch::channel(None).0,
        }
    }

    /// What stops the agent (and its proxy, and whatever else watches it).
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// Cancelled, it kills the agent at once, and its end is reported as
    /// an end by itself (the oci link does, when the kernel's OOM killer
    /// was in the run).
    pub fn end_now(&self) -> &CancellationToken {
        &self.end_now
    }

    /// The words of the agent's end once it has ended, as
    /// [`Container::ended`] says them.
    pub fn ends(&self) -> watch::Receiver<Option<String>> {
        self.exited.subscribe()
    }

    /// Waits until `agent` is ready (probed every quarter of a
    /// millisecond for 20 ms, then every millisecond, then every ten once
    /// the start is half a second old), its process exits, or
    /// `timeout` has passed; `port` is where it must listen,
    /// `127.0.0.1:$PORT` in every runtime.
    pub async fn listening<A: Agent>(
        &mut self,
        agent: &A,
        port: u16,
        timeout: Duration,
    ) -> Result<(), NotReady> {
        let began = Instant::now();
        let deadline = began + timeout;
        loop {
            if agent.probe().await? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(NotReady::Failed(format!(
                    "the agent program did not listen on 127.0.0.1:{port} within {} s: it must \
                     listen on 127.0.0.1:$PORT (here {port})",
                    timeout.as_secs_f64()
                )));
            }
            tokio::select! {
                status = self.child.wait() => {
                    return Err(NotReady::Exited(format!(
                        "the agent program exited before it listened on 127.0.0.1:{port}: {} \
                         (its output is in the server's log)",
                        how(agent, status)
                    )));
                }
                () = pause(began.elapsed()) => {}
            }
        }
    }

    /// Ends an agent that will not serve: kills every process of the run,
    /// reaps the process, releases what the run held.
    pub async fn give_up<A: Agent>(mut self, agent: A) {
        self.stop.cancel();
        agent.kill().await;
        // The process itself too, should it be outside what `kill` reaches
        // (runc, while it still makes the container).
        let _ = self.child.start_kill();
        let status = self.child.wait().await;
        debug!(agent = %self.name, status = %agent.describe(status), "reaped");
        agent.release().await;
        for log in self.logs {
            log.abort();
        }
    }

    /// Puts a proxy in front of the agent, which it reaches as `target`
    /// dials (a socket made in the run's network namespace for each call),
    /// and hands the process to its supervisor task: the agent serves, as
    /// a [`Supervised`] that carries `runtime`, what its runtime says of
    /// it. A proxy that cannot be bound gives the agent up.
    pub async fn serve<A: Agent, T>(
        self,
        agent: A,
        target: impl Dial,
        runtime: T,
    ) -> Result<Supervised<T>, String> {
        let proxy = match Proxy::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), target).await {
            Ok(proxy) => proxy,
            Err(error) => {
                self.give_up(agent).await;
                return Err(format!("cannot bind the proxy: {error}"));
            }
        };
        let url = format!("ws://{}", proxy.local_addr());
        let Supervisor {
            name,
            child,
            logs,
            grace,
            stop,
            end_now,
            exited,
        } = self;
        let (died, agent_end) = watch::channel(None);
        let proxy = proxy.with_agent_end(agent_end);
        let local = proxy.local();
        let (handle, serving) = proxy.spawn();
        // The proxy ends with the agent.
        let proxy_stop = stop.clone();
        let proxy_name = Arc::clone(&name);
        let proxy = tokio::spawn(async move {
            proxy_stop.cancelled().await;
            handle.shutdown();
            match serving.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => warn!(agent = %proxy_name, %error, "the proxy failed"),
                Err(error) => warn!(agent = %proxy_name, %error, "the proxy task failed"),
            }
        });
        let ends = exited.subscribe();
        let watched = Watched {
            name: Arc::clone(&name),
            child,
            grace,
            stop: stop.clone(),
            end_now,
            exited,
            died,
        };
        let supervisor = match agent.tracker() {
            Some(tracker) => tracker.spawn(watched.supervise(agent)),
            None => tokio::spawn(watched.supervise(agent)),
        };
        Ok(Supervised {
            name,
            what: A::WHAT,
            url,
            local,
            grace,
            stop,
            supervisor: Some(supervisor),
            proxy: Some(proxy),
            logs,
            exited: ends,
            runtime,
            disk_file: None,
        })
    }
}

/// What the supervisor task owns.
struct Watched {
    name: Arc<str>,
    child: Child,
    grace: Duration,
    stop: CancellationToken,
    end_now: CancellationToken,
    exited: watch::Sender<Option<String>>,
    /// How it ended, for the proxy.
    died: watch::Sender<Option<String>>,
}

impl Watched {
    /// Owns the process until it is gone: says how it ended as soon as it
    /// knows, then releases everything of the run.
    async fn supervise<A: Agent>(mut self, agent: A) {
        let name = &self.name;
        let what = A::WHAT;
        let reason = tokio::select! {
            status = self.child.wait() => self.by_itself(&agent, status),
            () = self.end_now.cancelled() => {
                agent.kill().await;
                let status = self.child.wait().await;
                self.by_itself(&agent, status)
            }
            () = self.stop.cancelled() => {
                agent.signal_stop().await;
                let status = match tokio::time::timeout(self.grace, self.child.wait()).await {
                    Ok(status) => status,
                    Err(_) => {
                        warn!(agent = %name, grace = ?self.grace, "{what} ignored its stop signal; killing every process in it");
                        agent.kill().await;
                        self.child.wait().await
                    }
                };
                let reason = format!("{what} was stopped: {}", agent.describe(status));
                info!(agent = %name, %reason, "agent ended");
                reason
            }
        };
        self.exited.send_replace(Some(reason));
        // The proxy stays until the server stops the run: a loop in
        // progress must end with the words just told.
        agent.release().await;
    }

    /// The words of an end by itself, told to the proxy at once.
    fn by_itself<A: Agent>(&self, agent: &A, status: io::Result<ExitStatus>) -> String {
        let how = how(agent, status);
        self.died.send_replace(Some(how.clone()));
        let reason = format!("{} exited by itself: {how}", A::WHAT);
        warn!(agent = %self.name, %reason, "agent ended");
        reason
    }
}

/// How an agent's process ended, saying so when the memory limit killed
/// some of the run.
fn how<A: Agent>(agent: &A, status: io::Result<ExitStatus>) -> String {
    let status = agent.describe(status);
    match agent.oom_kills() {
        Some(kills) if kills > 0 => format!(
            "{status}; it ran out of memory: the kernel killed {kills} of its processes at the \
             run's memory limit"
        ),
        _ => status,
    }
}

/// An exit status in words.
pub fn describe(status: io::Result<ExitStatus>) -> String {
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

/// A supervised agent that serves, as the server sees it: its proxy's URL,
/// its end, its stop; and `T`, what its runtime says of it.
#[derive(Debug)]
pub struct Supervised<T> {
    name: Arc<str>,
    what: &'static str,
    url: String,
    /// The proxy's paths in process: the server's way to it.
    local: LocalProxy,
    grace: Duration,
    stop: CancellationToken,
    supervisor: Option<JoinHandle<()>>,
    /// Its proxy's task, which ends once the agent is stopped.
    proxy: Option<JoinHandle<()>>,
    logs: Vec<JoinHandle<()>>,
    exited: watch::Receiver<Option<String>>,
    runtime: T,
    /// The file that holds its disk, if its runtime made one.
    disk_file: Option<std::path::PathBuf>,
}

impl<T> Supervised<T> {
    /// What its runtime says of it.
    pub fn runtime(&self) -> &T {
        &self.runtime
    }

    /// The same agent, whose disk is the file `file` (see
    /// [`Container::disk_file`]).
    pub fn with_disk_file(mut self, file: std::path::PathBuf) -> Self {
        self.disk_file = Some(file);
        self
    }

    /// Stops the agent (its stop signal, the grace, then a kill of every
    /// process of the run), waits until all it held is released and its
    /// proxy is down, and says how it ended.
    pub async fn terminate(mut self) -> String {
        self.stop.cancel();
        if let Some(supervisor) = self.supervisor.take()
            && let Err(error) = supervisor.await
        {
            warn!(agent = %self.name, %error, "the supervisor task failed");
        }
        if let Some(proxy) = self.proxy.take() {
            let _ = proxy.await;
        }
        // The pipes end with the run's processes; a descendant that left
        // the run (no cgroups) may hold them open, so its output is not
        // waited for past the grace.
        for mut log in std::mem::take(&mut self.logs) {
            if tokio::time::timeout(self.grace, &mut log).await.is_err() {
                log.abort();
            }
        }
        let reason = self
            .exited
            .borrow()
            .clone()
            .unwrap_or_else(|| format!("{}'s supervisor ended without a word", self.what));
        info!(agent = %self.name, %reason, "container stopped");
        reason
    }
}

/// A runtime's start of a supervised agent, boxed as [`Runtime::start`]
/// returns it.
///
/// [`Runtime::start`]: super::Runtime::start
pub fn boxed<'a, T: Send + std::fmt::Debug + 'static>(
    start: impl Future<Output = Result<Supervised<T>, StartError>> + Send + 'a,
) -> BoxFuture<'a, Result<Box<dyn Container>, StartError>> {
    Box::pin(async move {
        let container: Box<dyn Container> = Box::new(start.await?);
        Ok(container)
    })
}

impl<T: Send + std::fmt::Debug + 'static> Container for Supervised<T> {
    fn proxy_url(&self) -> &str {
        &self.url
    }

    fn local_proxy(&self) -> Option<LocalProxy> {
        Some(self.local.clone())
    }

    fn ended(&mut self) -> BoxFuture<'_, String> {
        Box::pin(async move {
            match self.exited.wait_for(Option::is_some).await {
                Ok(reason) => reason.clone().unwrap_or_default(),
                Err(_) => format!("{}'s supervisor is gone", self.what),
            }
        })
    }

    fn stop(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            (*self).terminate().await;
        })
    }

    fn disk_file(&self) -> Option<&std::path::Path> {
        self.disk_file.as_deref()
    }
}

impl<T> Drop for Supervised<T> {
    /// Dropped without `stop`, the agent still ends: its supervisor stops
    /// it and releases what it held, its proxy shuts down.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// An agent of a test's own: a shell, ready or never, released into a
    /// flag.
    struct Fake {
        pid: u32,
        ready: bool,
        released: Arc<AtomicBool>,
    }

    impl Fake {
        fn signal(&self, signal: libc::c_int) {
            // SAFETY: a system call on integers, to the test's own child.
            unsafe {
                libc::kill(self.pid as libc::pid_t, signal);
            }
        }
    }

    impl Agent for Fake {
        const WHAT: &'static str = "the fake";

        async fn probe(&self) -> Result<bool, NotReady> {
            Ok(self.ready)
        }

        fn oom_kills(&self) -> Option<u64> {
            None
        }

        async fn signal_stop(&self) {
            self.signal(libc::SIGTERM);
        }

        async fn kill(&self) {
            self.signal(libc::SIGKILL);
        }

        async fn release(self) {
            self.released.store(true, Ordering::SeqCst);
        }
    }

    /// `sh -c script` under a supervisor, and its agent.
    fn shell(script: &str, ready: bool) -> (Supervisor, Fake) {
        let child = tokio::process::Command::new("sh")
            .args(["-c", script])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("sh starts");
        let fake = Fake {
            pid: child.id().expect("a pid"),
            ready,
            released: Arc::default(),
        };
        let supervisor = Supervisor::new(
            child,
            Arc::from("sh"),
            OutputLimit::default(),
            None,
            CancellationToken::new(),
            Duration::from_secs(5),
        );
        (supervisor, fake)
    }

    /// `sh -c script`, ready at once and serving (its proxy's agent is a
    /// loopback address nothing listens on), and the flag of its release.
    async fn serving(script: &str) -> (Supervised<()>, Arc<AtomicBool>) {
        let (mut supervisor, fake) = shell(script, true);
        let released = Arc::clone(&fake.released);
        supervisor
            .listening(&fake, 9, Duration::from_secs(30))
            .await
            .expect("ready");
        let nowhere = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|listener| listener.local_addr())
            .expect("an address");
        let container = supervisor.serve(fake, nowhere, ()).await.expect("serves");
        (container, released)
    }

    #[tokio::test]
    async fn a_start_that_is_late_or_exits_first_says_so_in_one_message_each() {
        let (mut supervisor, fake) = shell("exec sleep 30", false);
        let late = supervisor
            .listening(&fake, 9, Duration::from_millis(50))
            .await;
        assert_eq!(
            late,
            Err(NotReady::Failed(
                "the agent program did not listen on 127.0.0.1:9 within 0.05 s: it must listen \
                 on 127.0.0.1:$PORT (here 9)"
                    .to_owned()
            ))
        );
        let released = Arc::clone(&fake.released);
        supervisor.give_up(fake).await;
        assert!(released.load(Ordering::SeqCst), "given up, it is released");

        let (mut supervisor, fake) = shell("exit 3", false);
        let exited = supervisor
            .listening(&fake, 9, Duration::from_secs(30))
            .await;
        assert_eq!(
            exited,
            Err(NotReady::Exited(
                "the agent program exited before it listened on 127.0.0.1:9: exit status 3 \
                 (its output is in the server's log)"
                    .to_owned()
            ))
        );
        supervisor.give_up(fake).await;
    }

    #[tokio::test]
    async fn an_end_by_itself_is_said_at_once_then_the_run_is_released() {
        let (mut container, released) = serving("exit 3").await;
        assert!(container.proxy_url().starts_with("ws://127.0.0.1:"));
        let reason = container.ended().await;
        assert_eq!(reason, "the fake exited by itself: exit status 3");
        assert_eq!(container.terminate().await, reason);
        assert!(released.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_stop_signals_and_says_how_it_ended() {
        let (container, released) = serving("exec sleep 30").await;
        assert_eq!(
            container.terminate().await,
            "the fake was stopped: killed by signal 15"
        );
        assert!(released.load(Ordering::SeqCst));
    }

    #[test]
    fn a_status_reads_as_its_code_or_its_signal() {
        assert_eq!(describe(Ok(ExitStatus::from_raw(3 << 8))), "exit status 3");
        assert_eq!(describe(Ok(ExitStatus::from_raw(9))), "killed by signal 9");
        assert_eq!(
            describe(Err(io::Error::other("gone"))),
            "its status could not be read: gone"
        );
    }
}
