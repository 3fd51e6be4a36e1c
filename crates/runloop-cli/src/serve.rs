//! `runloop serve`: the provider server, with its catalog of agents.
//!
//! Without a token the server accepts any credential, which is only safe
//! where nobody else can connect: it then refuses to listen anywhere but a
//! loopback address. Beyond loopback it also wants TLS (`--tls-cert`,
//! `--tls-key`), or to be told that something in front adds it
//! (`--allow-plaintext`): tokens and loops would otherwise cross the
//! network in the clear. Tokens come from `--token-file` or
//! `RUNLOOP_TOKEN`; `--token` works but is warned about ([`crate::token`]).
//! At startup the server raises its descriptor limit and refuses limits
//! that do not fit in it ([`crate::descriptors`]), and with `exec:` entries
//! it says how their programs are held (a cgroup each, or what is not
//! enforced without one). It prints its `ws://` or `wss://` URL on stdout
//! once it listens (so a script can start it on port 0 and read where it
//! went), then, with `--admin`, the admin listener's `http://` URL; logs to
//! stderr, as text or JSON lines (`--log-format`).
//!
//! On Ctrl-C or SIGTERM it drains: it stops accepting (a load balancer's
//! next connection goes to another server), `/readyz` answers 503, and the
//! connections it has are served until they end, for `--drain-timeout` at
//! most. Then, or on a second signal, it shuts down: every run ends (loops
//! end with the server's error, containers stop, scopes finish) and every
//! connection closes. SIGHUP reloads the TLS certificate and key.

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use runloop::admin::{self, Watched};
use runloop::limits::{Limit, Limits};
use runloop::runtime::output::OutputLimit;
use runloop::runtime::{AgentSpec, Catalog, Confinement, DiskPolicy, ExecConfig, RuntimeSpec};
use runloop::server::{
    Admission, Credentials, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_RUNS, RunBudget, Server,
    ServerConfig, ServerHandle, default_memory_budget,
};
use runloop::tls::ServerTls;
use runloop_oci::network::{DEFAULT_SUBNET, Subnet};
use runloop_oci::registry::{Pull, RegistryConfig};
use runloop_oci::{Host, HostConfig};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::descriptors::{self, Holds, Load};
use crate::exit::{Exit, Failure};
use crate::process::{LogArgs, block_on, init_logs_as, shutdown_signal};
use crate::token;

/// Arguments of `runloop serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1:7878")]
    pub listen: SocketAddr,
    /// A credential to accept (repeatable). Every local user can read it in
    /// /proc/PID/cmdline: prefer --token-file or RUNLOOP_TOKEN. Without any
    /// token, any credential is accepted, and only on a loopback address.
    #[arg(long = "token", value_name = "TOKEN")]
    pub tokens: Vec<String>,
    /// A file of credentials to accept, one per line (repeatable); the way
    /// to pass tokens, with the RUNLOOP_TOKEN environment variable (one
    /// token).
    #[arg(long = "token-file", value_name = "FILE")]
    pub token_files: Vec<PathBuf>,
    /// An image the server runs (repeatable):
    /// `NAME[@DIGEST]=builtin:demo | exec:PROGRAM [ARGS…] | proxy:ws://HOST:PORT | oci:DIR`.
    /// A DIGEST pins the image; without one any well-formed digest is accepted,
    /// except for `oci:DIR` (an OCI image layout, run in a container with runc),
    /// which serves only the layout's own manifest digest.
    /// Default: demo=builtin:demo.
    #[arg(long = "agent", value_name = "SPEC")]
    pub agents: Vec<AgentSpec>,
    /// The largest message a connection may send, bytes (K/M/G suffixes;
    /// at least 4K).
    #[arg(long, default_value = "16M", value_parser = bytes)]
    pub max_message_size: u64,
    /// Open scopes (runs) per connection (at least 1).
    #[arg(long, default_value_t = Limits::default().max_scopes)]
    pub max_scopes: usize,
    /// Open channels per scope (at least 1).
    #[arg(long, default_value_t = Limits::default().max_channels)]
    pub max_channels: usize,
    /// Responses one loop may have queued for a slow caller before the
    /// server stops reading its proxy (at least 1).
    #[arg(long, default_value_t = Limits::default().max_queued_responses)]
    pub max_queued_responses: usize,
    /// Bytes one loop may have queued for a slow caller before the server
    /// stops reading its proxy (K/M/G suffixes; at least 4K; a larger
    /// chunk still goes, alone).
    #[arg(long, default_value = "256K", value_parser = bytes)]
    pub max_queued_bytes: u64,
    /// Bytes all loops of one connection together may have queued for a
    /// slow caller (K/M/G suffixes; at least 4K).
    #[arg(long, default_value = "16M", value_parser = bytes)]
    pub max_connection_queued_bytes: u64,
    /// Seconds a new connection may take to authorize before it is closed
    /// (at least 1).
    #[arg(long, default_value_t = 10.0)]
    pub authorization_grace: f64,
    /// Connections served at once; one more is closed at once with close
    /// code 1013 (try again later) and a reason (at least 1).
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Connections not yet authorized, at once (those turned away with
    /// 1013 included); one more is closed at once, nothing of it read (at
    /// least 1).
    #[arg(long, default_value_t = Admission::default().max_unauthorized)]
    pub max_unauthorized: usize,
    /// Connections from one IP address, authorized or not; one more is
    /// closed at once, nothing of it read (at least 1).
    #[arg(long, default_value_t = Admission::default().max_connections_per_address)]
    pub max_connections_per_address: usize,
    /// Authorized connections of one token; one more is closed with close
    /// code 1013 and a reason (at least 1; without tokens every caller is
    /// one identity, held by --max-connections alone).
    #[arg(long, default_value_t = Admission::default().max_connections_per_identity)]
    pub max_connections_per_identity: usize,
    /// Seconds a new connection may take for its TCP connection and
    /// WebSocket handshake (at least 1).
    #[arg(long, default_value_t = Admission::default().handshake_timeout.as_secs_f64())]
    pub handshake_timeout: f64,
    /// The largest message before authorization, bytes (K/M/G suffixes; at
    /// least 4K); a larger one closes the connection, never read whole.
    #[arg(long, default_value = "64K", value_parser = bytes)]
    pub max_authorization_size: u64,
    /// Runs held at once, server-wide; one more is refused with an error
    /// naming the limit (at least 1).
    #[arg(long, default_value_t = DEFAULT_MAX_RUNS)]
    pub max_runs: usize,
    /// Runs one token may hold at once (at least 1; without tokens every
    /// caller is one identity, held by --max-runs alone).
    #[arg(long, default_value_t = RunBudget::default().max_runs_per_identity)]
    pub max_runs_per_identity: usize,
    /// Loops (run-loop channels) one token may have served at once, over
    /// all its runs; one more is answered with an error naming the limit
    /// (at least 1; without tokens every caller is one identity, held by
    /// --max-runs and --max-channels alone).
    #[arg(long, default_value_t = RunBudget::default().max_loops_per_identity)]
    pub max_loops_per_identity: usize,
    /// The largest `memory` a run may ask for, bytes (K/M/G suffixes; at
    /// least 16M).
    #[arg(long, default_value = "4G", value_parser = bytes)]
    pub max_run_memory: u64,
    /// The largest `disk` a run may ask for, bytes (K/M/G suffixes).
    #[arg(long, default_value = "16G", value_parser = bytes)]
    pub max_run_disk: u64,
    /// The most the `memory` of all runs held may add up to, bytes (K/M/G
    /// suffixes; at least 16M) [default: 3/4 of MemTotal in /proc/meminfo].
    #[arg(long, value_name = "SIZE", value_parser = bytes)]
    pub memory_budget: Option<u64>,
    /// A registry whose images are run (repeatable): `HOST[:PORT]`, as
    /// written in the references of `registry` images, pulled over HTTPS.
    /// Without any, `registry` images are refused.
    #[arg(long = "registry", value_name = "HOST[:PORT]")]
    pub registries: Vec<String>,
    /// A registry pulled from over plain HTTP (repeatable); also allowed.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    pub insecure_registries: Vec<String>,
    /// The largest registry image (manifest, configuration and compressed
    /// layers), bytes (K/M/G suffixes).
    #[arg(long, default_value = "2G", value_parser = bytes)]
    pub max_image_size: u64,
    // --- hostile registries (issue 26) ---
    /// A host (`HOST[:PORT]`) a registry may redirect blob downloads to, a
    /// blob CDN (repeatable). No other redirect is followed; a mirror named
    /// by host name is only reached at public addresses.
    #[arg(long = "registry-mirror", value_name = "HOST[:PORT]")]
    pub registry_mirrors: Vec<String>,
    /// Seconds one registry pull (manifests and blobs) may take, all told.
    #[arg(long, value_name = "SECONDS", value_parser = crate::seconds::parse, default_value = "600")]
    pub pull_timeout: Duration,
    /// Registry pulls fetching at once; more wait for a place.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_pulls: u32,
    /// A registry image may unpack to at most this many times its
    /// compressed size (--max-image-size bounds that size).
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_unpack_ratio: u64,
    /// Containers (`oci:` entries, registry images): the store of pulled
    /// blobs, unpacked images and runs [default: /var/lib/runloop for root].
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// Containers: the IPv4 network their addresses come from, a /30 each.
    #[arg(long, value_name = "CIDR", default_value_t = DEFAULT_SUBNET)]
    pub container_network: Subnet,
    /// Containers: seconds between the stop signal and SIGKILL.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    pub container_grace: f64,
    /// Containers: seconds an agent has to accept TCP on its port.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub container_startup_timeout: f64,
    /// Containers: processes one container may have at once.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub container_pids: u32,
    /// `exec:` entries: what to do with a run's `disk`, which a host process
    /// cannot be held to. `refuse`: every exec run is refused, saying so;
    /// `unenforced`: runs go ahead, and `disk` is not held.
    #[arg(long, value_name = "POLICY", value_enum, default_value_t = ExecDisk::Refuse, hide_possible_values = true)]
    pub exec_disk: ExecDisk,
    /// `exec:` entries: seconds the program has to accept TCP on $PORT.
    #[arg(long, value_name = "SECONDS", value_parser = crate::seconds::parse, default_value = "60")]
    pub startup_timeout: Duration,
    /// `exec:` entries: processes (and threads) one run may have at once
    /// (with cgroups).
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub exec_pids: u32,
    /// Lines of one run's agent output (stdout and stderr) logged per 10 s;
    /// the rest is counted in an "N lines suppressed" line.
    #[arg(long, value_name = "N", default_value_t = OutputLimit::default().lines)]
    pub agent_output_lines: u64,
    /// Bytes of one run's agent output logged per 10 s (K/M/G suffixes).
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = bytes)]
    pub agent_output_bytes: u64,
    // --- operations (issue 16): TLS, the admin listener, drain, logs ---
    /// Serve wss://: the certificate chain, PEM, leaf first. Reloaded with
    /// the key on SIGHUP.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, PEM (PKCS#8, RSA or EC).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Listen without TLS on an address that is not loopback: only where
    /// something in front (a load balancer) adds TLS.
    #[arg(long)]
    pub allow_plaintext: bool,
    /// Serve GET /metrics (Prometheus), /healthz and /readyz over HTTP on
    /// this address. Off by default.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
    /// Seconds the open connections are served after SIGTERM before the
    /// loops still running are ended with the server's error (a second
    /// signal ends them at once).
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    pub drain_timeout: f64,
    /// How log lines are written (`--log-format`).
    #[command(flatten)]
    pub logs: LogArgs,
}

/// `--exec-disk`: what the exec runtime does with a `disk` it cannot hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExecDisk {
    /// Refuse every exec run, saying why.
    Refuse,
    /// Run, with `disk` not held.
    Unenforced,
}

/// The option that sets `limit`.
fn option(limit: Limit) -> &'static str {
    match limit {
        Limit::MaxMessageSize => "--max-message-size",
        Limit::MaxScopes => "--max-scopes",
        Limit::MaxChannels => "--max-channels",
        Limit::MaxQueuedResponses => "--max-queued-responses",
        Limit::MaxQueuedBytes => "--max-queued-bytes",
        Limit::MaxConnectionQueuedBytes => "--max-connection-queued-bytes",
        Limit::MaxConnections => "--max-connections",
        Limit::AuthorizationGrace => "--authorization-grace",
        Limit::MaxRuns => "--max-runs",
        Limit::MaxRunsPerIdentity => "--max-runs-per-identity",
        Limit::MaxLoopsPerIdentity => "--max-loops-per-identity",
        Limit::MaxRunMemory => "--max-run-memory",
        Limit::MemoryBudget => "--memory-budget",
        Limit::MaxUnauthorized => "--max-unauthorized",
        Limit::MaxConnectionsPerAddress => "--max-connections-per-address",
        Limit::MaxConnectionsPerIdentity => "--max-connections-per-identity",
        Limit::HandshakeTimeout => "--handshake-timeout",
        Limit::MaxAuthorizationSize => "--max-authorization-size",
    }
}

/// A byte count with an optional K, M or G suffix.
pub fn bytes(text: &str) -> Result<u64, String> {
    runloop_bench::parse_bytes(text)
        .ok_or_else(|| format!("{text:?} is not a byte count (e.g. 512K, 16M, 1G)"))
}

impl Args {
    /// The tokens to accept: `--token`, every line of each `--token-file`,
    /// and `RUNLOOP_TOKEN`.
    fn tokens(&self) -> Result<Vec<String>, Failure> {
        let mut tokens = self.tokens.clone();
        for file in &self.token_files {
            tokens.extend(token::read_file(file)?);
        }
        tokens.extend(std::env::var(token::ENV).ok());
        tokens.retain(|t| !t.is_empty());
        Ok(tokens)
    }

    /// How `exec:` entries run.
    pub fn exec_config(&self) -> ExecConfig {
        ExecConfig {
            disk: match self.exec_disk {
                ExecDisk::Refuse => DiskPolicy::Refuse,
                ExecDisk::Unenforced => DiskPolicy::Unenforced,
            },
            pids: self.exec_pids,
            output: self.output_limit(),
            startup_timeout: self.startup_timeout,
            ..ExecConfig::default()
        }
    }

    fn output_limit(&self) -> OutputLimit {
        OutputLimit {
            lines: self.agent_output_lines,
            bytes: self.agent_output_bytes,
            ..OutputLimit::default()
        }
    }

    /// The server's configuration, or why these arguments cannot make one.
    pub fn config(&self) -> Result<ServerConfig, Failure> {
        let tokens = self.tokens()?;
        let credentials = if tokens.is_empty() {
            if !self.listen.ip().is_loopback() {
                return Err(Failure::Argument(format!(
                    "refusing to listen on {} without a token: anyone who can reach it could run \
                     agents; pass --token-file FILE or set RUNLOOP_TOKEN",
                    self.listen
                )));
            }
            Credentials::Any
        } else {
            Credentials::Tokens(tokens)
        };
        let tls = self.tls()?;
        if tls.is_none() && !self.listen.ip().is_loopback() && !self.allow_plaintext {
            return Err(Failure::Argument(format!(
                "refusing to listen on {} without TLS: tokens and loops would cross the network \
                 in the clear; pass --tls-cert and --tls-key, or --allow-plaintext if something \
                 in front (a load balancer) adds TLS",
                self.listen
            )));
        }
        let catalog = if self.agents.is_empty() {
            Catalog::demo()
        } else {
            let mut catalog = Catalog::new().with_exec(self.exec_config());
            for spec in &self.agents {
                // `oci:` entries are added once the container host is up.
                if !matches!(spec.runtime, RuntimeSpec::Oci(_)) {
                    catalog
                        .add(spec.clone())
                        .map_err(|error| Failure::Argument(error.to_string()))?;
                }
            }
            catalog
        };
        let grace = Duration::try_from_secs_f64(self.authorization_grace).map_err(|_| {
            Failure::Argument("--authorization-grace must be a number of seconds".into())
        })?;
        let mut config = ServerConfig::new(credentials, catalog);
        config.tls = tls;
        config.authorization_grace = grace;
        config.max_connections = self.max_connections;
        config.limits = Limits {
            max_message_size: usize::try_from(self.max_message_size)
                .map_err(|_| Failure::Argument("--max-message-size is too large".into()))?,
            max_scopes: self.max_scopes,
            max_channels: self.max_channels,
            max_queued_responses: self.max_queued_responses,
            max_queued_bytes: usize::try_from(self.max_queued_bytes)
                .map_err(|_| Failure::Argument("--max-queued-bytes is too large".into()))?,
            max_connection_queued_bytes: usize::try_from(self.max_connection_queued_bytes)
                .map_err(|_| {
                    Failure::Argument("--max-connection-queued-bytes is too large".into())
                })?,
        };
        config.admission = Admission {
            max_unauthorized: self.max_unauthorized,
            max_connections_per_address: self.max_connections_per_address,
            max_connections_per_identity: self.max_connections_per_identity,
            handshake_timeout: Duration::try_from_secs_f64(self.handshake_timeout).map_err(
                |_| Failure::Argument("--handshake-timeout must be a number of seconds".into()),
            )?,
            max_authorization_size: usize::try_from(self.max_authorization_size)
                .map_err(|_| Failure::Argument("--max-authorization-size is too large".into()))?,
        };
        config.budget = RunBudget {
            max_runs: self.max_runs,
            max_runs_per_identity: self.max_runs_per_identity,
            max_loops_per_identity: self.max_loops_per_identity,
            max_run_memory: self.max_run_memory,
            max_run_disk: self.max_run_disk,
            memory_budget: self.memory_budget.unwrap_or_else(default_memory_budget),
        };
        // A limit that would serve nobody is refused now, not met by every
        // caller later.
        config
            .validate()
            .map_err(|error| Failure::Argument(error.named(option(error.limit))))?;
        Ok(config)
    }

    /// The TLS certificate and key, when given, loaded and checked.
    fn tls(&self) -> Result<Option<ServerTls>, Failure> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => ServerTls::load(cert, key)
                .map(Some)
                .map_err(|error| Failure::Argument(error.to_string())),
            _ => Ok(None),
        }
    }

    /// The drain's deadline.
    fn drain_timeout(&self) -> Result<Duration, Failure> {
        Duration::try_from_secs_f64(self.drain_timeout)
            .map_err(|_| Failure::Argument("--drain-timeout must be a number of seconds".into()))
    }

    /// The container host's configuration.
    fn host_config(&self) -> Result<HostConfig, Failure> {
        let seconds = |value: f64, flag: &str| {
            Duration::try_from_secs_f64(value)
                .map_err(|_| Failure::Argument(format!("{flag} must be a number of seconds")))
        };
        let mut config =
            HostConfig::new(self.store.clone().unwrap_or_else(HostConfig::default_store));
        config.subnet = self.container_network;
        config.grace = seconds(self.container_grace, "--container-grace")?;
        config.startup_timeout = seconds(
            self.container_startup_timeout,
            "--container-startup-timeout",
        )?;
        config.pids = self.container_pids;
        config.output = self.output_limit();
        Ok(config)
    }

    /// Opens the container host, if anything needs one, adds the catalog's
    /// `oci:` entries (each pinned to its layout's digest), and the
    /// registry puller.
    async fn containers(
        &self,
        config: &mut ServerConfig,
    ) -> Result<Option<std::sync::Arc<Host>>, Failure> {
        let layouts: Vec<&AgentSpec> = self
            .agents
            .iter()
            .filter(|spec| matches!(spec.runtime, RuntimeSpec::Oci(_)))
            .collect();
        let pulls = !self.registries.is_empty() || !self.insecure_registries.is_empty();
        if layouts.is_empty() && !pulls {
            return Ok(None);
        }
        let host = Host::open(self.host_config()?)
            .await
            .map_err(Failure::Containers)?;
        if pulls {
            let registry = RegistryConfig {
                mirrors: self.registry_mirrors.clone(),
                max_image_size: self.max_image_size,
                pull_timeout: self.pull_timeout,
                max_pulls: self.max_pulls as usize,
                max_unpack_ratio: self.max_unpack_ratio,
                ..RegistryConfig::new(self.registries.clone(), self.insecure_registries.clone())
            };
            info!(allowed = ?registry.allowed, insecure = ?registry.insecure, mirrors = ?registry.mirrors, max_image_size = registry.max_image_size, "pulling registry images");
            let pull = Pull::new(std::sync::Arc::clone(&host), registry).map_err(|error| {
                Failure::Argument(format!("cannot set up registry pulls: {error}"))
            })?;
            config.registry = Some(std::sync::Arc::new(pull));
        }
        for spec in layouts {
            let RuntimeSpec::Oci(dir) = &spec.runtime else {
                continue;
            };
            // A signal mid-unpack ends the unpack and removes what it made.
            let (digest, runtime) = tokio::select! {
                layout = host.layout(dir, spec.digest.as_deref()) => layout.map_err(Failure::Containers)?,
                () = shutdown_signal() => {
                    host.store().stop().await;
                    return Err(Failure::Runtime(std::io::Error::other(format!(
                        "stopped by a signal while unpacking {}", dir.display()
                    ))));
                }
            };
            info!(image = %spec.name, %digest, layout = %dir.display(), "serving an image layout in containers");
            config.catalog.insert(
                spec.name.clone(),
                Some(digest.to_string()),
                std::sync::Arc::new(runtime),
            );
        }
        Ok(Some(host))
    }

    /// The descriptors the server may open, raised to the hard limit, if
    /// its limits fit in them; `identities` are the credentials it knows.
    fn descriptors(&self, identities: usize) -> Result<u64, Failure> {
        let limit = descriptors::raise().map_err(Failure::Runtime)?;
        let load = Load {
            connections: self.max_connections as u64,
            unauthorized: self.max_unauthorized as u64,
            runs: self.max_runs as u64,
            loops_per_identity: self.max_loops_per_identity as u64,
            identities: identities.max(1) as u64,
            holds: if !self.agents.is_empty()
                && self
                    .agents
                    .iter()
                    .all(|spec| matches!(spec.runtime, RuntimeSpec::Proxy(_)))
            {
                Holds::ATTACHED
            } else {
                Holds::CONTAINER
            },
        };
        descriptors::check(load, limit).map_err(|error| Failure::Argument(error.to_string()))?;
        Ok(limit)
    }

    /// Logs what the operator should know of this server's bounds; with
    /// `exec:` entries, finds how their programs are held (and removes
    /// the runs of servers killed before) now, before anything runs.
    fn say_how(&self, descriptors: u64, exec: bool) {
        if !self.tokens.is_empty() {
            warn!("{}", token::COMMAND_LINE_WARNING);
        }
        info!(descriptors, "descriptor limit");
        info!(
            max_runs = self.max_runs,
            max_runs_per_identity = self.max_runs_per_identity,
            max_loops_per_identity = self.max_loops_per_identity,
            max_run_memory = self.max_run_memory,
            max_run_disk = self.max_run_disk,
            memory_budget = self.memory_budget.unwrap_or_else(default_memory_budget),
            "run budget"
        );
        if !exec {
            return;
        }
        let confinement = Confinement::host();
        if self.exec_disk == ExecDisk::Unenforced {
            warn!("exec runs go ahead with their disk unenforced (--exec-disk unenforced)");
        }
        if let Confinement::Cgroups(cgroup) = confinement {
            info!(
                cgroup = cgroup.path(),
                pids = self.exec_pids,
                "exec runs are held by cgroups"
            );
        }
    }

    /// Serves until Ctrl-C or SIGTERM, and the drain after it.
    pub fn execute(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        let mut config = self.config()?;
        let drain_timeout = self.drain_timeout()?;
        let identities = match &config.credentials {
            Credentials::Any => 1,
            Credentials::Tokens(tokens) => tokens.len(),
        };
        let descriptors = self.descriptors(identities)?;
        let _logs = init_logs_as("info", self.logs.log_format);
        let exec = self
            .agents
            .iter()
            .any(|spec| matches!(spec.runtime, RuntimeSpec::Exec { .. }));
        let served = block_on(async {
            let host = self.containers(&mut config).await?;
            for (name, digest) in config.catalog.names() {
                info!(
                    image = name,
                    pinned = digest.unwrap_or("no"),
                    "serving image"
                );
            }
            self.say_how(descriptors, exec);
            let server = Server::bind(self.listen, config)
                .await
                .map_err(|error| Failure::bind(self.listen, error))?;
            let (handle, serving) = server.spawn();
            // The signal handlers are in place before the URL says the
            // server is up: a SIGTERM right after it still drains and shuts
            // down gracefully (runs stopped, exec cgroups removed); and
            // SIGHUP's default action would end the process.
            let shutdown = shutdown_signal();
            tokio::pin!(shutdown);
            std::future::poll_fn(|cx| {
                let _ = shutdown.as_mut().poll(cx);
                std::task::Poll::Ready(())
            })
            .await;
            let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .map_err(Failure::Runtime)?;
            tokio::spawn(reload_on_hangup(handle.clone(), hangups));
            writeln!(out, "{}", handle.url())?;
            let admin = match self.admin {
                Some(addr) => {
                    let (url, stop, serving) = start_admin(addr, Arc::new(handle.clone())).await?;
                    writeln!(out, "{url}")?;
                    Some((stop, serving))
                }
                None => None,
            };
            out.flush()?;
            drain(&handle, serving, drain_timeout, shutdown).await;
            // Unpacks a gone run started are ended, and what they made removed.
            if let Some(host) = &host {
                host.store().stop().await;
            }
            if let Some((stop, admin)) = admin {
                stop.cancel();
                let _ = admin.await;
            }
            Ok(Exit::Success)
        })?;
        if exec {
            Confinement::host().release();
        }
        served
    }
}

/// Binds an admin listener for `watched` on `addr` and serves it until the
/// returned token is cancelled: its `http://` URL, the token, its task.
pub async fn start_admin(
    addr: SocketAddr,
    watched: Arc<dyn Watched>,
) -> Result<(String, CancellationToken, tokio::task::JoinHandle<()>), Failure> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Failure::Listen {
            addr: addr.to_string(),
            source,
        })?;
    let bound = listener.local_addr().map_err(Failure::Runtime)?;
    let stop = CancellationToken::new();
    let serving = tokio::spawn({
        let stop = stop.clone();
        async move {
            if let Err(error) = admin::serve(listener, watched, stop).await {
                warn!(%error, "the admin listener failed");
            }
        }
    });
    Ok((format!("http://{bound}"), stop, serving))
}

/// On the first Ctrl-C or SIGTERM (`signal`), drains the server for
/// `timeout` at most; then, or on a second signal, shuts it down; returns
/// when it is done.
async fn drain(
    handle: &ServerHandle,
    mut serving: tokio::task::JoinHandle<()>,
    timeout: Duration,
    signal: impl Future<Output = ()>,
) {
    tokio::select! {
        () = signal => {}
        _ = &mut serving => return,
    }
    info!(
        ?timeout,
        "signal received: draining (a second signal ends every run now)"
    );
    handle.drain();
    tokio::select! {
        _ = &mut serving => return,
        () = tokio::time::sleep(timeout) => {
            warn!(?timeout, "the drain's deadline passed: ending the runs still open");
        }
        () = shutdown_signal() => info!("second signal: ending the runs still open"),
    }
    handle.shutdown();
    let _ = serving.await;
}

/// Reloads the TLS certificate and key on each SIGHUP, for as long as the
/// server lives.
async fn reload_on_hangup(handle: ServerHandle, mut hangups: tokio::signal::unix::Signal) {
    while hangups.recv().await.is_some() {
        match handle.reload_tls() {
            Ok(true) => info!("TLS certificate reloaded: new connections get it"),
            Ok(false) => info!("SIGHUP: no TLS certificate to reload"),
            Err(error) => {
                warn!(%error, "the TLS certificate did not reload; the old one is still served");
            }
        }
    }
}
