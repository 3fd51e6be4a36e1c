//! `runloop serve`: the provider server, with its catalog of agents.
//!
//! Without a token the server accepts any credential, which is only safe
//! where nobody else can connect: it then refuses to listen anywhere but a
//! loopback address. Tokens come from `--token-file` or `RUNLOOP_TOKEN`;
//! `--token` works but is warned about ([`crate::token`]). At startup the
//! server raises its descriptor limit and refuses limits that do not fit
//! in it ([`crate::descriptors`]), and with `exec:` entries it says how
//! their programs are held (a cgroup each, or what is not enforced
//! without one). It prints its `ws://` URL on stdout once it listens
//! (so a script can start it on port 0 and read where it went), logs to
//! stderr, and on Ctrl-C or SIGTERM shuts down gracefully: it stops
//! accepting, ends every run (loops end with an error, containers stop,
//! scopes finish), and closes every connection.

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use runloop::limits::{Limit, Limits};
use runloop::runtime::output::OutputLimit;
use runloop::runtime::{AgentSpec, Catalog, Confinement, DiskPolicy, ExecConfig, RuntimeSpec};
use runloop::server::{Credentials, DEFAULT_MAX_CONNECTIONS, Server, ServerConfig};
use runloop_oci::network::{DEFAULT_SUBNET, Subnet};
use runloop_oci::registry::{Pull, RegistryConfig};
use runloop_oci::{Host, HostConfig};
use tracing::{info, warn};

use crate::descriptors::{self, Load};
use crate::exit::{Exit, Failure};
use crate::process::{block_on, init_logs, shutdown_signal};
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
        // A limit that would serve nobody is refused now, not met by every
        // caller later.
        config
            .validate()
            .map_err(|error| Failure::Argument(error.named(option(error.limit))))?;
        Ok(config)
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
    async fn containers(&self, config: &mut ServerConfig) -> Result<(), Failure> {
        let layouts: Vec<&AgentSpec> = self
            .agents
            .iter()
            .filter(|spec| matches!(spec.runtime, RuntimeSpec::Oci(_)))
            .collect();
        let pulls = !self.registries.is_empty() || !self.insecure_registries.is_empty();
        if layouts.is_empty() && !pulls {
            return Ok(());
        }
        let host = Host::open(self.host_config()?)
            .await
            .map_err(Failure::Containers)?;
        if pulls {
            let registry = RegistryConfig {
                allowed: self.registries.clone(),
                insecure: self.insecure_registries.clone(),
                max_image_size: self.max_image_size,
            };
            info!(allowed = ?registry.allowed, insecure = ?registry.insecure, max_image_size = registry.max_image_size, "pulling registry images");
            config.registry = Some(std::sync::Arc::new(Pull::new(
                std::sync::Arc::clone(&host),
                registry,
            )));
        }
        for spec in layouts {
            let RuntimeSpec::Oci(dir) = &spec.runtime else {
                continue;
            };
            let (digest, runtime) = host
                .layout(dir, spec.digest.as_deref())
                .await
                .map_err(Failure::Containers)?;
            info!(image = %spec.name, %digest, layout = %dir.display(), "serving an image layout in containers");
            config.catalog.insert(
                spec.name.clone(),
                Some(digest.to_string()),
                std::sync::Arc::new(runtime),
            );
        }
        Ok(())
    }

    /// The descriptors the server may open, raised to the hard limit, if
    /// its limits fit in them.
    fn descriptors(&self) -> Result<u64, Failure> {
        let limit = descriptors::raise().map_err(Failure::Runtime)?;
        // No server-wide bound on runs exists yet; when one does, its
        // runs go here.
        let load = Load {
            connections: self.max_connections as u64,
            runs: 0,
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

    /// Serves until Ctrl-C or SIGTERM.
    pub fn execute(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        let mut config = self.config()?;
        let descriptors = self.descriptors()?;
        let _logs = init_logs("info");
        let exec = self
            .agents
            .iter()
            .any(|spec| matches!(spec.runtime, RuntimeSpec::Exec { .. }));
        let served = block_on(async {
            self.containers(&mut config).await?;
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
            let (handle, mut serving) = server.spawn();
            // The signal handlers are in place before the URL says the
            // server is up: a SIGTERM right after it still shuts down
            // gracefully (runs stopped, exec cgroups removed).
            let shutdown = shutdown_signal();
            tokio::pin!(shutdown);
            std::future::poll_fn(|cx| {
                let _ = shutdown.as_mut().poll(cx);
                std::task::Poll::Ready(())
            })
            .await;
            writeln!(out, "{}", handle.url())?;
            out.flush()?;
            tokio::select! {
                () = &mut shutdown => {
                    info!("signal received");
                    handle.shutdown();
                    let _ = serving.await;
                }
                _ = &mut serving => {}
            }
            Ok(Exit::Success)
        })?;
        if exec {
            Confinement::host().release();
        }
        served
    }
}
