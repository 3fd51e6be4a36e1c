//! The arguments of `runloop serve`: every option, as clap parses it from
//! the command line and as the configuration file names it (a key of the
//! same name, [`crate::serve_file`]). A module of its own, below both
//! `serve` (which runs them) and `serve_file` (which merges a file under
//! them), so neither has to import the other to know what an option is.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use runloop::runtime::AgentSpec;
use runloop::runtime::output::OutputLimit;
use runloop::server::Tenants;
use runloop_oci::egress::EgressNetwork;
use runloop_oci::user::IdRange;

use crate::limit_table::LimitArgs;
use crate::process::LogArgs;

/// One `[pool."NAME"]` table of the configuration file: what it sets of
/// the entry's warm pool (the command line has no per-entry form).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolEntry {
    /// Containers kept warm.
    pub warm: Option<usize>,
    /// Each one's memory.
    pub memory: Option<u64>,
    /// Each one's disk.
    pub disk: Option<u64>,
}

/// Arguments of `runloop serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A configuration file, TOML: every option below is a key of the same
    /// name (`max-runs = 256`), with `[[tenant]]` tables, a
    /// `[tenant-defaults]` table and `[pool."NAME"]` tables (an oci:
    /// entry's warm pool); an option on the command line overrides the
    /// file. SIGHUP reads it again.
    #[arg(long, value_name = "FILE", help_heading = "Configuration")]
    pub config: Option<PathBuf>,
    /// Check everything serve would (the file, token files, limits,
    /// descriptors, TLS) without listening, print every fault and the
    /// effective configuration, and exit 0 or 2.
    #[arg(long, help_heading = "Configuration")]
    pub check_config: bool,
    /// Print every key with its default and help, as a commented
    /// configuration file to start from; with --config, the effective
    /// configuration instead (as --check-config prints it, tenants
    /// included).
    #[arg(long, help_heading = "Configuration")]
    pub print_config: bool,
    /// The command line after `serve`, kept to merge it over the file.
    #[arg(skip)]
    pub command_line: Vec<std::ffi::OsString>,
    /// The tenants of the configuration file, if it names any.
    #[arg(skip)]
    pub file_tenants: Option<Tenants>,
    /// The configuration file's `[pool."NAME"]` tables, by image name.
    #[arg(skip)]
    pub file_pools: std::collections::BTreeMap<String, PoolEntry>,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1:7878", help_heading = "Listening")]
    pub listen: SocketAddr,
    /// A credential to accept (repeatable). Every local user can read it in
    /// /proc/PID/cmdline: prefer --token-file or RUNLOOP_TOKEN. Without any
    /// token, any credential is accepted, and only on a loopback address.
    #[arg(
        long = "token",
        value_name = "TOKEN",
        help_heading = "Authorization and tenants"
    )]
    pub tokens: Vec<String>,
    /// A file of credentials to accept, one per line (repeatable); the way
    /// to pass tokens, with the RUNLOOP_TOKEN environment variable (one
    /// token).
    #[arg(
        long = "token-file",
        value_name = "FILE",
        help_heading = "Authorization and tenants"
    )]
    pub token_files: Vec<PathBuf>,
    /// The limits, from the one table of them ([`crate::limit_table`]).
    #[command(flatten)]
    pub limits: LimitArgs,
    /// An image the server runs (repeatable):
    /// `NAME[@DIGEST]=builtin:demo | exec:PROGRAM [ARGS…] | proxy:ws://HOST:PORT | oci:DIR`.
    /// A DIGEST pins the image; without one any well-formed digest is accepted,
    /// except for `oci:DIR` (an OCI image layout, run in a container with runc),
    /// which serves only the layout's own manifest digest.
    /// Default: demo=builtin:demo.
    #[arg(
        long = "agent",
        value_name = "SPEC",
        help_heading = "Runs and containers"
    )]
    pub agents: Vec<AgentSpec>,
    /// A registry whose images are run (repeatable): `HOST[:PORT]`, as
    /// written in the references of `registry` images, pulled over HTTPS.
    /// Without any, `registry` images are refused.
    #[arg(
        long = "registry",
        value_name = "HOST[:PORT]",
        help_heading = "Runs and containers"
    )]
    pub registries: Vec<String>,
    /// A registry pulled from over plain HTTP (repeatable); also allowed.
    #[arg(
        long = "insecure-registry",
        value_name = "HOST[:PORT]",
        help_heading = "Runs and containers"
    )]
    pub insecure_registries: Vec<String>,
    /// The largest registry image (manifest, configuration and compressed
    /// layers), bytes (K/M/G suffixes); at most 1024G.
    #[arg(long, default_value = "2G", value_parser = crate::size::at_most("1024G"), help_heading = "Runs and containers")]
    pub max_image_size: u64,
    // --- hostile registries (issue 26) ---
    /// A host (`HOST[:PORT]`) a registry may redirect blob downloads to, a
    /// blob CDN (repeatable). No other redirect is followed; a mirror named
    /// by host name is only reached at public addresses.
    #[arg(
        long = "registry-mirror",
        value_name = "HOST[:PORT]",
        help_heading = "Runs and containers"
    )]
    pub registry_mirrors: Vec<String>,
    /// An HTTP proxy every registry request goes through
    /// (`http://HOST:PORT`). The environment's HTTP_PROXY, HTTPS_PROXY and
    /// ALL_PROXY are not used for pulls: a proxy resolves names where the
    /// server cannot hold mirrors and token realms to public addresses;
    /// through this one, their names are checked here first.
    #[arg(long, value_name = "URL", help_heading = "Runs and containers")]
    pub registry_proxy: Option<String>,
    /// How long one registry pull (manifests and blobs) may take, all told
    /// (a duration: 30s, 2m, or seconds); at most 24h.
    #[arg(long, value_name = "DURATION", value_parser = crate::seconds::at_most("24h", true), default_value = "10m", help_heading = "Runs and containers")]
    pub pull_timeout: Duration,
    /// Registry pulls fetching at once; more wait for a place.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..), help_heading = "Runs and containers")]
    pub max_pulls: u32,
    /// A registry image may unpack to at most this many times its
    /// compressed size (--max-image-size bounds that size).
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Runs and containers")]
    pub max_unpack_ratio: u64,
    /// Containers (`oci:` entries, registry images): the store of pulled
    /// blobs, unpacked images and runs [default: /var/lib/runloop for root].
    #[arg(long, value_name = "DIR", help_heading = "Runs and containers")]
    pub store: Option<PathBuf>,
    /// Containers: how long between the stop signal and SIGKILL (a
    /// duration); at most 1h.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = crate::seconds::at_most("1h", false), help_heading = "Runs and containers")]
    pub container_grace: Duration,
    /// Containers: how long an agent has to accept TCP on its port (a
    /// duration); at most 1h.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = crate::seconds::at_most("1h", true), help_heading = "Runs and containers")]
    pub container_startup_timeout: Duration,
    /// Containers: processes one container may have at once (runsc: its
    /// sandbox gets 2 × N + 256 host threads, its own kernel's included).
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..), help_heading = "Runs and containers")]
    pub container_pids: u32,
    /// Containers: the OCI runtime that runs them, `runc` or `runsc`
    /// (gVisor), found in PATH.
    #[arg(long, value_name = "RUNTIME", value_enum, default_value_t = OciRuntimeArg::Runc, help_heading = "Runs and containers")]
    pub oci_runtime: OciRuntimeArg,
    /// Containers: the host ids their user and group ids 0..COUNT are,
    /// `START:COUNT` (their root is the host's START, an unprivileged id)
    /// [default: the `runloop` user's /etc/subuid and /etc/subgid ranges,
    /// else 2000000000:65536].
    #[arg(long, value_name = "START:COUNT", help_heading = "Runs and containers")]
    pub container_uid_range: Option<IdRange>,
    /// Containers: CPUs' worth of time one may use (a fraction is a share
    /// of one CPU) [default: half the machine's CPUs, at least 1].
    #[arg(long, value_name = "CPUS", help_heading = "Runs and containers")]
    pub container_cpus: Option<f64>,
    /// Containers: files one container's process may have open at once
    /// (RLIMIT_NOFILE).
    #[arg(long, value_name = "N", default_value_t = runloop_oci::host::DEFAULT_NOFILE, value_parser = clap::value_parser!(u64).range(16..), help_heading = "Runs and containers")]
    pub container_nofile: u64,
    /// Containers: whether the agent runs under a small init as PID 1,
    /// which passes signals on and reaps (an agent that is PID 1 itself
    /// ignores a SIGTERM it has no handler for).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set, help_heading = "Runs and containers")]
    pub container_init: bool,
    /// Containers: give each run a way out, NAT'd to the host's uplink
    /// (agents that call model APIs need it): a veth and a /30 of
    /// --container-egress-network per run, its address claimed host-wide.
    /// Never to the host's own services, another run or 169.254.0.0/16,
    /// and never a way in: the agent is still reached on its loopback.
    /// Off: a run reaches nothing beyond itself. Needs nft; turns
    /// net.ipv4.ip_forward on.
    #[arg(long, help_heading = "Runs and containers")]
    pub container_egress: bool,
    /// A registry image to keep warm (--warm containers, or its
    /// [pool."REFERENCE"] table's), of a registry this server pulls from
    /// and pinned by digest (`HOST/REPO[:TAG]@sha256:…`), pulled at startup
    /// as the server's own; runs naming the same digest take its warm
    /// containers. Repeatable.
    #[arg(long, value_name = "REFERENCE", help_heading = "Runs and containers")]
    pub warm_image: Vec<String>,
    /// Containers with --container-egress: the IPv4 network their
    /// addresses come from, a /30 a run (a /16 is 16384 runs); one the
    /// host does not otherwise use.
    #[arg(long, value_name = "CIDR", default_value_t = runloop_oci::egress::DEFAULT_NETWORK, help_heading = "Runs and containers")]
    pub container_egress_network: EgressNetwork,
    /// `exec:` entries: what to do with a run's `disk`, which a host process
    /// cannot be held to. `refuse`: every exec run is refused, saying so;
    /// `unenforced`: runs go ahead, and `disk` is not held.
    #[arg(long, value_name = "POLICY", value_enum, default_value_t = ExecDisk::Refuse, hide_possible_values = true, help_heading = "Exec")]
    pub exec_disk: ExecDisk,
    /// `exec:` entries: the network a run's agent program gets. `own`: a
    /// network namespace of the run's own with loopback only (it listens
    /// on 127.0.0.1:8080 there and reaches no other run, no host service
    /// and no other machine; needs root, else runs go on the host's and
    /// the server says so); `host`: the host's network, the internet (model
    /// APIs) and the host's services included, on a leased port.
    #[arg(long, value_name = "NETWORK", value_enum, default_value_t = ExecNetworkArg::Own, hide_possible_values = true, help_heading = "Exec")]
    pub exec_network: ExecNetworkArg,
    /// `exec:` entries: how long the program has to accept TCP on $PORT (a
    /// duration); at most 1h.
    #[arg(long, value_name = "DURATION", value_parser = crate::seconds::at_most("1h", true), default_value = "60s", help_heading = "Exec")]
    pub startup_timeout: Duration,
    /// `exec:` entries: processes (and threads) one run may have at once
    /// (with cgroups).
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..), help_heading = "Exec")]
    pub exec_pids: u32,
    /// Lines of one run's agent output (stdout and stderr) logged per 10 s;
    /// the rest is counted in an "N lines suppressed" line.
    #[arg(long, value_name = "N", default_value_t = OutputLimit::default().lines, help_heading = "Exec")]
    pub agent_output_lines: u64,
    /// Bytes of one run's agent output logged per 10 s (K/M/G suffixes);
    /// at most 1G. Each tenant's runs together are held to
    /// --tenant-log-rate as well.
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = crate::size::at_most("1G"), help_heading = "Exec")]
    pub agent_output_bytes: u64,
    // --- operations (issue 16): TLS, the admin listener, drain, logs ---
    /// Serve wss://: the certificate chain, PEM, leaf first. Reloaded with
    /// the key on SIGHUP.
    #[arg(long, value_name = "FILE", help_heading = "TLS")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, PEM (PKCS#8, RSA or EC).
    #[arg(long, value_name = "FILE", help_heading = "TLS")]
    pub tls_key: Option<PathBuf>,
    /// Listen without TLS on an address that is not loopback: only where
    /// something in front (a load balancer) adds TLS.
    #[arg(long, help_heading = "TLS")]
    pub allow_plaintext: bool,
    /// Serve GET /metrics (Prometheus), /healthz and /readyz over HTTP on
    /// this address. Off by default.
    #[arg(long, value_name = "ADDR", help_heading = "Operations")]
    pub admin: Option<SocketAddr>,
    /// How long the open connections are served after SIGTERM before the
    /// loops still running are ended with the server's error (a duration;
    /// a second signal ends them at once); at most 24h.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = crate::seconds::at_most("24h", false), help_heading = "Operations")]
    pub drain_timeout: Duration,
    /// How log lines are written (`--log-format`).
    #[command(flatten, next_help_heading = "Operations")]
    pub logs: LogArgs,
}

/// `--oci-runtime`: which OCI runtime runs the containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OciRuntimeArg {
    /// runc: the host's kernel, namespaces, a user namespace, seccomp.
    Runc,
    /// runsc (gVisor): a kernel of its own in user space between the
    /// agent and the host's.
    Runsc,
}

/// `--exec-network`: where an exec run's agent program listens, and what
/// it reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExecNetworkArg {
    /// A network namespace of the run's own, loopback only.
    Own,
    /// The host's network.
    Host,
}

/// `--exec-disk`: what the exec runtime does with a `disk` it cannot hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExecDisk {
    /// Refuse every exec run, saying why.
    Refuse,
    /// Run, with `disk` not held.
    Unenforced,
}
