//! The exec runtime: an agent program started as a child process, with a
//! proxy of this crate beside it in the server's process (protocol §12).
//!
//! ```text
//! server ──in process──▶ proxy (task; also ws on 127.0.0.1:P1) ──HTTP, a socket made in the run's netns──▶ child process ($PORT = 8080, own cgroup)
//!                                                     stdout/stderr ──lines, budgeted──▶ tracing
//! ```
//!
//! The life of a child, and why each step is there:
//!
//! 1. **Refusals.** A host process can write wherever its user may, so no
//!    `disk` can be held: unless the operator accepted that
//!    ([`DiskPolicy::Unenforced`]), every run is refused with a reason.
//! 2. **Start.** The run gets a network namespace of its own with nothing
//!    in it but loopback ([`ExecNetwork::Own`], protocol §10; made while
//!    its cgroup is), and the program `$PORT` 8080 there. The child joins
//!    the run's cgroup before it execs ([`Confinement`]; memory, swap held
//!    to it, pids), or where there are no cgroups gets the memory limit as
//!    `RLIMIT_DATA`; then the run's namespace. It gets its own process
//!    group and `PR_SET_PDEATHSIG` = `SIGKILL` (it dies with the server
//!    even if the server is killed outright). stdin is closed; stdout and
//!    stderr go to the server's log within a budget
//!    ([`output`](super::output)). On the host's network
//!    ([`ExecNetwork::Host`], the operator's opt-in, or where no namespace
//!    can be made) a loopback port is leased instead (module `port`).
//! 3. **Ready.** Once something listens on `$PORT` where `127.0.0.1`
//!    reaches it — the kernel's socket diagnostics are asked, every
//!    millisecond, in the run's namespace ([`netns::Diag`]) — the run is
//!    ready: in its own namespace only the run can listen. On the host's
//!    network every socket listening there must also be the run's own (its
//!    inode among the run's processes' descriptors); a port someone else
//!    listens on is given up: the child is killed and the start tried
//!    again on another port (a few times). If the program exits first,
//!    the start fails with its exit status; if it neither listens nor
//!    exits within the startup timeout, it is killed and the start fails.
//! 4. **Running.** The proxy reaches the program by a socket made in the
//!    run's namespace for each call ([`netns::Dialer`]): no port of the
//!    host leads into the namespace. A supervisor task owns the child. If
//!    the child exits by itself, [`Container::ended`] resolves with its
//!    status (and says so when the memory limit killed it), the proxy's
//!    loop in progress ends with an error in the same words, and every
//!    process left in its cgroup (or group) is killed.
//! 5. **Stop.** `SIGTERM` to every process of the run, a grace period,
//!    then `SIGKILL` to all of them (a cgroup's processes cannot escape
//!    it, whatever they do with sessions); the child is reaped and the
//!    cgroup removed before `stop` resolves. A container dropped without
//!    `stop` still ends its child (the supervisor sees the drop), and if
//!    the supervisor itself is dropped (the runtime shuts down) its guard
//!    kills the run's processes.
//!
//! Steps 3 to 5 are the supervised agent's ([`supervised`]),
//! the same under every runtime; this runtime says how its program is
//! reached, signalled and released ([`Agent`]).
//!
//! # Why `RLIMIT_DATA` where there are no cgroups
//!
//! `RLIMIT_AS` caps the whole virtual address space, and runtimes reserve
//! far more address space than they use: thread stacks, Go and JVM heaps,
//! V8's cage, glibc's per-thread malloc arenas (64 MiB each). An agent
//! program using 100 MiB can need gigabytes of address space, so a limit
//! on it refuses programs that are well within their memory. Since Linux
//! 4.7, `RLIMIT_DATA` counts the private writable mappings: the memory a
//! program asked to use, not what it merely reserved. It counts neither
//! shared mappings nor children; only a cgroup does, which is why cgroups
//! come first and the server says at startup when it has none.
//!
//! # What is not covered
//!
//! A server killed outright leaves its runs' descendants running (held by
//! their cgroups) until the next server starts and removes them
//! ([`Confinement`]). On the host's network, a program that stops
//! listening after its start frees its port, and a process that is not a
//! run of this server could take it: the proxy would then reach that
//! process (in a namespace of its own, nothing else can be there). Without
//! cgroups, a descendant that leaves the process group outlives the run.

mod confine;
mod lookup;
mod port;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::process::Command;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use confine::{Confinement, PARENT};

use super::cgroup::{Bounds, Cgroup, Joiner, TenantHold, Tenants};
use super::netns::{self, Diag, Netns};
use super::output::OutputLimit;
use super::steps::Steps;
use super::supervised::{self, Agent, NotReady, Supervised, Supervisor};
use super::{BoxFuture, Container, ContainerLimits, Runtime, StartError};
use port::{Lease, Listener};

/// The agent program's port in a namespace of its own (protocol §10's
/// default): nothing else is there to take it.
pub const OWN_PORT: u16 = 8080;

/// Ports tried before a start gives up on finding one nobody else takes.
const PORT_ATTEMPTS: usize = 4;

/// What the exec runtime does with a run's `disk`, which it cannot hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DiskPolicy {
    /// Refuse every run that asks for disk, saying why (the default); a
    /// run with `disk` 0 asks nothing that needs holding and goes ahead.
    #[default]
    Refuse,
    /// Run anyway: the operator accepted that `disk` is not enforced.
    Unenforced,
}

/// Where an exec run's agent program listens, and what it reaches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ExecNetwork {
    /// A network namespace of the run's own with loopback only (the
    /// default, protocol §10): the agent listens on `127.0.0.1:8080` there,
    /// the server dials it through sockets made inside, and it reaches no
    /// other run, no service of the host and no other machine. Needs root;
    /// elsewhere runs go on the host's network, and the server says so at
    /// startup ([`network_shortfall`]).
    #[default]
    Own,
    /// The host's network (`runloop serve --exec-network host`): the agent
    /// listens on a leased port of the host's loopback and reaches
    /// whatever the server's user reaches, the internet (model APIs) and
    /// the host's own services included. The operator's opt-in.
    Host,
}

/// Why exec runs cannot have namespaces of their own on this host, in
/// words for the operator; `None` when they can. Found once (a namespace
/// is made and let go).
pub fn network_shortfall() -> Option<&'static str> {
    static SHORTFALL: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    SHORTFALL
        .get_or_init(|| {
            // A thread of its own, which ends with the namespace it made.
            let made = std::thread::spawn(|| {
                // SAFETY: unshare on this thread only (CLONE_NEWNET is per thread).
                if unsafe { libc::unshare(libc::CLONE_NEWNET) } == -1 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the probe thread panicked")));
            made.err().map(|error| {
                format!(
                    "exec runs go on the host's network: a network namespace cannot be made \
                     ({error}; it needs root); each run's port is leased and checked to be its \
                     own, and its agent program reaches what the server's user reaches"
                )
            })
        })
        .as_deref()
}

/// How the exec runtime starts, holds and stops its children; the same
/// for every program a server runs this way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecConfig {
    /// How long a stopped child has between `SIGTERM` and `SIGKILL`.
    pub grace: Duration,
    /// How long the program has to accept TCP on its port.
    pub startup_timeout: Duration,
    /// What to do with a run's `disk`.
    pub disk: DiskPolicy,
    /// Processes (and threads) one run may have at once, where there are
    /// cgroups.
    pub pids: u32,
    /// How much of a run's output is logged.
    pub output: OutputLimit,
    /// How children are held: `None` for [`Confinement::host`].
    pub confinement: Option<Confinement>,
    /// Where the agent program listens, and what it reaches.
    pub network: ExecNetwork,
}

impl Default for ExecConfig {
    /// A 5 s grace after `SIGTERM`, 60 s for the program to listen, runs
    /// with a `disk` refused, 1024 processes per run, the default output
    /// budget, the host's confinement, and a network namespace per run.
    fn default() -> ExecConfig {
        ExecConfig {
            grace: Duration::from_secs(5),
            startup_timeout: Duration::from_secs(60),
            disk: DiskPolicy::Refuse,
            pids: 1024,
            output: OutputLimit::default(),
            confinement: None,
            network: ExecNetwork::Own,
        }
    }
}

/// A runtime that runs one program, with arguments, per container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exec {
    program: String,
    args: Vec<String>,
    config: ExecConfig,
}

impl Exec {
    /// Runs `program` with `args`, configured as [`ExecConfig::default`].
    pub fn new(
        program: impl Into<String>,
        args: impl IntoIterator<Item = impl Into<String>>,
    ) -> Exec {
        Exec {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            config: ExecConfig::default(),
        }
    }

    /// Configured as `config`.
    pub fn with_config(mut self, config: ExecConfig) -> Exec {
        self.config = config;
        self
    }

    /// How long a stopped child has between `SIGTERM` and `SIGKILL`.
    pub fn with_grace(mut self, grace: Duration) -> Exec {
        self.config.grace = grace;
        self
    }

    /// How long the program has to accept TCP on its port.
    pub fn with_startup_timeout(mut self, timeout: Duration) -> Exec {
        self.config.startup_timeout = timeout;
        self
    }

    /// What to do with a run's `disk`.
    pub fn with_disk(mut self, disk: DiskPolicy) -> Exec {
        self.config.disk = disk;
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

    /// Its configuration.
    pub fn config(&self) -> &ExecConfig {
        &self.config
    }

    fn confinement(&self) -> &Confinement {
        self.config
            .confinement
            .as_ref()
            .unwrap_or_else(|| Confinement::host())
    }

    /// Starts one child and its proxy; resolves once both accept
    /// connections. [`Runtime::start`] is this, boxed.
    pub async fn spawn(&self, limits: ContainerLimits) -> Result<ExecContainer, StartError> {
        if self.config.disk == DiskPolicy::Refuse && limits.disk > 0 {
            return Err(StartError::new(format!(
                "disk {} bytes cannot be held for an exec agent program (a host process writes \
                 wherever its user may); this server refuses exec runs that ask for disk until its \
                 operator accepts that (runloop serve --exec-disk unenforced); disk 0 goes ahead",
                limits.disk
            )));
        }
        let mut taken = Vec::new();
        for _ in 0..PORT_ATTEMPTS {
            match self.attempt(&limits).await {
                Ok(container) => return Ok(container),
                Err(Failed::PortTaken(port)) => {
                    warn!(program = %self.program, port, "another process listens on the agent program's port; trying another");
                    taken.push(port.to_string());
                }
                Err(Failed::Start(why)) => return Err(StartError::new(why)),
            }
        }
        Err(StartError::new(format!(
            "the agent program's port was taken by another process {PORT_ATTEMPTS} times in a row \
             (ports {})",
            taken.join(", ")
        )))
    }

    /// One try at a start: in a namespace of the run's own, or on one port
    /// of the host's.
    async fn attempt(&self, limits: &ContainerLimits) -> Result<ExecContainer, Failed> {
        let mut steps = Steps::start();
        let own = self.config.network == ExecNetwork::Own && network_shortfall().is_none();
        // The namespace is made on its thread while the cgroup is made here.
        let (reach, held) = if own {
            let (netns, held) = tokio::join!(
                async {
                    let netns = Netns::create().await?;
                    let diag = netns.diag().await?;
                    Ok::<_, io::Error>((netns, diag))
                },
                async { self.hold(limits) }
            );
            let reach = netns.map_err(|error| {
                Failed::Start(format!("cannot make the run's network namespace: {error}"))
            });
            match (reach, held) {
                (Ok((netns, diag)), Ok(held)) => (Reach::Own { netns, diag }, held),
                (Err(failed), Ok((Some(cgroup), _, _))) => {
                    let _ = cgroup.remove();
                    return Err(failed);
                }
                (Err(failed), _) | (_, Err(failed)) => return Err(failed),
            }
        } else {
            let lease = Lease::take().map_err(|error| {
                Failed::Start(format!(
                    "cannot find a free port for the agent program: {error}"
                ))
            })?;
            let diag = Diag::here().map_err(|error| {
                Failed::Start(format!(
                    "cannot ask the kernel who listens on a port: {error}"
                ))
            })?;
            (Reach::Host { lease, diag }, self.hold(limits)?)
        };
        let (cgroup, tenant, setup) = held;
        steps.mark(if own { "cgroup+netns" } else { "cgroup" });
        let port = reach.port();
        let spawned = self.command(port, setup, reach.netns()).spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(error) => {
                if let Some(cgroup) = cgroup {
                    let _ = cgroup.remove();
                }
                drop(tenant);
                return Err(Failed::Start(format!(
                    "cannot start the agent program {:?}: {error}",
                    self.program
                )));
            }
        };
        steps.mark("spawn");
        // `id` is `None` only once the child has been reaped; it was just spawned.
        let pid = child.id().unwrap_or_default();
        // A start given up on (its future dropped) still ends the run.
        let program = Program {
            guard: Guard {
                hold: match cgroup {
                    Some(cgroup) => Hold::Cgroup(cgroup),
                    None => Hold::Group(pid),
                },
                armed: true,
                tenant,
            },
            reach,
        };
        let name: Arc<str> = Arc::from(self.program.as_str());
        info!(program = %name, pid, port, own_network = own, memory = limits.memory, cgroup = program.guard.hold.cgroup().map(Cgroup::path), "agent program started");
        let mut supervisor = Supervisor::new(
            child,
            Arc::clone(&name),
            self.config.output,
            limits.tenant.log(),
            CancellationToken::new(),
            self.config.grace,
        );
        let listened = supervisor
            .listening(&program, port, self.config.startup_timeout)
            .await;
        if let Err(not_ready) = listened {
            let failed = match not_ready {
                NotReady::Taken => Failed::PortTaken(port),
                // A program that could not bind exits: was it beaten to its port?
                NotReady::Exited(_) if program.listener().await == Listener::Other => {
                    Failed::PortTaken(port)
                }
                not_ready => {
                    let why = not_ready.words();
                    warn!(program = %name, pid, %why, "agent program did not start");
                    Failed::Start(why)
                }
            };
            supervisor.give_up(program).await;
            return Err(failed);
        }
        steps.mark("ready");
        let process = ExecProcess {
            pid,
            cgroup: program.guard.hold.cgroup().cloned(),
        };
        // The proxy dials the agent program through sockets made in the
        // run's namespace, or at its leased port on the host's loopback.
        let dialer = match &program.reach {
            Reach::Own { netns, .. } => Some(netns.dialer(port)),
            Reach::Host { .. } => None,
        };
        let served = match dialer {
            Some(dialer) => supervisor.serve(program, dialer, process).await,
            None => {
                let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                supervisor.serve(program, address, process).await
            }
        };
        let container = served.map_err(Failed::Start)?;
        steps.mark("proxy");
        info!(program = %name, pid, url = container.proxy_url(), "exec container ready");
        debug!(program = %name, pid, %steps, "start steps");
        Ok(container)
    }

    /// The run's cgroup, made below its tenant's (whose weight it shares
    /// with the tenant's other runs), and what the child does to join it;
    /// or, without cgroups, the memory limit for `RLIMIT_DATA`.
    fn hold(
        &self,
        limits: &ContainerLimits,
    ) -> Result<(Option<Cgroup>, Option<TenantHold>, Setup), Failed> {
        let Confinement::Cgroups(own) = self.confinement() else {
            return Ok((None, None, Setup::Data(limits.memory)));
        };
        // The host's confinement puts runs below their tenant's cgroup; one
        // given by hand (tests) below its own.
        let tenant = match self.config.confinement {
            Some(_) => None,
            None => match Tenants::of_host() {
                Some(tenants) => Some(
                    tenants
                        .hold(&limits.tenant.name, limits.tenant.cpu_weight)
                        .map_err(|error| {
                            Failed::Start(format!(
                                "cannot make the cgroup of tenant {}: {error}",
                                limits.tenant.name
                            ))
                        })?,
                ),
                None => None,
            },
        };
        let parent = tenant.as_ref().map_or(own, TenantHold::cgroup);
        let name = random_name().map_err(Failed::Start)?;
        let cgroup = parent.child(&name);
        let bounds = Bounds {
            memory: limits.memory,
            pids: self.config.pids,
        };
        match cgroup.create(Some(bounds)).and_then(|()| cgroup.joiner()) {
            Ok(joiner) => Ok((Some(cgroup), tenant, Setup::Join(Arc::new(joiner)))),
            Err(error) => {
                let _ = cgroup.remove();
                Err(Failed::Start(format!(
                    "cannot make the run's cgroup {}: {error}",
                    cgroup.path()
                )))
            }
        }
    }

    fn command(&self, port: u16, setup: Setup, netns: Option<RawFd>) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .env("PORT", port.to_string())
            // The server's own credential, when it came from there.
            .env_remove("RUNLOOP_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        let parent = std::process::id();
        // SAFETY: `child_setup` runs between fork and exec and only makes
        // system calls (write, setns, prctl, getppid, getrlimit,
        // setrlimit); it does not allocate, lock or touch memory shared
        // with other threads. `netns` stays open in the parent until the
        // spawn has returned (the run holds it).
        unsafe {
            command.pre_exec(move || child_setup(parent, &setup, netns));
        }
        command
    }
}

impl Runtime for Exec {
    fn start(
        &self,
        limits: ContainerLimits,
    ) -> BoxFuture<'_, Result<Box<dyn Container>, StartError>> {
        supervised::boxed(self.spawn(limits))
    }

    /// A program that cannot start first (every run fails), then a disk
    /// that will be refused.
    fn caveat(&self) -> Option<String> {
        let missing = lookup::missing(&self.program, &self.args)
            .map(|why| format!("every run will fail: {why}"));
        let disk = (self.config.disk == DiskPolicy::Refuse).then_some(
            "every run that asks for disk will be refused, since nothing holds an exec \
             program's writes (runloop serve --exec-disk refuse, the default); only runs with \
             disk 0 go ahead. Accept unenforced disk with --exec-disk unenforced, or serve the \
             agent as an oci: image",
        );
        match (missing, disk) {
            (Some(missing), Some(disk)) => Some(format!("{missing}; and {disk}")),
            (missing, disk) => missing.or(disk.map(str::to_owned)),
        }
    }
}

/// Why one try at a start failed.
#[derive(Debug)]
enum Failed {
    /// Another process listens on the port: try another.
    PortTaken(u16),
    /// The start failed, and why.
    Start(String),
}

/// A random name for a run's cgroup.
fn random_name() -> Result<String, String> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes)
        .map_err(|error| format!("no randomness for a cgroup name: {error}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// What the child does before exec.
enum Setup {
    /// Join the run's cgroup.
    Join(Arc<Joiner>),
    /// Take this memory limit as `RLIMIT_DATA`.
    Data(u64),
}

/// In the child, before exec: the run's cgroup or memory limit, its
/// network namespace, and die with the server.
fn child_setup(parent: u32, setup: &Setup, netns: Option<RawFd>) -> io::Result<()> {
    if let Setup::Join(joiner) = setup {
        joiner.join()?;
    }
    if let Some(netns) = netns {
        // SAFETY: setns on a descriptor the parent holds open for the spawn.
        if unsafe { libc::setns(netns, libc::CLONE_NEWNET) } == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: plain system calls on integers and a local struct.
    unsafe {
        die_with_parent()?;
        // The server may have died before the death signal was armed.
        if libc::getppid() as u32 != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        if let Setup::Data(memory) = *setup {
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
    }
    Ok(())
}

/// Has the kernel kill this process (SIGKILL) when its parent, the
/// server, dies, however it dies: `prctl(PR_SET_PDEATHSIG)` on Linux,
/// `procctl(PROC_PDEATHSIG_CTL)` on FreeBSD.
///
/// # Safety
///
/// Async-signal-safe: one system call, no allocation.
#[cfg(target_os = "linux")]
unsafe fn die_with_parent() -> io::Result<()> {
    // SAFETY: a plain system call on integers.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// See the Linux version.
///
/// # Safety
///
/// Async-signal-safe: one system call, no allocation.
#[cfg(target_os = "freebsd")]
unsafe fn die_with_parent() -> io::Result<()> {
    let mut signal: libc::c_int = libc::SIGKILL;
    // SAFETY: `signal` outlives the call, which only reads it.
    let done = unsafe {
        libc::procctl(
            libc::P_PID,
            0,
            libc::PROC_PDEATHSIG_CTL,
            (&raw mut signal).cast::<libc::c_void>(),
        )
    };
    if done == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Other Unix systems have no death signal: a server that is killed (not
/// one that exits, which ends its runs' process groups) leaves its exec
/// programs running until they exit, or are killed by hand.
///
/// # Safety
///
/// Does nothing.
#[cfg(not(any(target_os = "linux", target_os = "freebsd")))]
unsafe fn die_with_parent() -> io::Result<()> {
    Ok(())
}

/// What holds a run's processes together.
#[derive(Debug, Clone)]
enum Hold {
    /// Its own cgroup.
    Cgroup(Cgroup),
    /// The child's process group, by its id (no cgroups).
    Group(u32),
}

impl Hold {
    fn cgroup(&self) -> Option<&Cgroup> {
        match self {
            Hold::Cgroup(cgroup) => Some(cgroup),
            Hold::Group(_) => None,
        }
    }

    /// Sends `signal` to every process of the run.
    fn signal(&self, signal: libc::c_int) {
        match self {
            Hold::Cgroup(cgroup) => {
                cgroup.signal(signal);
            }
            Hold::Group(pgid) => signal_group(*pgid, signal),
        }
    }

    /// Kills every process of the run and removes its cgroup (blocking,
    /// for a moment at most).
    fn end_now(&self) {
        match self {
            Hold::Cgroup(cgroup) => {
                if let Err(error) = cgroup.remove() {
                    let left = cgroup.procs().len();
                    warn!(cgroup = cgroup.path(), left, %error, "cannot remove the run's cgroup");
                }
            }
            Hold::Group(pgid) => signal_group(*pgid, libc::SIGKILL),
        }
    }

    /// Kills every process of the run and removes its cgroup.
    async fn end(&self) {
        let hold = self.clone();
        let _ = tokio::task::spawn_blocking(move || hold.end_now()).await;
    }
}

/// Sends `signal` to the process group `pgid`.
fn signal_group(pgid: u32, signal: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
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

/// A run whose processes are killed (and cgroup removed) when this guard
/// is dropped armed; its hold on its tenant's cgroup goes after that.
struct Guard {
    hold: Hold,
    armed: bool,
    /// Held, never read: dropped after the run's cgroup is gone, it
    /// removes the tenant's once no other run holds it.
    #[allow(dead_code)]
    tenant: Option<TenantHold>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.armed {
            self.hold.end_now();
        }
    }
}

/// How a run's agent program is reached, and asked whether it listens.
enum Reach {
    /// In the run's own namespace, on [`OWN_PORT`].
    Own {
        /// The namespace.
        netns: Netns,
        /// Its socket diagnostics.
        diag: Diag,
    },
    /// On the host's network, on a leased port.
    Host {
        /// The port, leased for the run's life.
        lease: Lease,
        /// The host's socket diagnostics.
        diag: Diag,
    },
}

impl Reach {
    fn port(&self) -> u16 {
        match self {
            Reach::Own { .. } => OWN_PORT,
            Reach::Host { lease, .. } => lease.port(),
        }
    }

    /// The namespace the child joins, if it has its own.
    fn netns(&self) -> Option<RawFd> {
        match self {
            Reach::Own { netns, .. } => Some(netns.fd().as_raw_fd()),
            Reach::Host { .. } => None,
        }
    }
}

/// The exec runtime's side of a supervised agent program: its processes,
/// held by the run's cgroup or process group, and how it is reached.
struct Program {
    guard: Guard,
    reach: Reach,
}

impl Program {
    /// Who listens on the agent program's port, as far as this run is
    /// concerned: in its own namespace, only the run can.
    async fn listener(&self) -> Listener {
        match &self.reach {
            Reach::Own { diag, .. } => match diag.listening(OWN_PORT) {
                Ok(found) if found.iter().any(netns::Listening::reached_from_loopback) => {
                    Listener::Run
                }
                _ => Listener::Nobody,
            },
            Reach::Host { lease, diag } => {
                let found = match diag.listening(lease.port()) {
                    Ok(found) => found,
                    Err(error) => {
                        warn!(%error, "cannot ask the kernel who listens on the agent program's port");
                        return Listener::Nobody;
                    }
                };
                let inodes: Vec<u32> = found
                    .iter()
                    .filter(|listening| listening.reached_from_loopback())
                    .map(|listening| listening.inode)
                    .collect();
                if inodes.is_empty() {
                    return Listener::Nobody;
                }
                let hold = self.guard.hold.clone();
                tokio::task::spawn_blocking(move || port::owner(&inodes, &hold))
                    .await
                    .unwrap_or(Listener::Nobody)
            }
        }
    }
}

impl Agent for Program {
    const WHAT: &'static str = "the agent program";

    /// Something listening on the port where `127.0.0.1` reaches it, as
    /// the kernel's socket diagnostics say (a question, not a connection,
    /// while nothing listens); on the host's network, every such socket
    /// the run's own; then one connection, which it must accept.
    async fn probe(&self) -> Result<bool, NotReady> {
        match self.listener().await {
            Listener::Run => {}
            Listener::Other => return Err(NotReady::Taken),
            // Not yet (or no longer); wait and see.
            Listener::Nobody => return Ok(false),
        }
        let connected = match &self.reach {
            Reach::Own { netns, .. } => netns.connect(OWN_PORT).await,
            Reach::Host { lease, .. } => {
                tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, lease.port())).await
            }
        };
        Ok(connected.is_ok())
    }

    fn oom_kills(&self) -> Option<u64> {
        self.guard.hold.cgroup().and_then(Cgroup::oom_kills)
    }

    async fn signal_stop(&self) {
        self.guard.hold.signal(libc::SIGTERM);
    }

    async fn kill(&self) {
        self.guard.hold.signal(libc::SIGKILL);
    }

    /// Whatever the program left behind goes with it, then its port or
    /// its namespace.
    async fn release(mut self) {
        self.guard.hold.end().await;
        self.guard.armed = false;
    }
}

/// What the exec runtime says of a container: its child's pid and its
/// cgroup.
#[derive(Debug)]
pub struct ExecProcess {
    pid: u32,
    cgroup: Option<Cgroup>,
}

/// One exec container: the child, its proxy, and the tasks that watch
/// them ([`Supervised`]).
pub type ExecContainer = Supervised<ExecProcess>;

impl Supervised<ExecProcess> {
    /// The child's process id (and process group id).
    pub fn pid(&self) -> u32 {
        self.runtime().pid
    }

    /// The run's cgroup, where there are cgroups.
    pub fn cgroup(&self) -> Option<&Cgroup> {
        self.runtime().cgroup.as_ref()
    }
}
