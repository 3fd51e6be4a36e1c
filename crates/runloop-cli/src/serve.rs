//! `runloop serve`: the provider server, with its catalog of agents.
//!
//! Without a token the server accepts any credential, which is only safe
//! where nobody else can connect: it then refuses to listen anywhere but a
//! loopback address. Beyond loopback it also wants TLS (`--tls-cert`,
//! `--tls-key`), or to be told that something in front adds it
//! (`--allow-plaintext`): tokens and loops would otherwise cross the
//! network in the clear. Tokens come from `--token-file` or
//! `RUNLOOP_TOKEN`; `--token` works but is warned about ([`crate::token`]).
//! Every token is a tenant with a fair share of the server (half of each
//! budget by default); a configuration file (`--config`, [`crate::serve_file`])
//! names tenants with their own tokens and quotas, and holds every option
//! as a key; the limits are declared once, in [`crate::limit_table`].
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
//! connection closes. SIGHUP reloads the TLS certificate and key and, with
//! `--config`, the file: tenants, tokens, quotas and the per-identity
//! limits are applied to what comes next; the log names every other key
//! that changed as needing a restart; a file that does not validate
//! changes nothing.

use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use runloop::runtime::output::OutputLimit;
use runloop::runtime::{
    AgentSpec, Catalog, Confinement, DiskPolicy, ExecConfig, ExecNetwork, RuntimeSpec,
};
use runloop::server::{
    Credentials, PerIdentity, RunBudget, Server, ServerConfig, ServerHandle, Tenants,
    default_disk_budget, default_store_max_size,
};
use runloop::tls::ServerTls;
use runloop_oci::registry::{Pull, RegistryConfig};
use runloop_oci::user::IdMapping;
use runloop_oci::{Host, HostConfig, OciRuntime, PoolConfig};
use runloop_proto::error_chain::Chain;
use tracing::{info, warn};

use crate::descriptors::{self, Holds, Load};
use crate::exit::{Exit, Failure};
use crate::limit_table::option;
use crate::process::{block_on, init_logs_as, shutdown_signal, start_admin};
pub use crate::serve_args::{Args, ExecDisk, ExecNetworkArg, OciRuntimeArg};
use crate::{serve_file, token};

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
            network: match self.exec_network {
                ExecNetworkArg::Own => ExecNetwork::Own,
                ExecNetworkArg::Host => ExecNetwork::Host,
            },
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
        let config = self.unchecked_config()?;
        // A limit that would serve nobody is refused now, not met by every
        // caller later.
        config
            .validate()
            .map_err(|error| Failure::Argument(error.named(&option(error.limit))))?;
        Ok(config)
    }

    /// The credentials: the file's tenants, and every token given outside
    /// them (`--token`, `--token-file`, `RUNLOOP_TOKEN`) a tenant of its
    /// own with the defaults; any credential without either.
    pub fn credentials(&self) -> Result<Credentials, Failure> {
        let tokens = self.tokens()?;
        if tokens.is_empty() && self.file_tenants.is_none() {
            if !self.listen.ip().is_loopback() {
                return Err(Failure::Argument(format!(
                    "refusing to listen on {} without a token: anyone who can reach it could run \
                     agents; pass --token-file FILE or set RUNLOOP_TOKEN, or name tenants in \
                     --config FILE",
                    self.listen
                )));
            }
            return Ok(Credentials::Any);
        }
        let mut tenants = Tenants::from_tokens(tokens.iter().map(String::as_str));
        if let Some(file) = &self.file_tenants {
            tenants.defaults = file.defaults;
            tenants.tenants.extend(file.tenants.iter().cloned());
        }
        tenants
            .validate()
            .map_err(|error| Failure::Argument(error.to_string()))?;
        Ok(Credentials::Tenants(tenants))
    }

    /// The server's configuration, its limits not yet checked.
    fn unchecked_config(&self) -> Result<ServerConfig, Failure> {
        let credentials = self.credentials()?;
        let tls = self.tls()?;
        self.exposure(tls.is_some())?;
        let mut config = self.limits_config(credentials, self.catalog()?);
        config.tls = tls;
        Ok(config)
    }

    /// Refuses a listener beyond loopback without TLS (`tls`: whether
    /// there is some), unless told something in front adds it.
    fn exposure(&self, tls: bool) -> Result<(), Failure> {
        if tls || self.listen.ip().is_loopback() || self.allow_plaintext {
            return Ok(());
        }
        Err(Failure::Argument(format!(
            "refusing to listen on {} without TLS: tokens and loops would cross the network in \
             the clear; pass --tls-cert and --tls-key, or --allow-plaintext if something in \
             front (a load balancer) adds TLS",
            self.listen
        )))
    }

    /// The catalog of the agents given, but their `oci:` entries (added
    /// once the container host is up).
    fn catalog(&self) -> Result<Catalog, Failure> {
        if self.agents.is_empty() {
            return Ok(Catalog::demo());
        }
        for name in self.file_pools.keys() {
            let served = self
                .agents
                .iter()
                .any(|spec| spec.name == *name && matches!(spec.runtime, RuntimeSpec::Oci(_)))
                || self.warm_image.contains(name);
            if !served {
                return Err(Failure::Argument(format!(
                    "[pool.{name:?}] names no oci: entry and no --warm-image (a warm pool keeps \
                     containers of an oci: entry, --agent {name}=oci:DIR, or of a registry \
                     image, --warm-image REFERENCE)"
                )));
            }
        }
        if !self.warm_image.is_empty()
            && self.registries.is_empty()
            && self.insecure_registries.is_empty()
        {
            return Err(Failure::Argument(
                "--warm-image keeps a registry image warm: name its registry with --registry \
                 (or --insecure-registry)"
                    .into(),
            ));
        }
        let mut catalog = Catalog::new().with_exec(self.exec_config());
        for spec in &self.agents {
            if !matches!(spec.runtime, RuntimeSpec::Oci(_)) {
                catalog
                    .add(spec.clone())
                    .map_err(|error| Failure::Argument(Chain(&error).to_string()))?;
            }
        }
        Ok(catalog)
    }

    /// A configuration of `credentials` and `catalog` with every limit
    /// given (no TLS): what the limits are checked on.
    fn limits_config(&self, credentials: Credentials, catalog: Catalog) -> ServerConfig {
        let mut config = ServerConfig::new(credentials, catalog);
        config.budget.disk_budget = self.default_disk_budget();
        self.limits.apply(&mut config);
        config
    }

    /// Every fault `serve` would meet before it listens: token files,
    /// credentials, TLS material, the catalog, every limit below its
    /// minimum, the descriptors its limits need. Each part is checked
    /// whatever the others found, so one fault never hides another; a
    /// fault of the file's own tenants is left to the file's reading,
    /// which names the file ([`serve_file::merge`]).
    pub fn faults(&self) -> Vec<String> {
        let mut faults = Vec::new();
        let mut push = |fault: String| {
            if !faults.contains(&fault) {
                faults.push(fault);
            }
        };
        for file in &self.token_files {
            if let Err(error) = token::read_file(file) {
                push(Chain(&error).to_string());
            }
        }
        let credentials = match self.credentials() {
            Ok(credentials) => credentials,
            Err(error) => {
                let file_s_own = self
                    .file_tenants
                    .as_ref()
                    .is_some_and(|tenants| tenants.validate().is_err());
                if !file_s_own
                    && !self
                        .token_files
                        .iter()
                        .any(|f| token::read_file(f).is_err())
                {
                    push(Chain(&error).to_string());
                }
                Credentials::Any
            }
        };
        let tls = match self.tls() {
            Ok(tls) => tls.is_some(),
            Err(error) => {
                push(Chain(&error).to_string());
                // Given, if not loadable: not a listener without TLS.
                true
            }
        };
        if let Err(error) = self.exposure(tls) {
            push(Chain(&error).to_string());
        }
        let catalog = self.catalog().unwrap_or_else(|error| {
            push(Chain(&error).to_string());
            Catalog::demo()
        });
        let config = self.limits_config(credentials, catalog);
        for error in config.faults() {
            push(error.named(&option(error.limit)));
        }
        if let Err(error) = self.descriptors(&config) {
            push(Chain(&error).to_string());
        }
        faults
    }

    /// The TLS certificate and key, when given, loaded and checked; one
    /// without the other is a fault (wherever each was given: the file or
    /// the command line).
    fn tls(&self) -> Result<Option<ServerTls>, Failure> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => ServerTls::load(cert, key)
                .map(Some)
                .map_err(|error| Failure::Argument(Chain(&error).to_string())),
            (Some(_), None) => Err(Failure::Argument(
                "--tls-cert is given without --tls-key, the certificate's private key".into(),
            )),
            (None, Some(_)) => Err(Failure::Argument(
                "--tls-key is given without --tls-cert, the certificate chain it is the key of"
                    .into(),
            )),
            (None, None) => Ok(None),
        }
    }

    /// The disk budget without `--disk-budget`: 3/4 of the store's
    /// filesystem.
    fn default_disk_budget(&self) -> u64 {
        default_disk_budget(&self.store.clone().unwrap_or_else(HostConfig::default_store))
    }

    /// The container host's configuration.
    fn host_config(&self) -> Result<HostConfig, Failure> {
        let mut config =
            HostConfig::new(self.store.clone().unwrap_or_else(HostConfig::default_store));
        config.grace = self.container_grace;
        config.startup_timeout = self.container_startup_timeout;
        config.pids = self.container_pids;
        config.output = self.output_limit();
        if let Some(range) = self.container_uid_range {
            config.ids = IdMapping::both(range);
        }
        if let Some(cpus) = self.container_cpus {
            if !(cpus.is_finite() && cpus >= 0.01) {
                return Err(Failure::Argument(
                    "--container-cpus must be a number of CPUs, at least 0.01".into(),
                ));
            }
            config.cpus = cpus;
        }
        config.nofile = self.container_nofile;
        config.runtime = match self.oci_runtime {
            OciRuntimeArg::Runc => runloop_oci::runc::Kind::Runc,
            OciRuntimeArg::Runsc => runloop_oci::runc::Kind::Runsc,
        };
        config.runc = PathBuf::from(config.runtime.name());
        config.init = self.container_init;
        config.store_max_size = Some(default_store_max_size(&config.store));
        self.limits.apply_host(&mut config);
        config.egress = self
            .container_egress
            .then_some(self.container_egress_network);
        Ok(config)
    }

    /// Opens the container host, if anything needs one, adds the catalog's
    /// `oci:` entries (each pinned to its layout's digest), and the
    /// registry puller; the host, to close when the server has stopped, and
    /// the `oci:` entries' runtimes by name (whose pools are kept once the
    /// server serves).
    async fn containers(&self, config: &mut ServerConfig) -> Result<Containers, Failure> {
        let layouts: Vec<&AgentSpec> = self
            .agents
            .iter()
            .filter(|spec| matches!(spec.runtime, RuntimeSpec::Oci(_)))
            .collect();
        let pulls = !self.registries.is_empty() || !self.insecure_registries.is_empty();
        if layouts.is_empty() && !pulls {
            return Ok(Containers::default());
        }
        let host = Host::open(self.host_config()?)
            .await
            .map_err(Failure::Containers)?;
        // Runs' disks are files of the store: a run's must fit its free space.
        config.run_disks = Some(host.store().runs());
        let mut puller = None;
        if pulls {
            let registry = RegistryConfig {
                mirrors: self.registry_mirrors.clone(),
                proxy: self.registry_proxy.clone(),
                max_image_size: self.max_image_size,
                pull_timeout: self.pull_timeout,
                max_pulls: self.max_pulls as usize,
                max_unpack_ratio: self.max_unpack_ratio,
                ..RegistryConfig::new(self.registries.clone(), self.insecure_registries.clone())
            };
            info!(allowed = ?registry.allowed, insecure = ?registry.insecure, mirrors = ?registry.mirrors, proxy = ?registry.proxy, max_image_size = registry.max_image_size, "pulling registry images");
            let environment = [
                "HTTPS_PROXY",
                "https_proxy",
                "HTTP_PROXY",
                "http_proxy",
                "ALL_PROXY",
                "all_proxy",
            ]
            .into_iter()
            .filter(|name| std::env::var_os(name).is_some())
            .collect::<Vec<_>>();
            if registry.proxy.is_none() && !environment.is_empty() {
                warn!(set = ?environment, "registry pulls do not use the environment's proxy; name one with --registry-proxy");
            }
            let pull = Pull::new(std::sync::Arc::clone(&host), registry).map_err(|error| {
                Failure::Argument(format!("cannot set up registry pulls: {}", Chain(&error)))
            })?;
            let pull = std::sync::Arc::new(pull);
            config.registry = Some(
                std::sync::Arc::clone(&pull) as std::sync::Arc<dyn runloop::runtime::Registry>
            );
            puller = Some(pull);
        }
        let mut runtimes = Vec::new();
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
                std::sync::Arc::new(runtime.clone()),
            );
            runtimes.push((spec.name.clone(), runtime));
        }
        Ok(Containers {
            host: Some(host),
            layouts: runtimes,
            pull: puller,
        })
    }

    /// The warm pool of the `oci:` entry or `--warm-image` `name`: its
    /// `[pool."NAME"]` table's figures, else `defaults` (`--warm`,
    /// `--warm-memory`, `--warm-disk`).
    fn pool(&self, name: &str, defaults: PoolConfig) -> PoolConfig {
        let entry = self.file_pools.get(name).copied().unwrap_or_default();
        PoolConfig {
            size: entry.warm.unwrap_or(defaults.size),
            memory: entry.memory.unwrap_or(defaults.memory),
            disk: entry.disk.unwrap_or(defaults.disk),
        }
    }

    /// The descriptors the server may open, raised to the hard limit, if
    /// the limits of `config` fit in them.
    fn descriptors(&self, config: &ServerConfig) -> Result<u64, Failure> {
        let limit = descriptors::raise().map_err(Failure::Runtime)?;
        let load = Load {
            connections: config.max_connections as u64,
            unauthorized: config.admission.max_unauthorized as u64,
            runs: config.budget.max_runs as u64,
            // A tenant's max-loops may be over the flag's: the most any
            // tenant may hold, for each of them.
            loops_per_identity: loops_per_tenant(config),
            identities: identities(&config.credentials).max(1) as u64,
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
    fn say_how(&self, budget: &RunBudget, descriptors: u64, exec: bool) {
        if !self.tokens.is_empty() {
            warn!("{}", token::COMMAND_LINE_WARNING);
        }
        info!(descriptors, "descriptor limit");
        info!(
            max_runs = budget.max_runs,
            max_runs_per_identity = budget.max_runs_per_identity,
            max_loops_per_identity = budget.max_loops_per_identity,
            max_run_memory = budget.max_run_memory,
            max_run_disk = budget.max_run_disk,
            memory_budget = budget.memory_budget,
            disk_budget = budget.disk_budget,
            "run budget"
        );
        if !exec {
            return;
        }
        let confinement = Confinement::host();
        if self.exec_disk == ExecDisk::Unenforced {
            warn!("exec runs go ahead with their disk unenforced (--exec-disk unenforced)");
        }
        match (
            self.exec_network,
            runloop::runtime::exec::network_shortfall(),
        ) {
            (ExecNetworkArg::Host, _) => warn!(
                "exec runs are on the host's network (--exec-network host): their agent programs \
                 reach what the server's user reaches, the host's own services included"
            ),
            (ExecNetworkArg::Own, Some(shortfall)) => warn!("{shortfall}"),
            (ExecNetworkArg::Own, None) => info!(
                "exec runs each have a network namespace of their own, loopback only \
                 (--exec-network host gives them the host's)"
            ),
        }
        if let Confinement::Cgroups(cgroup) = confinement {
            info!(
                cgroup = cgroup.path(),
                pids = self.exec_pids,
                "exec runs are held by cgroups"
            );
        }
    }

    /// `--print-config`; `--check-config`; or serves until Ctrl-C or
    /// SIGTERM, and the drain after it, with the configuration file's keys
    /// under the command line's.
    pub fn execute(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        if self.print_config && self.config.is_none() {
            serve_file::print_defaults(out)?;
            return Ok(Exit::Success);
        }
        if self.config.is_none() && !self.check_config {
            return self.serve(out, None);
        }
        let merged = serve_file::merge(self.config.as_deref(), &self.command_line);
        // With a file, `--print-config` prints what it makes, tenants
        // included, and its faults: the check's output.
        if self.check_config || self.print_config {
            return check(merged, out);
        }
        match merged.args {
            Some(args) if merged.faults.is_empty() => {
                let reload = self.config.clone().map(|path| Reloading {
                    path,
                    command_line: self.command_line.clone(),
                    effective: merged
                        .matches
                        .as_ref()
                        .map(serve_file::effective)
                        .unwrap_or_default(),
                });
                args.serve(out, reload)
            }
            _ => Err(Failure::Argument(format!(
                "the configuration does not validate:\n  {}",
                merged.faults.join("\n  ")
            ))),
        }
    }

    /// Serves until Ctrl-C or SIGTERM, and the drain after it; SIGHUP
    /// reloads the TLS certificate and, with `reload`, the file.
    fn serve(&self, out: &mut impl Write, reload: Option<Reloading>) -> Result<Exit, Failure> {
        let mut config = self.config()?;
        let drain_timeout = self.drain_timeout;
        let descriptors = self.descriptors(&config)?;
        let _logs = init_logs_as("info", self.logs.log_format);
        let exec = self
            .agents
            .iter()
            .any(|spec| matches!(spec.runtime, RuntimeSpec::Exec { .. }));
        let served = block_on(async {
            let Containers {
                host,
                layouts: oci,
                pull,
            } = self.containers(&mut config).await?;
            for (name, digest) in config.catalog.names() {
                info!(
                    image = name,
                    pinned = digest.unwrap_or("no"),
                    "serving image"
                );
            }
            self.say_how(&config.budget, descriptors, exec);
            let server = Server::bind(self.listen, config)
                .await
                .map_err(|error| Failure::bind(self.listen, error))?;
            let (handle, serving) = server.spawn();
            if let Some(host) = &host {
                let reserve = handle.reserve();
                for (name, runtime) in &oci {
                    let pool = self.pool(name, host.config().warm);
                    if pool.size > 0 {
                        info!(image = %name, warm = pool.size, memory = pool.memory, disk = pool.disk, "warm pool");
                    }
                    runtime.keep_warm(pool, Arc::clone(&reserve));
                }
                // Pulled in the background: the server serves meanwhile.
                for reference in pull.iter().flat_map(|_| &self.warm_image) {
                    let Some(pull) = pull.clone() else { break };
                    let (reference, reserve) = (reference.clone(), Arc::clone(&reserve));
                    let pool = self.pool(&reference, host.config().warm);
                    tokio::spawn(async move {
                        match pull.keep_warm(&reference, pool, reserve).await {
                            Ok(()) => {
                                info!(image = %reference, warm = pool.size, memory = pool.memory, disk = pool.disk, "warm pool")
                            }
                            Err(error) => {
                                warn!(image = %reference, %error, "cannot keep the image warm")
                            }
                        }
                    });
                }
            }
            for (tenant, shares) in handle.tenant_shares() {
                info!(
                    %tenant,
                    max_connections = shares.max_connections,
                    max_runs = shares.max_runs,
                    max_loops = shares.max_loops,
                    memory_budget = shares.memory_budget,
                    disk_budget = shares.disk_budget,
                    max_run_memory = shares.max_run_memory,
                    max_pulls = shares.max_pulls,
                    cpu_weight = shares.cpu_weight,
                    "tenant"
                );
            }
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
            tokio::spawn(reload_on_hangup(
                handle.clone(),
                hangups,
                reload.map(Arc::new),
            ));
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
                host.close().await;
                info!("containers removed");
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

/// The most loops one tenant of `config` may hold: the largest of their
/// max-loops (the per-identity limit when no tenant is configured).
fn loops_per_tenant(config: &ServerConfig) -> u64 {
    let tenants = match &config.credentials {
        Credentials::Tenants(tenants) => tenants.clone(),
        Credentials::Tokens(tokens) => Tenants::from_tokens(tokens.iter().map(String::as_str)),
        Credentials::Any => Tenants::default(),
    };
    let defaults = runloop::server::Shares::of(&tenants.defaults, config).max_loops;
    tenants
        .tenants
        .iter()
        .map(|tenant| {
            runloop::server::Shares::of(&tenant.quota.or(tenants.defaults), config).max_loops
        })
        .fold(
            defaults.max(config.budget.max_loops_per_identity),
            usize::max,
        ) as u64
}

/// How many identities `credentials` make (the descriptors' count).
fn identities(credentials: &Credentials) -> usize {
    match credentials {
        Credentials::Any => 1,
        Credentials::Tokens(tokens) => tokens.len(),
        Credentials::Tenants(tenants) => tenants.tenants.len(),
    }
}

/// `serve --check-config`: every fault, then the effective configuration;
/// exits 0 when there is none, else 2.
fn check(merged: serve_file::Merged, out: &mut impl Write) -> Result<Exit, Failure> {
    let mut faults = merged.faults;
    if let Some(args) = &merged.args {
        for fault in args.faults() {
            if !faults.contains(&fault) {
                faults.push(fault);
            }
        }
    }
    if let Some(matches) = &merged.matches {
        writeln!(out, "# the effective configuration of runloop serve")?;
        serve_file::print_effective(matches, &merged.from_file, &merged.tenant_tables, out)?;
    }
    if faults.is_empty() {
        writeln!(out, "# the configuration is valid")?;
        return Ok(Exit::Success);
    }
    let mut err = std::io::stderr().lock();
    for fault in &faults {
        writeln!(err, "runloop: {fault}")?;
    }
    writeln!(
        err,
        "runloop: {} fault(s): the configuration does not validate",
        faults.len()
    )?;
    Ok(Exit::Failed)
}

/// What a SIGHUP reads again: the configuration file, under the same
/// command line, and the effective values serve started with.
struct Reloading {
    path: PathBuf,
    command_line: Vec<std::ffi::OsString>,
    effective: std::collections::BTreeMap<String, String>,
}

/// The keys a SIGHUP applies besides the limits marked live in
/// [`crate::limit_table`]; every other key needs a restart.
const LIVE_KEYS: [&str; 2] = ["token", "token-file"];

/// Whether SIGHUP applies a change to `key`.
fn live(key: &str) -> bool {
    LIVE_KEYS.contains(&key) || crate::limit_table::row(key).is_some_and(|row| row.live)
}

impl Reloading {
    /// Reads the file again and applies its tenants, tokens and quotas;
    /// says what changed and which changed keys need a restart. A file
    /// that does not validate changes nothing.
    fn reload(&self, handle: &ServerHandle) {
        let merged = serve_file::merge(Some(&self.path), &self.command_line);
        let (Some(args), Some(matches), true) =
            (merged.args, merged.matches, merged.faults.is_empty())
        else {
            warn!(
                file = %self.path.display(),
                faults = %merged.faults.join("; "),
                "SIGHUP: the configuration file does not validate; nothing changed"
            );
            return;
        };
        let tenants = match args.credentials() {
            Ok(Credentials::Tenants(tenants)) => tenants,
            Ok(_) => {
                warn!(
                    file = %self.path.display(),
                    "SIGHUP: the file names no token and no tenant; going without tokens needs a \
                     restart; nothing changed"
                );
                return;
            }
            Err(error) => {
                warn!(file = %self.path.display(), error = %Chain(&error), "SIGHUP: nothing changed");
                return;
            }
        };
        // The per-identity limits apply to what a tenant leaves out.
        let config = match args.unchecked_config() {
            Ok(config) => config,
            Err(error) => {
                warn!(error = %Chain(&error), "SIGHUP: nothing changed");
                return;
            }
        };
        let per_identity = PerIdentity {
            max_connections: config.admission.max_connections_per_identity,
            max_runs: config.budget.max_runs_per_identity,
            max_loops: config.budget.max_loops_per_identity,
        };
        match handle.set_tenants(tenants, per_identity) {
            Ok(changes) if changes.is_empty() => info!("SIGHUP: tenants and quotas unchanged"),
            Ok(changes) => {
                for change in changes {
                    info!(%change, "SIGHUP: applied");
                }
            }
            Err(error) => {
                warn!(error = %Chain(&error), "SIGHUP: nothing changed");
                return;
            }
        }
        let now = serve_file::effective(&matches);
        for (key, value) in &now {
            if !live(key) && self.effective.get(key) != Some(value) {
                warn!(
                    key,
                    "SIGHUP: changed in the file, but applies only after a restart; the value \
                     serve started with is still in force"
                );
            }
        }
    }
}

/// On each SIGHUP, for as long as the server lives: reloads the TLS
/// certificate and key, and with `reload` the configuration file. The
/// files are read on a blocking thread, never on an async worker: a disk
/// that is slow, or a path that is not a regular file, holds up no
/// connection, run or `/healthz` (and the files themselves are read only
/// when they are regular and small, [`runloop::small_file`]).
async fn reload_on_hangup(
    handle: ServerHandle,
    mut hangups: tokio::signal::unix::Signal,
    reload: Option<Arc<Reloading>>,
) {
    while hangups.recv().await.is_some() {
        let handle = handle.clone();
        let reload = reload.clone();
        let reloaded = tokio::task::spawn_blocking(move || {
            match handle.reload_tls() {
                Ok(true) => info!("TLS certificate reloaded: new connections get it"),
                Ok(false) => info!("SIGHUP: no TLS certificate to reload"),
                Err(error) => {
                    warn!(error = %Chain(&error), "the TLS certificate did not reload; the old one is still served");
                }
            }
            if let Some(reload) = &reload {
                reload.reload(&handle);
            }
        })
        .await;
        if let Err(error) = reloaded {
            warn!(%error, "SIGHUP: the reload failed; nothing changed");
        }
    }
}

/// What [`Args::containers`] set up.
#[derive(Default)]
struct Containers {
    /// The container host, to close when the server has stopped.
    host: Option<Arc<Host>>,
    /// The `oci:` entries' runtimes, by name.
    layouts: Vec<(String, OciRuntime)>,
    /// The registry puller, when the server pulls.
    pull: Option<Arc<Pull>>,
}
