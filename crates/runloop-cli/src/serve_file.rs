//! The configuration file of `runloop serve` (`--config FILE`, TOML): the
//! options an operator keeps, comments and all, and checks before the
//! server starts.
//!
//! Every option of `serve` is a key of the same name (`max-runs = 256`,
//! `listen = "127.0.0.1:7878"`, `agent = ["demo=builtin:demo"]`), or of
//! its alias when it has one (`--allow-origin`: `allowed-origins`), its
//! value read by the option's own parser, so sizes take the same suffixes
//! (`"16M"`) and durations the same syntax (`"30s"`, `"2m"`, a bare number
//! of seconds) as on the command line. An option given on the command line
//! overrides the file's key. Beside them, `[[tenant]]` tables name tenants,
//! their tokens and quotas, and `[tenant-defaults]` sets the quotas a
//! tenant leaves out (see [`runloop::server::Quota`]); a `[pool."NAME"]`
//! table sets the warm pool of the `oci:` entry `NAME` (`warm`, `memory`,
//! `disk`; `--warm`, `--warm-memory` and `--warm-disk` otherwise).
//!
//! Reading the file reports every fault it finds, each naming its key (an
//! unknown key with the nearest valid one), not only the first: that is
//! what `serve --check-config` prints.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, FromArgMatches};
use runloop::server::{Quota, Tenant, Tenants, TokenHash};
use runloop::small_file;

use crate::serve_args::{Args, PoolEntry};
use crate::size::bytes;
use crate::token;

/// The largest configuration file read: far past any real one (the
/// example with every key and a hundred tenants is under 64 KiB).
pub const MAX_CONFIG_FILE: u64 = 1 << 20;

/// Keys that are options of the command but not of a file.
const NOT_KEYS: [&str; 4] = ["config", "check-config", "print-config", "help"];

/// The tables of a file beside the options' keys.
const TABLES: [&str; 3] = ["tenant", "tenant-defaults", "pool"];

/// The keys of a `[pool."NAME"]` table.
const POOL_KEYS: [&str; 3] = ["warm", "memory", "disk"];

/// The keys of a `[[tenant]]` table (the quotas are also those of
/// `[tenant-defaults]`).
const TENANT_KEYS: [&str; 3] = ["name", "token-file", "tokens"];
const QUOTA_KEYS: [&str; 8] = [
    "max-connections",
    "max-runs",
    "max-loops",
    "memory-budget",
    "disk-budget",
    "max-run-memory",
    "max-pulls",
    "cpu-weight",
];

/// The key of a file that stands for `arg`: its alias when it has one (a
/// repeatable option named for one value, such as `--allow-origin`, keeps
/// its list under a plural key, `allowed-origins`), else its long name.
fn file_key(arg: &clap::Arg) -> Option<&str> {
    arg.get_all_aliases()
        .and_then(|aliases| aliases.first().copied())
        .or(arg.get_long())
}

/// The `serve` command as clap sees it: its options, defaults and help.
pub fn command() -> clap::Command {
    <Args as clap::Args>::augment_args(clap::Command::new("serve"))
}

/// A file's options merged under the command line: the arguments, the
/// file's tenants, and every fault found on the way.
pub struct Merged {
    /// The arguments, when they could be made.
    pub args: Option<Args>,
    /// The merged options, value by value, as clap read them.
    pub matches: Option<ArgMatches>,
    /// Every fault, a line each, naming the file and key.
    pub faults: Vec<String>,
    /// The keys whose value came from the file.
    pub from_file: Vec<String>,
    /// The file's `[tenant-defaults]` and `[[tenant]]` tables as written,
    /// each `token-file` made absolute: printed with the effective
    /// configuration.
    pub tenant_tables: toml::Table,
}

/// The effective options of `config` (the file, if any) under
/// `command_line` (what followed `serve`).
pub fn merge(config: Option<&Path>, command_line: &[OsString]) -> Merged {
    let mut faults = Vec::new();
    let serve = command();
    let given = match serve.clone().try_get_matches_from(
        std::iter::once(OsString::from("serve")).chain(command_line.iter().cloned()),
    ) {
        Ok(matches) => matches,
        Err(error) => {
            return Merged {
                args: None,
                matches: None,
                faults: vec![first_line(&error)],
                from_file: Vec::new(),
                tenant_tables: toml::Table::new(),
            };
        }
    };
    let mut from_file = Vec::new();
    let mut file_keys = Vec::new();
    let mut tenants = None;
    let mut pools = std::collections::BTreeMap::new();
    let mut tenant_tables = toml::Table::new();
    if let Some(path) = config {
        match read(path) {
            Err(fault) => faults.push(fault),
            Ok(table) => {
                tenant_tables = tables_of(path, &table);
                let shown = path.display();
                for (key, value) in &table {
                    if TABLES.contains(&key.as_str()) {
                        continue;
                    }
                    let Some(arg) = serve.get_arguments().find(|a| {
                        file_key(a) == Some(key.as_str()) && !NOT_KEYS.contains(&key.as_str())
                    }) else {
                        faults.push(unknown(&shown.to_string(), key, &keys(&serve)));
                        continue;
                    };
                    let fragments = match fragments(key, arg, value) {
                        Ok(fragments) => fragments,
                        Err(fault) => {
                            faults.push(format!("{shown}: {key}: {fault}"));
                            continue;
                        }
                    };
                    // Each key is read alone by its option's parser, so that
                    // every bad value is reported, not just the first.
                    if let Err(error) = serve.clone().try_get_matches_from(
                        std::iter::once(OsString::from("serve")).chain(fragments.iter().cloned()),
                    ) && error.kind() != clap::error::ErrorKind::MissingRequiredArgument
                    {
                        faults.push(format!("{shown}: {key}: {}", first_line(&error)));
                        continue;
                    }
                    let id = arg.get_id().as_str();
                    if given.value_source(id) != Some(ValueSource::CommandLine) {
                        from_file.extend(fragments);
                        file_keys.push(key.clone());
                    }
                }
                let (file_tenants, tenant_faults) = read_tenants(path, &table);
                faults.extend(tenant_faults);
                tenants = file_tenants;
                pools = read_pools(path, &table, &mut faults);
            }
        }
    }
    let argv = std::iter::once(OsString::from("serve"))
        .chain(from_file)
        .chain(command_line.iter().cloned());
    let (args, matches) = match serve.try_get_matches_from(argv) {
        Ok(matches) => match Args::from_arg_matches(&matches) {
            Ok(mut args) => {
                args.command_line = command_line.to_vec();
                args.file_tenants = tenants;
                args.file_pools = pools;
                (Some(args), Some(matches))
            }
            Err(error) => {
                faults.push(first_line(&error));
                (None, None)
            }
        },
        Err(error) => {
            faults.push(first_line(&error));
            (None, None)
        }
    };
    Merged {
        args,
        matches,
        faults,
        from_file: file_keys,
        tenant_tables,
    }
}

/// The `[tenant-defaults]` and `[[tenant]]` tables of `table` (the file at
/// `path`), each tenant's `token-file` made absolute so that they mean
/// the same wherever they are printed to.
fn tables_of(path: &Path, table: &toml::Table) -> toml::Table {
    let mut tables = toml::Table::new();
    for key in TABLES {
        let Some(value) = table.get(key) else {
            continue;
        };
        let mut value = value.clone();
        if let toml::Value::Array(list) = &mut value {
            for entry in list {
                if let Some(toml::Value::String(file)) = entry
                    .as_table_mut()
                    .and_then(|entry| entry.get_mut("token-file"))
                {
                    *file = absolute(&beside(path, file)).display().to_string();
                }
            }
        }
        tables.insert(key.to_owned(), value);
    }
    tables
}

/// `path` made absolute against the working directory, as written
/// otherwise.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

/// The file at `path`, read (a regular file of at most
/// [`MAX_CONFIG_FILE`] bytes) and parsed.
fn read(path: &Path) -> Result<toml::Table, String> {
    let text = small_file::read(path, MAX_CONFIG_FILE).map_err(|error| {
        format!(
            "cannot read the configuration file {}: {error}",
            path.display()
        )
    })?;
    text.parse::<toml::Table>().map_err(|error| {
        format!(
            "{} is not TOML: {}",
            path.display(),
            error.to_string().trim()
        )
    })
}

/// The first line of a clap error, without its `error: ` prefix.
fn first_line(error: &clap::Error) -> String {
    let text = error.to_string();
    let line = text.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_owned()
}

/// Every key a file may have at its top level.
fn keys(serve: &clap::Command) -> Vec<String> {
    serve
        .get_arguments()
        .filter_map(file_key)
        .filter(|long| !NOT_KEYS.contains(long))
        .map(str::to_owned)
        .chain(TABLES.iter().map(|t| (*t).to_owned()))
        .collect()
}

/// The fault of an unknown `key` in `place`, naming the nearest of `valid`.
fn unknown(place: &str, key: &str, valid: &[impl AsRef<str>]) -> String {
    let nearest = valid
        .iter()
        .map(|v| (strsim::jaro_winkler(key, v.as_ref()), v.as_ref()))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match nearest {
        Some((_, nearest)) => {
            format!("{place}: unknown key {key:?}; the nearest valid key is {nearest:?}")
        }
        None => format!("{place}: unknown key {key:?}"),
    }
}

/// The command-line arguments a key's value stands for.
fn fragments(key: &str, arg: &clap::Arg, value: &toml::Value) -> Result<Vec<OsString>, String> {
    let flag = matches!(arg.get_action(), ArgAction::SetTrue);
    let repeatable = matches!(arg.get_action(), ArgAction::Append);
    let scalar = |value: &toml::Value| -> Result<String, String> {
        match value {
            toml::Value::String(text) => Ok(text.clone()),
            toml::Value::Integer(n) => Ok(n.to_string()),
            toml::Value::Float(x) => Ok(x.to_string()),
            toml::Value::Boolean(b) => Ok(b.to_string()),
            _ => Err("is not a string, a number or a boolean".to_owned()),
        }
    };
    if flag {
        return match value {
            toml::Value::Boolean(true) => Ok(vec![format!("--{key}").into()]),
            toml::Value::Boolean(false) => Ok(Vec::new()),
            _ => Err("is true or false".to_owned()),
        };
    }
    let values = match value {
        toml::Value::Array(items) if repeatable => {
            items.iter().map(scalar).collect::<Result<Vec<_>, _>>()?
        }
        toml::Value::Array(_) => return Err("takes one value, not a list".to_owned()),
        other => vec![scalar(other)?],
    };
    Ok(values
        .into_iter()
        .map(|v| OsString::from(format!("--{key}={v}")))
        .collect())
}

/// The `[[tenant]]` and `[tenant-defaults]` tables of the file at `path`:
/// the tenants (`None` when the file names none), and every fault.
fn read_tenants(path: &Path, table: &toml::Table) -> (Option<Tenants>, Vec<String>) {
    let shown = path.display().to_string();
    let mut faults = Vec::new();
    let mut tenants = Tenants::default();
    if let Some(defaults) = table.get("tenant-defaults") {
        match defaults.as_table() {
            Some(defaults) => {
                let place = format!("{shown}: [tenant-defaults]");
                for key in defaults.keys() {
                    if !QUOTA_KEYS.contains(&key.as_str()) {
                        faults.push(unknown(&place, key, &QUOTA_KEYS));
                    }
                }
                tenants.defaults = quota(&place, defaults, &mut faults);
            }
            None => faults.push(format!(
                "{shown}: tenant-defaults is a table ([tenant-defaults])"
            )),
        }
    }
    let Some(list) = table.get("tenant") else {
        return (None, faults);
    };
    let Some(list) = list.as_array() else {
        faults.push(format!("{shown}: tenant is a list of tables ([[tenant]])"));
        return (None, faults);
    };
    let valid: Vec<&str> = TENANT_KEYS
        .iter()
        .chain(QUOTA_KEYS.iter())
        .copied()
        .collect();
    for (index, entry) in list.iter().enumerate() {
        let Some(entry) = entry.as_table() else {
            faults.push(format!("{shown}: tenant #{} is not a table", index + 1));
            continue;
        };
        let name = entry.get("name").and_then(|n| n.as_str());
        let place = match name {
            Some(name) => format!("{shown}: tenant {name:?}"),
            None => {
                faults.push(format!("{shown}: tenant #{} has no name", index + 1));
                format!("{shown}: tenant #{}", index + 1)
            }
        };
        for key in entry.keys() {
            if !valid.contains(&key.as_str()) {
                faults.push(unknown(&place, key, &valid));
            }
        }
        let mut hashes = Vec::new();
        if let Some(file) = entry.get("token-file") {
            match file.as_str() {
                // A relative path is the file's neighbour.
                Some(file) => match token::read_file(&beside(path, file)) {
                    Ok(tokens) => hashes.extend(tokens.iter().map(|t| TokenHash::of(t))),
                    Err(error) => faults.push(format!("{place}: {error}")),
                },
                None => faults.push(format!("{place}: token-file is a path")),
            }
        }
        match entry.get("tokens").map(|t| t.as_array()) {
            None => {}
            Some(None) => faults.push(format!("{place}: tokens is a list of \"sha256:HEX\"")),
            Some(Some(list)) => {
                for (n, hash) in list.iter().enumerate() {
                    match hash.as_str().map(TokenHash::parse) {
                        Some(Ok(hash)) => hashes.push(hash),
                        Some(Err(error)) => {
                            faults.push(format!("{place}: tokens[{n}]: {error}"));
                        }
                        None => faults.push(format!("{place}: tokens[{n}] is not a string")),
                    }
                }
            }
        }
        if hashes.is_empty() && !faults.iter().any(|f| f.starts_with(&place)) {
            faults.push(format!(
                "{place} has no token: give it token-file or tokens"
            ));
        }
        let quota = quota(&place, entry, &mut faults);
        if let Some(name) = name {
            tenants.tenants.push(Tenant {
                name: name.to_owned(),
                tokens: hashes,
                quota,
            });
        }
    }
    if let Err(error) = tenants.validate() {
        faults.push(format!("{shown}: {error}"));
    }
    (Some(tenants), faults)
}

/// `file` as named in the configuration file at `config`: relative to
/// the configuration file's directory.
fn beside(config: &Path, file: &str) -> PathBuf {
    config
        .parent()
        .map_or_else(|| PathBuf::from(file), |dir| dir.join(file))
}

/// The quota keys of `table`; a bad value is a fault.
fn quota(place: &str, table: &toml::Table, faults: &mut Vec<String>) -> Quota {
    let mut count = |key: &str| -> Option<usize> {
        let value = table.get(key)?;
        match value.as_integer().and_then(|n| usize::try_from(n).ok()) {
            Some(n) => Some(n),
            None => {
                faults.push(format!("{place}: {key} is a whole number, not {value}"));
                None
            }
        }
    };
    let (max_connections, max_runs, max_loops, max_pulls) = (
        count("max-connections"),
        count("max-runs"),
        count("max-loops"),
        count("max-pulls"),
    );
    let mut size = |key: &str| -> Option<u64> {
        let value = table.get(key)?;
        let read = match value {
            toml::Value::Integer(n) => u64::try_from(*n).map_err(|_| format!("{n} is negative")),
            toml::Value::String(text) => bytes(text),
            other => Err(format!("{other} is not a size (e.g. 512K, 16M, 1G)")),
        };
        match read {
            Ok(n) => Some(n),
            Err(why) => {
                faults.push(format!("{place}: {key}: {why}"));
                None
            }
        }
    };
    let (memory_budget, disk_budget, max_run_memory) = (
        size("memory-budget"),
        size("disk-budget"),
        size("max-run-memory"),
    );
    let cpu_weight = table.get("cpu-weight").and_then(|value| {
        let weight = value
            .as_integer()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| (1..=runloop::server::MAX_CPU_WEIGHT).contains(n));
        if weight.is_none() {
            faults.push(format!(
                "{place}: cpu-weight is a whole number from 1 to {}, not {value}",
                runloop::server::MAX_CPU_WEIGHT
            ));
        }
        weight
    });
    Quota {
        max_connections,
        max_runs,
        max_loops,
        memory_budget,
        disk_budget,
        max_run_memory,
        max_pulls,
        cpu_weight,
    }
}

/// The `[pool."NAME"]` tables of the file at `path`, by image name;
/// their faults go to `faults`. Whether each names an `oci:` entry is
/// checked when the catalog is made.
fn read_pools(
    path: &Path,
    table: &toml::Table,
    faults: &mut Vec<String>,
) -> BTreeMap<String, PoolEntry> {
    let shown = path.display();
    let mut pools = BTreeMap::new();
    let Some(value) = table.get("pool") else {
        return pools;
    };
    let Some(list) = value.as_table() else {
        faults.push(format!(
            "{shown}: pool is a table of tables ([pool.\"NAME\"])"
        ));
        return pools;
    };
    for (name, entry) in list {
        let place = format!("{shown}: [pool.{name:?}]");
        let Some(entry) = entry.as_table() else {
            faults.push(format!("{place} is not a table"));
            continue;
        };
        for key in entry.keys() {
            if !POOL_KEYS.contains(&key.as_str()) {
                faults.push(unknown(&place, key, &POOL_KEYS));
            }
        }
        let warm = entry.get("warm").and_then(|value| {
            let warm = value
                .as_integer()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| *n <= MAX_WARM);
            if warm.is_none() {
                faults.push(format!(
                    "{place}: warm is a whole number from 0 to {MAX_WARM}, not {value}"
                ));
            }
            warm
        });
        let mut size = |key: &str| -> Option<u64> {
            let value = entry.get(key)?;
            let read = match value {
                toml::Value::Integer(n) => {
                    u64::try_from(*n).map_err(|_| format!("{n} is negative"))
                }
                toml::Value::String(text) => bytes(text),
                other => Err(format!("{other} is not a size (e.g. 512K, 16M, 1G)")),
            };
            read.map_err(|why| faults.push(format!("{place}: {key}: {why}")))
                .ok()
        };
        let (memory, disk) = (size("memory"), size("disk"));
        pools.insert(name.clone(), PoolEntry { warm, memory, disk });
    }
    pools
}

/// The most containers one entry keeps warm (`--warm`'s maximum).
const MAX_WARM: usize = 256;

/// The options of `serve` in order, with their headings: those a file
/// may hold.
fn options(serve: &clap::Command) -> Vec<&clap::Arg> {
    serve
        .get_arguments()
        .filter(|a| file_key(a).is_some_and(|l| !NOT_KEYS.contains(&l)))
        .collect()
}

/// `text` as a TOML value: a number or boolean as it is, else a string.
fn toml_value(text: &str) -> String {
    if text.parse::<i64>().is_ok() || text == "true" || text == "false" {
        text.to_owned()
    } else {
        toml::Value::String(text.to_owned()).to_string()
    }
}

/// `serve --print-config`: every key, its help and its default, as a
/// commented file an operator can start from.
pub fn print_defaults(out: &mut impl Write) -> std::io::Result<()> {
    let serve = command();
    writeln!(
        out,
        "# runloop serve --config FILE: every option of `runloop serve` is a key\n\
         # of the same name. Uncomment what you change; an option on the command\n\
         # line overrides the file. Sizes take K/M/G suffixes (\"16M\"); durations\n\
         # are \"30s\", \"2m\", \"500ms\" or a bare number of seconds."
    )?;
    let mut heading = None;
    for arg in options(&serve) {
        let this = arg.get_help_heading().unwrap_or("Options");
        if heading != Some(this) {
            writeln!(out, "\n# ── {this} ──")?;
            heading = Some(this);
        }
        let key = file_key(arg).unwrap_or_default();
        writeln!(out)?;
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        for line in wrap(&help, 76) {
            writeln!(out, "# {line}")?;
        }
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let line = match (arg.get_action(), defaults.as_slice()) {
            (ArgAction::SetTrue, _) => format!("{key} = false"),
            (ArgAction::Append, _) => format!("{key} = []"),
            (_, [one]) => format!("{key} = {}", toml_value(one)),
            // Made at startup, or unset: the help says which.
            _ => format!("{key} = …  (see above)"),
        };
        writeln!(out, "# {line}")?;
    }
    writeln!(
        out,
        "\n# ── Tenants ──\n\
         \n\
         # What a tenant leaves out. Without it, a tenant may hold half of each\n\
         # server-wide budget (memory, disk, runs, connections, registry pulls),\n\
         # never below one; every tenant's runs weigh the same on the CPU\n\
         # (tenant-cpu-weight) unless cpu-weight says otherwise.\n\
         # [tenant-defaults]\n\
         # max-connections = 64\n\
         # max-runs = 16\n\
         # max-loops = 32\n\
         # memory-budget = \"8G\"\n\
         # disk-budget = \"32G\"\n\
         # max-run-memory = \"2G\"\n\
         # max-pulls = 2\n\
         # cpu-weight = 100\n\
         \n\
         # One table per tenant: its name (in logs and metrics), its tokens (a\n\
         # token-file, one a line, and/or the lowercase hex SHA-256 of each\n\
         # token's bytes: `printf %s TOKEN | sha256sum`), and its quotas.\n\
         # [[tenant]]\n\
         # name = \"alice\"\n\
         # token-file = \"alice.tokens\"\n\
         # tokens = [\"sha256:…\"]\n\
         # max-runs = 8\n\
         \n\
         # ── Warm pools ──\n\
         \n\
         # One table per oci: entry whose pool is not --warm's: containers kept\n\
         # started, and each one's memory and disk (a run asking for more starts\n\
         # cold).\n\
         # [pool.\"agents/demo\"]\n\
         # warm = 4\n\
         # memory = \"512M\"\n\
         # disk = \"256M\""
    )?;
    Ok(())
}

/// `text` in lines of at most `width` characters, broken at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    for paragraph in text.lines() {
        let mut line = String::new();
        for word in paragraph.split_whitespace() {
            if !line.is_empty() && line.len() + 1 + word.len() > width {
                lines.push(std::mem::take(&mut line));
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        lines.push(line);
    }
    lines
}

/// The effective value of every key, by key, as given (tokens hidden).
pub fn effective(matches: &ArgMatches) -> BTreeMap<String, String> {
    let serve = command();
    let mut values = BTreeMap::new();
    for arg in options(&serve) {
        let key = file_key(arg).unwrap_or_default();
        let id = arg.get_id().as_str();
        let raw: Vec<String> = matches
            .get_raw(id)
            .map(|values| values.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let value = match arg.get_action() {
            ArgAction::SetTrue => matches.get_flag(id).to_string(),
            ArgAction::Append => {
                let shown: Vec<String> = raw
                    .iter()
                    .map(|v| {
                        if key == "token" {
                            "\"<redacted>\"".to_owned()
                        } else {
                            toml::Value::String(v.clone()).to_string()
                        }
                    })
                    .collect();
                format!("[{}]", shown.join(", "))
            }
            _ => match raw.first() {
                Some(one) => toml_value(one),
                None => continue,
            },
        };
        values.insert(key.to_owned(), value);
    }
    values
}

/// Prints the effective configuration: every key set, where it came from
/// (`from_file`: the keys the file set), then the file's tenant tables
/// (`tenant_tables`), so that what is printed is a file that serves the
/// same.
pub fn print_effective(
    matches: &ArgMatches,
    from_file: &[String],
    tenant_tables: &toml::Table,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let serve = command();
    let values = effective(matches);
    for arg in options(&serve) {
        let key = file_key(arg).unwrap_or_default();
        let source = match matches.value_source(arg.get_id().as_str()) {
            _ if from_file.iter().any(|k| k == key) => "file",
            Some(ValueSource::CommandLine) => "command line",
            Some(ValueSource::EnvVariable) => "environment",
            _ => "default",
        };
        match values.get(key) {
            Some(value) => writeln!(out, "{key} = {value}  # {source}")?,
            None => writeln!(out, "# {key} is not set")?,
        }
    }
    if tenant_tables.is_empty() {
        writeln!(out, "# no [tenant-defaults] and no [[tenant]] (file)")?;
    } else {
        writeln!(out, "\n# the tenants (file)")?;
        let tables = toml::to_string(tenant_tables).map_err(std::io::Error::other)?;
        write!(out, "{tables}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_key_names_the_nearest() {
        let fault = unknown("f.toml", "max-run", &["max-runs", "listen", "max-scopes"]);
        assert_eq!(
            fault,
            "f.toml: unknown key \"max-run\"; the nearest valid key is \"max-runs\""
        );
    }

    #[test]
    fn every_option_but_the_file_s_own_is_a_key() {
        let serve = command();
        let keys = keys(&serve);
        for key in [
            "listen",
            "max-runs",
            "token-file",
            "memory-budget",
            "disk-budget",
            "log-format",
        ] {
            assert!(keys.iter().any(|k| k == key), "{key} in {keys:?}");
        }
        assert!(!keys.iter().any(|k| k == "config" || k == "check-config"));
    }

    #[test]
    fn a_quota_reads_every_key_max_pulls_included() {
        let table: toml::Table =
            toml::from_str("max-pulls = 3\nmax-runs = 2\nmax-loops = -1\n").expect("TOML");
        let mut faults = Vec::new();
        let quota = quota("[tenant-defaults]", &table, &mut faults);
        assert_eq!((quota.max_pulls, quota.max_runs), (Some(3), Some(2)));
        assert_eq!(
            faults,
            ["[tenant-defaults]: max-loops is a whole number, not -1"]
        );
        assert!(QUOTA_KEYS.contains(&"max-pulls"));
    }

    #[test]
    fn a_cpu_weight_is_1_to_10000() {
        let table: toml::Table = toml::from_str("cpu-weight = 250\n").expect("TOML");
        let mut faults = Vec::new();
        assert_eq!(quota("t", &table, &mut faults).cpu_weight, Some(250));
        assert!(faults.is_empty());
        for bad in ["0", "10001", "\"heavy\"", "-1"] {
            let table: toml::Table = toml::from_str(&format!("cpu-weight = {bad}")).expect("TOML");
            let mut faults = Vec::new();
            assert_eq!(quota("t", &table, &mut faults).cpu_weight, None);
            assert_eq!(
                faults,
                [format!(
                    "t: cpu-weight is a whole number from 1 to 10000, not {bad}"
                )]
            );
        }
    }

    #[test]
    fn help_is_wrapped_at_spaces() {
        assert_eq!(wrap("a bb ccc dddd", 6), ["a bb", "ccc", "dddd"]);
    }

    #[test]
    fn a_pool_table_sets_an_entry_s_warm_memory_and_disk_and_names_its_faults() {
        let table: toml::Table = toml::from_str(
            "[pool.\"agents/demo\"]\nwarm = 4\nmemory = \"512M\"\ndisk = 65536\n\
             [pool.other]\nwarm = 300\nmemroy = \"1G\"\ndisk = \"lots\"\n",
        )
        .expect("TOML");
        let mut faults = Vec::new();
        let pools = read_pools(Path::new("f.toml"), &table, &mut faults);
        assert_eq!(
            pools["agents/demo"],
            PoolEntry {
                warm: Some(4),
                memory: Some(512 << 20),
                disk: Some(65536),
            }
        );
        assert_eq!(pools["other"], PoolEntry::default());
        assert_eq!(faults.len(), 3, "{faults:?}");
        assert!(faults[0].contains("memroy"), "{faults:?}");
        assert!(
            faults[0].ends_with("the nearest valid key is \"memory\""),
            "{faults:?}"
        );
        assert_eq!(
            faults[1],
            "f.toml: [pool.\"other\"]: warm is a whole number from 0 to 256, not 300"
        );
        assert!(
            faults[2].starts_with("f.toml: [pool.\"other\"]: disk: "),
            "{faults:?}"
        );
    }
}
