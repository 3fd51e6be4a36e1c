//! The one table of the server's limits: each declared once, with its key
//! (the option `--KEY` and the configuration file's `KEY`), its unit, its
//! default, its help, whether SIGHUP changes it, the library's [`Limit`]
//! that holds its minimum, and where it goes in the [`ServerConfig`].
//!
//! Everything else is made from the table: the options of `serve` (clap's
//! builder API, through [`LimitArgs`]), so also the keys of a
//! configuration file, `--print-config` and `--check-config`; the name a
//! refusal below a minimum gives ([`option`]); and the table of limits in
//! the README and docs/operating.md ([`markdown`], held to the documents
//! by tests/docs.rs). Adding a limit to `serve` is one row here, beside
//! its field and its [`Limit`] in the library.

use std::time::Duration;

use clap::builder::ValueParser;
use clap::{Arg, ArgAction, ArgMatches};
use runloop::limits::Limit;
use runloop::server::ServerConfig;
use runloop_oci::HostConfig;

/// How a limit is written and read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A whole number.
    Count,
    /// Bytes, with an optional K, M or G suffix.
    Bytes,
    /// A duration: `30s`, `2m`, `500ms`, or a bare number of seconds.
    Duration,
    /// Web origins (`https://app.example.com`), the option repeated (its
    /// file key is the plural, a list).
    Origins,
}

/// A limit's value, as its unit reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A [`Unit::Count`].
    Count(usize),
    /// A [`Unit::Bytes`].
    Bytes(u64),
    /// A [`Unit::Duration`].
    Duration(Duration),
    /// A [`Unit::Origins`].
    Origins(Vec<String>),
}

impl Value {
    fn count(self) -> usize {
        match self {
            Value::Count(n) => n,
            Value::Bytes(n) => usize::try_from(n).unwrap_or(usize::MAX),
            Value::Duration(d) => usize::try_from(d.as_secs()).unwrap_or(usize::MAX),
            Value::Origins(origins) => origins.len(),
        }
    }

    fn origins(self) -> Vec<String> {
        match self {
            Value::Origins(origins) => origins,
            _ => Vec::new(),
        }
    }

    fn bytes(self) -> u64 {
        match self {
            Value::Bytes(n) => n,
            other => other.count() as u64,
        }
    }

    fn duration(self) -> Duration {
        match self {
            Value::Duration(d) => d,
            other => Duration::from_secs(other.bytes()),
        }
    }
}

/// One limit of the server.
pub struct Row {
    /// The option (`--KEY`) and the configuration file's key.
    pub key: &'static str,
    /// The library's limit: its minimum and why. `None`: no minimum.
    pub limit: Option<Limit>,
    /// How it is written.
    pub unit: Unit,
    /// Its default as written; `None`: made at startup (see `help`).
    pub default: Option<&'static str>,
    /// The most it may be, as written (a size or a duration always has
    /// one: a value past any sane use, such as an authorization grace of
    /// 999999h, is refused where it is given); `None`: a count, bounded
    /// by what the descriptors allow.
    pub maximum: Option<&'static str>,
    /// What it bounds, and what happens past it.
    pub help: &'static str,
    /// Whether SIGHUP applies a change to it (to what comes next).
    pub live: bool,
    /// Where its value goes.
    pub set: Set,
}

/// Where a limit's value goes: the server's configuration, or the
/// container host's.
#[derive(Clone, Copy)]
pub enum Set {
    /// A field of the [`ServerConfig`].
    Server(fn(&mut ServerConfig, Value)),
    /// A field of the [`HostConfig`] (containers' limits).
    Host(fn(&mut HostConfig, Value)),
}

/// Every limit of `serve`, in the order `--help` shows them.
pub static LIMITS: [Row; 32] = [
    Row {
        key: "max-message-size",
        limit: Some(Limit::MaxMessageSize),
        unit: Unit::Bytes,
        default: Some("16M"),
        maximum: Some("1G"),
        help: "The largest message a connection may send; a larger one ends the connection (close code 1009)",
        live: false,
        set: Set::Server(|c, v| c.limits.max_message_size = v.count()),
    },
    Row {
        key: "max-scopes",
        limit: Some(Limit::MaxScopes),
        unit: Unit::Count,
        default: Some("256"),
        maximum: None,
        help: "Open scopes (runs) per connection; one more gets a bare finish",
        live: false,
        set: Set::Server(|c, v| c.limits.max_scopes = v.count()),
    },
    Row {
        key: "max-channels",
        limit: Some(Limit::MaxChannels),
        unit: Unit::Count,
        default: Some("64"),
        maximum: None,
        help: "Open channels per scope; one more gets a bare channel finish",
        live: false,
        set: Set::Server(|c, v| c.limits.max_channels = v.count()),
    },
    Row {
        key: "max-queued-responses",
        limit: Some(Limit::MaxQueuedResponses),
        unit: Unit::Count,
        default: Some("256"),
        maximum: None,
        help: "Responses one loop may have queued for a slow caller before the server stops reading its proxy",
        live: false,
        set: Set::Server(|c, v| c.limits.max_queued_responses = v.count()),
    },
    Row {
        key: "max-queued-bytes",
        limit: Some(Limit::MaxQueuedBytes),
        unit: Unit::Bytes,
        default: Some("256K"),
        maximum: Some("1G"),
        help: "Bytes one loop may have queued for a slow caller before the server stops reading its proxy (a larger chunk still goes, alone)",
        live: false,
        set: Set::Server(|c, v| c.limits.max_queued_bytes = v.count()),
    },
    Row {
        key: "max-connection-queued-bytes",
        limit: Some(Limit::MaxConnectionQueuedBytes),
        unit: Unit::Bytes,
        default: Some("16M"),
        maximum: Some("4G"),
        help: "Bytes all loops of one connection together may have queued for a slow caller",
        live: false,
        set: Set::Server(|c, v| c.limits.max_connection_queued_bytes = v.count()),
    },
    Row {
        key: "authorization-grace",
        limit: Some(Limit::AuthorizationGrace),
        unit: Unit::Duration,
        default: Some("10s"),
        maximum: Some("10m"),
        help: "How long a new connection may take to authorize (its WebSocket handshake included) before it is closed with no frame",
        live: false,
        set: Set::Server(|c, v| c.authorization_grace = v.duration()),
    },
    Row {
        key: "max-connections",
        limit: Some(Limit::MaxConnections),
        unit: Unit::Count,
        default: Some("1024"),
        maximum: None,
        help: "Connections served at once; one more is closed at once with close code 1013 (try again later) and a reason",
        live: false,
        set: Set::Server(|c, v| c.max_connections = v.count()),
    },
    Row {
        key: "max-unauthorized",
        limit: Some(Limit::MaxUnauthorized),
        unit: Unit::Count,
        default: Some("256"),
        maximum: None,
        help: "Connections not yet authorized, at once (those turned away with 1013 included); one more is told why with close code 1013 and a reason while a refusal place is free (32 in all, 2 per address), else closed at once, nothing of it read",
        live: false,
        set: Set::Server(|c, v| c.admission.max_unauthorized = v.count()),
    },
    Row {
        key: "max-connections-per-address",
        limit: Some(Limit::MaxConnectionsPerAddress),
        unit: Unit::Count,
        default: Some("64"),
        maximum: None,
        help: "Connections from one IP address, authorized or not; one more is closed at once, nothing of it read",
        live: false,
        set: Set::Server(|c, v| c.admission.max_connections_per_address = v.count()),
    },
    Row {
        key: "allow-origin",
        limit: None,
        unit: Unit::Origins,
        default: None,
        maximum: None,
        help: "A web page's origin (https://app.example.com) that may connect from a browser: an upgrade whose Origin is not one of these gets HTTP 403, and one that is never authorizes with an empty credential; callers that send no Origin are unaffected [default: none: no browser page]",
        live: false,
        set: Set::Server(|c, v| c.allowed_origins = v.origins()),
    },
    Row {
        key: "max-connections-per-identity",
        limit: Some(Limit::MaxConnectionsPerIdentity),
        unit: Unit::Count,
        default: Some("256"),
        maximum: None,
        help: "Authorized connections of one tenant unless its quota says otherwise, and never over half of --max-connections; one more is closed with close code 1013 and a reason (without tokens every caller is one tenant, held by --max-connections alone)",
        live: true,
        set: Set::Server(|c, v| c.admission.max_connections_per_identity = v.count()),
    },
    Row {
        key: "handshake-rate",
        limit: None,
        unit: Unit::Count,
        default: Some("0"),
        maximum: None,
        help: "New connections one IP address may open per second (a token bucket of as many, refilled evenly); one more is closed with close code 1013 and a reason; 0: no rate (callers behind one load balancer or NAT share its address)",
        live: false,
        set: Set::Server(|c, v| c.admission.handshake_rate = v.count()),
    },
    Row {
        key: "handshake-timeout",
        limit: Some(Limit::HandshakeTimeout),
        unit: Unit::Duration,
        default: Some("3s"),
        maximum: Some("10m"),
        help: "How long a new connection may take for its TCP connection and WebSocket handshake",
        live: false,
        set: Set::Server(|c, v| c.admission.handshake_timeout = v.duration()),
    },
    Row {
        key: "max-authorization-size",
        limit: Some(Limit::MaxAuthorizationSize),
        unit: Unit::Bytes,
        default: Some("64K"),
        maximum: Some("16M"),
        help: "The largest message before authorization; a larger one closes the connection, never read whole",
        live: false,
        set: Set::Server(|c, v| c.admission.max_authorization_size = v.count()),
    },
    Row {
        key: "max-runs",
        limit: Some(Limit::MaxRuns),
        unit: Unit::Count,
        default: Some("256"),
        maximum: None,
        help: "Runs held at once, server-wide; one more is refused with an error naming the limit",
        live: false,
        set: Set::Server(|c, v| c.budget.max_runs = v.count()),
    },
    Row {
        key: "max-runs-per-identity",
        limit: Some(Limit::MaxRunsPerIdentity),
        unit: Unit::Count,
        default: Some("64"),
        maximum: None,
        help: "Runs one tenant may hold at once unless its quota says otherwise, and never over half of --max-runs (without tokens every caller is one tenant, held by --max-runs alone)",
        live: true,
        set: Set::Server(|c, v| c.budget.max_runs_per_identity = v.count()),
    },
    Row {
        key: "max-loops-per-identity",
        limit: Some(Limit::MaxLoopsPerIdentity),
        unit: Unit::Count,
        default: Some("128"),
        maximum: None,
        help: "Loops (run-loop channels) one tenant may have served at once, over all its runs, unless its quota says otherwise; one more is answered with an error naming the limit (without tokens every caller is one tenant, held by --max-runs and --max-channels alone)",
        live: true,
        set: Set::Server(|c, v| c.budget.max_loops_per_identity = v.count()),
    },
    Row {
        key: "max-run-memory",
        limit: Some(Limit::MaxRunMemory),
        unit: Unit::Bytes,
        default: Some("4G"),
        maximum: Some("16384G"),
        help: "The largest `memory` a run may ask for",
        live: false,
        set: Set::Server(|c, v| c.budget.max_run_memory = v.bytes()),
    },
    Row {
        key: "max-run-disk",
        limit: None,
        unit: Unit::Bytes,
        default: Some("16G"),
        maximum: Some("16384G"),
        help: "The largest `disk` a run may ask for",
        live: false,
        set: Set::Server(|c, v| c.budget.max_run_disk = v.bytes()),
    },
    Row {
        key: "memory-budget",
        limit: Some(Limit::MemoryBudget),
        unit: Unit::Bytes,
        default: None,
        maximum: Some("65536G"),
        help: "The most the `memory` of all runs held may add up to; a tenant holds half at most unless its quota says otherwise [default: 3/4 of MemTotal in /proc/meminfo]",
        live: false,
        set: Set::Server(|c, v| c.budget.memory_budget = v.bytes()),
    },
    Row {
        key: "disk-budget",
        limit: Some(Limit::DiskBudget),
        unit: Unit::Bytes,
        default: None,
        maximum: Some("1048576G"),
        help: "The most the `disk` of all runs held may add up to; a tenant holds half at most unless its quota says otherwise [default: 3/4 of the filesystem of --store]",
        live: false,
        set: Set::Server(|c, v| c.budget.disk_budget = v.bytes()),
    },
    Row {
        key: "store-max-size",
        limit: None,
        unit: Unit::Bytes,
        default: None,
        maximum: Some("1048576G"),
        help: "The most the container store's images (pulled blobs and unpacked roots) may take; after each new image, the least recently used ones no run holds are removed until they fit (`runloop store gc` does it by hand) [default: 1/4 of the filesystem of --store]",
        live: false,
        set: Set::Host(|c, v| c.store_max_size = Some(v.bytes())),
    },
    Row {
        key: "warm",
        limit: None,
        unit: Unit::Count,
        default: Some("0"),
        maximum: Some("256"),
        help: "Containers of each oci: entry kept started (disk, network namespace, container, agent listening) for runs to take: a run whose memory and disk fit --warm-memory and --warm-disk takes one (held to what it asked for) and only registers; a warm container serves one run and is torn down after it, and another is started in its place; each one's memory and disk are claimed of the server's budgets (memory-budget, disk-budget), not a tenant's; a [pool.\"NAME\"] table of the configuration file sets one entry's own warm, memory and disk",
        live: false,
        set: Set::Host(|c, v| c.warm.size = v.count()),
    },
    Row {
        key: "warm-memory",
        limit: None,
        unit: Unit::Bytes,
        default: Some("1G"),
        maximum: Some("1048576G"),
        help: "The memory of a warm container (--warm): a run asking for more starts cold",
        live: false,
        set: Set::Host(|c, v| c.warm.memory = v.bytes()),
    },
    Row {
        key: "warm-disk",
        limit: None,
        unit: Unit::Bytes,
        default: Some("1G"),
        maximum: Some("1048576G"),
        help: "The disk of a warm container (--warm): a run asking for more starts cold",
        live: false,
        set: Set::Host(|c, v| c.warm.disk = v.bytes()),
    },
    Row {
        key: "message-idle-timeout",
        limit: Some(Limit::MessageIdleTimeout),
        unit: Unit::Duration,
        default: Some("30s"),
        maximum: Some("1h"),
        help: "How long a message that has begun may go without progress before its connection is closed (what it has sent counts against its tenant's memory share and --memory-budget until then; a message that does not fit closes its connection)",
        live: false,
        set: Set::Server(|c, v| c.message_idle_timeout = v.duration()),
    },
    Row {
        key: "revoked-grace",
        limit: None,
        unit: Unit::Duration,
        default: Some("60s"),
        maximum: Some("24h"),
        help: "How long the running loops of a connection whose tenant or token a reload removed go on before the connection is closed; it opens no new run or loop meanwhile; 0: closed at once",
        live: false,
        set: Set::Server(|c, v| c.revoked_grace = v.duration()),
    },
    Row {
        key: "max-unauthorized-per-address",
        limit: Some(Limit::MaxUnauthorizedPerAddress),
        unit: Unit::Count,
        default: Some("16"),
        maximum: None,
        help: "Connections from one IP address not yet authorized (TCP, TLS handshake and upgrade included), at once, looked at before --max-unauthorized so that strangers on a few addresses cannot take every place; one more is told why with close code 1013 and a reason while a refusal place is free, else closed at once",
        live: false,
        set: Set::Server(|c, v| c.max_unauthorized_per_address = v.count()),
    },
    Row {
        key: "credential-failure-rate",
        limit: Some(Limit::CredentialFailureRate),
        unit: Unit::Count,
        default: Some("10"),
        maximum: Some("1000"),
        help: "Failed credential checks one IP address may have per second (a token bucket of as many, refilled evenly); past it, that address's next checks wait their turn",
        live: false,
        set: Set::Server(|c, v| c.credential_failure_rate = v.count()),
    },
    Row {
        key: "tenant-cpu-weight",
        limit: Some(Limit::TenantCpuWeight),
        unit: Unit::Count,
        default: Some("100"),
        maximum: Some("10000"),
        help: "The CPU weight of a tenant whose quota names none (`cpu-weight`): each tenant's exec and oci runs share one weight, a cgroup of the tenant's over theirs (cgroup v2's cpu.weight scale; cpu.shares = weight × 1024 / 100 on v1), so a tenant with many runs gets no more CPU than one with few when both want it",
        live: false,
        set: Set::Server(|c, v| c.tenant_cpu_weight = u32::try_from(v.count()).unwrap_or(u32::MAX)),
    },
    Row {
        key: "tenant-log-rate",
        limit: None,
        unit: Unit::Bytes,
        default: Some("64K"),
        maximum: Some("1G"),
        help: "Bytes of agent output (stdout and stderr) one tenant's runs together may put in the server's log per second; past it, lines are dropped, counted in runloop_agent_log_dropped_lines_total and said in one line per run when they resume; 0: none is logged",
        live: false,
        set: Set::Server(|c, v| c.tenant_log_rate = v.bytes()),
    },
];

impl Row {
    /// The option as clap builds it.
    fn arg(&self) -> Arg {
        let unit = match self.unit {
            Unit::Count => "",
            Unit::Bytes => "; bytes, K/M/G suffixes",
            Unit::Duration => "; a duration: 30s, 2m, 500ms or seconds",
            Unit::Origins => "; repeatable (the configuration file's key: allowed-origins, a list)",
        };
        let minimum = self
            .limit
            .map(|limit| format!("; at least {}", minimum(limit)))
            .unwrap_or_default();
        let maximum = self
            .maximum
            .map(|most| format!("; at most {most}"))
            .unwrap_or_default();
        let (help, note) = match self.help.split_once(" [default: ") {
            Some((help, note)) => (help, format!(" [default: {note}")),
            None => (self.help, String::new()),
        };
        let arg = Arg::new(self.key)
            .long(self.key)
            .help(format!("{help}{unit}{minimum}{maximum}{note}"))
            .help_heading("Limits")
            .value_name(match self.unit {
                Unit::Count => "N",
                Unit::Bytes => "SIZE",
                Unit::Duration => "DURATION",
                Unit::Origins => "ORIGIN",
            })
            .value_parser(match (self.unit, self.maximum) {
                (Unit::Count, None) => clap::value_parser!(usize).into(),
                (Unit::Count, Some(most)) => ValueParser::new(count_at_most(most)),
                (Unit::Bytes, None) => ValueParser::new(crate::size::bytes),
                (Unit::Bytes, Some(most)) => ValueParser::new(crate::size::at_most(most)),
                (Unit::Duration, None) => ValueParser::new(crate::seconds::duration),
                (Unit::Duration, Some(most)) => {
                    ValueParser::new(crate::seconds::at_most(most, false))
                }
                (Unit::Origins, _) => ValueParser::new(origin),
            });
        let arg = match self.unit {
            // One origin an option; the file's key is the list's name.
            Unit::Origins => arg.action(ArgAction::Append).alias("allowed-origins"),
            _ => arg,
        };
        match self.default {
            Some(default) => arg.default_value(default),
            None => arg,
        }
    }

    /// Its value in `matches`, if it has one.
    fn value(&self, matches: &ArgMatches) -> Result<Option<Value>, clap::Error> {
        let wrong = |error: clap::parser::MatchesError| {
            clap::Error::raw(clap::error::ErrorKind::InvalidValue, error.to_string())
        };
        Ok(match self.unit {
            Unit::Count => matches
                .try_get_one::<usize>(self.key)
                .map_err(wrong)?
                .map(|n| Value::Count(*n)),
            Unit::Bytes => matches
                .try_get_one::<u64>(self.key)
                .map_err(wrong)?
                .map(|n| Value::Bytes(*n)),
            Unit::Duration => matches
                .try_get_one::<Duration>(self.key)
                .map_err(wrong)?
                .map(|d| Value::Duration(*d)),
            Unit::Origins => matches
                .try_get_many::<String>(self.key)
                .map_err(wrong)?
                .map(|origins| Value::Origins(origins.cloned().collect())),
        })
    }
}

/// An origin as `--allow-origin` takes it.
fn origin(text: &str) -> Result<String, String> {
    match runloop::server::invalid_origin(text) {
        Some(why) => Err(why),
        None => Ok(text.to_owned()),
    }
}

/// A clap value parser of a whole number of at most `max`.
fn count_at_most(
    max: &'static str,
) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    move |text: &str| {
        let value: usize = text
            .trim()
            .parse()
            .map_err(|_| format!("{text:?} is not a whole number"))?;
        match max.parse::<usize>() {
            Ok(most) if value > most => {
                Err(format!("{text:?} is more than the most it may be, {max}"))
            }
            _ => Ok(value),
        }
    }
}

/// A limit's minimum as an option's value is written: `4K`, `1`, `1s`.
fn minimum(limit: Limit) -> String {
    let shown = limit.minimum();
    if let Some(bytes) = shown
        .strip_suffix(" bytes")
        .and_then(|n| n.parse::<u64>().ok())
    {
        return match bytes {
            n if n % (1 << 20) == 0 => format!("{}M", n >> 20),
            n if n % (1 << 10) == 0 => format!("{}K", n >> 10),
            n => n.to_string(),
        };
    }
    shown
}

/// The row of `key`.
pub fn row(key: &str) -> Option<&'static Row> {
    LIMITS.iter().find(|row| row.key == key)
}

/// The option that sets `limit`, for a refusal below its minimum.
pub fn option(limit: Limit) -> String {
    LIMITS
        .iter()
        .find(|row| row.limit == Some(limit))
        .map_or_else(|| limit.name().to_owned(), |row| format!("--{}", row.key))
}

/// The limits' options of `serve`, made from [`LIMITS`]: their values as
/// given, by row.
#[derive(Debug, Clone, Default)]
pub struct LimitArgs {
    values: Vec<(&'static str, Value)>,
}

impl LimitArgs {
    /// The value of `key`, given or its default.
    pub fn get(&self, key: &str) -> Option<Value> {
        self.values
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, value)| value.clone())
    }

    /// Puts every value given (or defaulted) of the server into `config`.
    pub fn apply(&self, config: &mut ServerConfig) {
        for (key, value) in &self.values {
            if let Some(Row {
                set: Set::Server(set),
                ..
            }) = row(key)
            {
                set(config, value.clone());
            }
        }
    }

    /// Puts every value given (or defaulted) of the container host into
    /// `config`.
    pub fn apply_host(&self, config: &mut HostConfig) {
        for (key, value) in &self.values {
            if let Some(Row {
                set: Set::Host(set),
                ..
            }) = row(key)
            {
                set(config, value.clone());
            }
        }
    }

    /// A size given to `key`, if any.
    pub fn bytes(&self, key: &str) -> Option<u64> {
        self.get(key).map(Value::bytes)
    }
}

impl clap::FromArgMatches for LimitArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut values = Vec::new();
        for row in &LIMITS {
            if let Some(value) = row.value(matches)? {
                values.push((row.key, value));
            }
        }
        Ok(LimitArgs { values })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = LimitArgs::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for LimitArgs {
    fn augment_args(command: clap::Command) -> clap::Command {
        LIMITS
            .iter()
            .fold(command, |command, row| command.arg(row.arg()))
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        LimitArgs::augment_args(command)
    }
}

/// The table of limits as the README and docs/operating.md show it.
pub fn markdown() -> String {
    let mut table = String::from(
        "| option / key | default | minimum | maximum | SIGHUP | what |\n|---|---|---|---|---|---|\n",
    );
    for row in &LIMITS {
        let (help, note) = match row.help.split_once(" [default: ") {
            Some((help, note)) => (help, note.trim_end_matches(']')),
            None => (row.help, ""),
        };
        let default = row.default.unwrap_or(note);
        let minimum = row.limit.map(minimum).unwrap_or_else(|| "—".to_owned());
        let maximum = row.maximum.unwrap_or("—");
        let live = if row.live { "applied" } else { "restart" };
        table.push_str(&format!(
            "| `{}` | {default} | {minimum} | {maximum} | {live} | {help} |\n",
            row.key
        ));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_library_limit_has_a_row_and_no_key_is_twice() {
        for &limit in Limit::ALL {
            assert!(option(limit).starts_with("--"), "{limit}");
            // The key is the library's name, spelled as an option.
            assert_eq!(
                option(limit),
                format!("--{}", limit.name().replace('_', "-"))
            );
        }
        for (i, row) in LIMITS.iter().enumerate() {
            assert!(LIMITS[..i].iter().all(|r| r.key != row.key), "{}", row.key);
        }
    }

    #[test]
    fn the_defaults_are_the_library_s() {
        let mut config = ServerConfig::new(
            runloop::server::Credentials::Any,
            runloop::runtime::Catalog::new(),
        );
        let library = (
            config.limits,
            config.admission,
            config.budget,
            config.max_connections,
        );
        let command = <LimitArgs as clap::Args>::augment_args(clap::Command::new("t"));
        let matches = command
            .try_get_matches_from(["t"])
            .expect("the defaults parse");
        let args = <LimitArgs as clap::FromArgMatches>::from_arg_matches(&matches).expect("args");
        args.apply(&mut config);
        assert_eq!(
            (
                config.limits,
                config.admission,
                config.budget,
                config.max_connections
            ),
            library
        );
        assert_eq!(config.authorization_grace, Duration::from_secs(10));
        let library = ServerConfig::new(
            runloop::server::Credentials::Any,
            runloop::runtime::Catalog::new(),
        );
        assert_eq!(
            (
                config.message_idle_timeout,
                config.revoked_grace,
                config.max_unauthorized_per_address,
                config.credential_failure_rate,
                config.tenant_cpu_weight,
                config.tenant_log_rate,
            ),
            (
                library.message_idle_timeout,
                library.revoked_grace,
                library.max_unauthorized_per_address,
                library.credential_failure_rate,
                library.tenant_cpu_weight,
                library.tenant_log_rate,
            )
        );
    }

    #[test]
    fn the_new_walls_reach_their_fields() {
        let command = <LimitArgs as clap::Args>::augment_args(clap::Command::new("t"));
        let matches = command
            .try_get_matches_from([
                "t",
                "--message-idle-timeout=45s",
                "--revoked-grace=0",
                "--max-unauthorized-per-address=3",
                "--credential-failure-rate=5",
                "--tenant-cpu-weight=250",
                "--tenant-log-rate=16K",
            ])
            .expect("parses");
        let args = <LimitArgs as clap::FromArgMatches>::from_arg_matches(&matches).expect("args");
        let mut config = ServerConfig::new(
            runloop::server::Credentials::Any,
            runloop::runtime::Catalog::new(),
        );
        args.apply(&mut config);
        assert_eq!(config.message_idle_timeout, Duration::from_secs(45));
        assert_eq!(config.revoked_grace, Duration::ZERO);
        assert_eq!(config.max_unauthorized_per_address, 3);
        assert_eq!(config.credential_failure_rate, 5);
        assert_eq!(config.tenant_cpu_weight, 250);
        assert_eq!(config.tenant_log_rate, 16 << 10);
        for (key, bad) in [
            ("--tenant-cpu-weight", "10001"),
            ("--revoked-grace", "25h"),
            ("--tenant-log-rate", "2G"),
            ("--message-idle-timeout", "2h"),
        ] {
            let command = <LimitArgs as clap::Args>::augment_args(clap::Command::new("t"));
            assert!(
                command.try_get_matches_from(["t", key, bad]).is_err(),
                "{key} {bad}"
            );
        }
    }

    #[test]
    fn a_container_limit_goes_to_the_host_and_only_there() {
        let command = <LimitArgs as clap::Args>::augment_args(clap::Command::new("t"));
        let matches = command
            .try_get_matches_from([
                "t",
                "--store-max-size",
                "3G",
                "--warm",
                "4",
                "--warm-memory",
                "512M",
            ])
            .expect("parses");
        let args = <LimitArgs as clap::FromArgMatches>::from_arg_matches(&matches).expect("args");
        let mut host = HostConfig::new("/store");
        args.apply_host(&mut host);
        assert_eq!(host.store_max_size, Some(3 << 30));
        assert_eq!(
            host.warm,
            runloop_oci::PoolConfig {
                size: 4,
                memory: 512 << 20,
                disk: 1 << 30,
            }
        );
        let mut config = ServerConfig::new(
            runloop::server::Credentials::Any,
            runloop::runtime::Catalog::new(),
        );
        let before = (config.limits, config.admission, config.budget);
        args.apply(&mut config);
        assert_eq!((config.limits, config.admission, config.budget), before);
    }

    #[test]
    fn every_size_and_duration_has_a_maximum_that_parses_and_is_over_its_default() {
        for row in &LIMITS {
            let Some(most) = row.maximum else {
                assert!(
                    matches!(row.unit, Unit::Count | Unit::Origins),
                    "{} has no maximum",
                    row.key
                );
                continue;
            };
            let command = <LimitArgs as clap::Args>::augment_args(clap::Command::new("t"));
            let at = command
                .clone()
                .try_get_matches_from(["t", &format!("--{}={most}", row.key)]);
            assert!(at.is_ok(), "{} at its maximum {most}", row.key);
            if let Some(default) = row.default {
                let parse = |text: &str| match row.unit {
                    Unit::Count => text.parse::<u64>().ok(),
                    Unit::Bytes => crate::size::bytes(text).ok(),
                    Unit::Duration => crate::seconds::duration(text)
                        .ok()
                        .map(|d| d.as_millis() as u64),
                    Unit::Origins => None,
                };
                assert!(parse(default) <= parse(most), "{}", row.key);
            }
        }
        let command = <LimitArgs as clap::Args>::augment_args(clap::Command::new("t"));
        let refused = command
            .try_get_matches_from(["t", "--authorization-grace", "999999h"])
            .expect_err("past its maximum");
        assert!(
            refused
                .to_string()
                .contains("is more than the most it may be, 10m"),
            "{refused}"
        );
    }

    #[test]
    fn minimums_are_written_as_options_take_them() {
        assert_eq!(minimum(Limit::MaxMessageSize), "4K");
        assert_eq!(minimum(Limit::MaxRunMemory), "16M");
        assert_eq!(minimum(Limit::MaxRuns), "1");
        assert_eq!(minimum(Limit::HandshakeTimeout), "1s");
    }
}
