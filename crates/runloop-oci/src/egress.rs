//! Container egress: the operator's opt-in way out of a run's network
//! namespace (`runloop serve --container-egress`) — a veth to the host,
//! NAT'd to the host's uplink, and nothing back in.
//!
//! ```text
//! run's netns (runloop-KEY)                 host netns
//!   eth0  N+2/30 ─────── veth ───────  rlxNNNNNNNN  N+1/30 ──forward, masquerade──▶ uplink ──▶ …
//!   lo    agent on 127.0.0.1:$PORT ◀── socket made in the netns (module network) ── proxy
//! ```
//!
//! Without it a run's namespace has loopback only ([`crate::network`]),
//! and nothing here runs: no veth, no nft, no sysctl. With it, the agent
//! still listens on `127.0.0.1:$PORT` and the host still reaches it only
//! through sockets made inside the namespace: the veth is a way out,
//! never the way in.
//!
//! **Addresses are claimed from the kernel, host-wide.** Each run takes a
//! /30 of the egress network (host end `.1`, run end `.2`), and the host
//! end of its veth is named after that /30's first address: `rlx` and
//! eight hex digits (`rlx0ad50004` is 10.213.0.4/30). Interface names are
//! the host's, one namespace for every process on it, and `ip link add`
//! fails with "File exists" when the name is held, so creating the veth
//! *is* the claim: atomic, with no shared file to lock or to go stale.
//! Two servers on one host, or a server and the leftovers of a killed
//! one, can never hold the same /30: whoever holds the name holds the
//! addresses, and a taken name sends the claimer on to the next /30. (A
//! pool in the server's memory is what once gave two servers' runs the
//! same address.) The run's end is made in the run's namespace by the
//! same call, so the pair is the run's from its first instant; naming by
//! address rather than by a slot number keeps two servers given
//! different (overlapping) `--container-egress-network`s apart too.
//!
//! **Nothing reaches into a run.** One nft table per server, named after
//! its store (`runloop_` and the store path's digest), so that two servers
//! never touch each other's table and the next server on a store finds
//! (and replaces) a killed one's. Its rules are keyed on the `rlx` prefix,
//! so each server's table holds for every run on the host, and it refuses
//! (ICMP administratively prohibited, `EHOSTUNREACH` to the run):
//!
//! - anything from a run to the host itself (input): no service of the
//!   host, on any address, the admin port and the proxies included;
//! - a run to another run (forward, `rlx` to `rlx`), whichever server;
//! - a packet whose source is not the run's own address (a run posing as
//!   another, whose replies would then land in that other run);
//! - 169.254.0.0/16, the link-local range of cloud metadata services, and
//!   IPv6;
//! - any new connection *to* a run, from the host or from the uplink:
//!   only the replies of its own connections go in.
//!
//! What is left, a run's own connections out, is masqueraded to the
//! address of the interface it leaves by. IPv4 forwarding must be on for
//! that; [`Egress::open`] turns it on if it is off, and says so. A run
//! gets the host's name servers it can reach as its `/etc/resolv.conf`
//! (bound read-only), so that it can look up the APIs it calls.
//!
//! **Nothing is left.** A run's directory holds a marker (written before
//! the claim, with the run's address after it) and its teardown deletes
//! the run's end of the veth from inside its namespace ([`detach`]), which
//! deletes the pair, the host end's name and its route — never another
//! run's, whatever became of the name — and then the kernel's
//! connection-tracking entries of the run's address, so that a later run
//! given the same /30 is sent nothing of this one's connections. A killed server's runs are swept by the next server on its
//! store the same way, and their veths die with their namespaces anyway.
//! The store holds a marker while a server's table may exist; the server
//! deletes its table when it closes, and the next one on the store
//! deletes a killed one's ([`sweep`]), egress or not.

use std::ffi::OsStr;
use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};

use runloop_proto::error_chain::Chain;
use tracing::{info, warn};

use crate::command::{self, CommandError};
use crate::conntrack;
use crate::digest::Digest;
use crate::network;

/// What the host end of every run's egress veth is named from: `rlx`,
/// then eight hex digits (not a hex digit itself, so no name of the
/// `rlKEY` veths older servers made starts with it).
pub const LINK_PREFIX: &str = "rlx";

/// The run's end of its veth, in its namespace.
const INSIDE: &str = "eth0";

/// The file, in a run's directory and in the store, that says egress may
/// have left something of it on the host.
const MARKER: &str = "egress";

/// IPv4 forwarding, host-wide.
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// The host's resolver configuration, which runs with egress get a copy of.
const RESOLV_CONF: &str = "/etc/resolv.conf";

/// The copy in a run's directory, bound read-only at `/etc/resolv.conf`.
const RUN_RESOLV_CONF: &str = "resolv.conf";

fn nft() -> &'static OsStr {
    OsStr::new("nft")
}

/// An IPv4 network runs' egress addresses come from, a /30 a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EgressNetwork {
    base: u32,
    prefix: u8,
}

/// The egress network unless told otherwise: 10.213.0.0/16, 16384 runs.
pub const DEFAULT_NETWORK: EgressNetwork = EgressNetwork {
    base: u32::from_be_bytes([10, 213, 0, 0]),
    prefix: 16,
};

impl FromStr for EgressNetwork {
    type Err = String;

    fn from_str(text: &str) -> Result<EgressNetwork, String> {
        let (address, prefix) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not ADDRESS/PREFIX (such as 10.213.0.0/16)"))?;
        let address: Ipv4Addr = address
            .parse()
            .map_err(|_| format!("{address:?} is not an IPv4 address"))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|prefix| (8..=30).contains(prefix))
            .ok_or_else(|| format!("the prefix {prefix:?} is not a number from 8 to 30"))?;
        let mask = u32::MAX << (32 - u32::from(prefix));
        if u32::from(address) & !mask != 0 {
            return Err(format!(
                "{text} has host bits set: the network is {}/{prefix}",
                Ipv4Addr::from(u32::from(address) & mask)
            ));
        }
        Ok(EgressNetwork {
            base: u32::from(address),
            prefix,
        })
    }
}

impl fmt::Display for EgressNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.base), self.prefix)
    }
}

impl EgressNetwork {
    /// How many /30s it holds: how many runs may have egress at once.
    pub fn slots(self) -> u32 {
        1 << (30 - u32::from(self.prefix))
    }

    /// The `index`th /30's link.
    fn link(self, index: u32) -> Link {
        let first = self.base + 4 * index;
        Link {
            name: format!("{LINK_PREFIX}{first:08x}"),
            host: Ipv4Addr::from(first + 1),
            run: Ipv4Addr::from(first + 2),
        }
    }
}

/// One run's way out: the host end of its veth and its /30's two
/// addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The host end's name (`rlx` and the /30's first address in hex).
    pub name: String,
    /// The host end's address: the run's gateway.
    pub host: Ipv4Addr,
    /// The run's address.
    pub run: Ipv4Addr,
}

/// The resolver configuration a run with egress gets: the host's, less
/// the name servers a run cannot reach (loopback — the run's own, not the
/// host's —, link-local and IPv6, which the rules refuse); `None` when
/// no name server is left, and then the image keeps its own.
fn resolver(host: &str) -> Option<String> {
    let mut kept = String::new();
    let mut servers = 0;
    for line in host.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => {
                let reachable = words
                    .next()
                    .and_then(|address| address.parse::<Ipv4Addr>().ok())
                    .is_some_and(|address| !address.is_loopback() && !address.is_link_local());
                if !reachable {
                    continue;
                }
                servers += 1;
            }
            Some("search" | "domain" | "options" | "sortlist") => {}
            _ => continue,
        }
        kept.push_str(line.trim());
        kept.push('\n');
    }
    (servers > 0).then_some(kept)
}

/// Why egress could not be set up, for the host or for a run.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// `ip` or `nft` failed.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// A file egress writes (a marker, the forwarding switch).
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// The kernel would not forget a run's connections.
    #[error("cannot delete the connection-tracking entries of {address}")]
    Conntrack {
        /// The run's address.
        address: Ipv4Addr,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// Every /30 is held.
    #[error(
        "no egress address is free in {0}: every /30 of it is held by a run on this host (--container-egress-network)"
    )]
    Full(EgressNetwork),
}

fn write(path: PathBuf, content: &str) -> Result<(), EgressError> {
    std::fs::write(&path, content).map_err(|source| EgressError::Write { path, source })
}

/// The nft table of the server on `store`: `runloop_` and the first 16
/// hex digits of the digest of the store's path.
pub fn table(store: &Path) -> String {
    let path = std::fs::canonicalize(store).unwrap_or_else(|_| store.to_owned());
    let digest = Digest::of(path.as_os_str().as_encoded_bytes());
    format!("runloop_{}", &digest.hex()[..16])
}

/// The nft script that makes (or replaces, in one transaction) the
/// server's table.
fn ruleset(table: &str, store: &Path) -> String {
    // A comment holds no quote; the store's path is only a hint there.
    let shown: String = store
        .display()
        .to_string()
        .chars()
        .filter(|c| *c != '"' && !c.is_control())
        .collect();
    let runs = format!("\"{LINK_PREFIX}*\"");
    let refuse = "reject with icmpx type admin-prohibited";
    format!(
        "table inet {table}\n\
         delete table inet {table}\n\
         table inet {table} {{\n\
         \tcomment \"runloop serve --store {shown}: container egress\"\n\
         \tchain input {{\n\
         \t\ttype filter hook input priority filter; policy accept;\n\
         \t\tiifname {runs} {refuse}\n\
         \t}}\n\
         \tchain forward {{\n\
         \t\ttype filter hook forward priority filter; policy accept;\n\
         \t\tiifname {runs} oifname {runs} {refuse}\n\
         \t\tiifname {runs} fib saddr . iif oif missing drop\n\
         \t\tiifname != {runs} oifname {runs} ct state established,related accept\n\
         \t\toifname {runs} {refuse}\n\
         \t\tiifname {runs} meta nfproto ipv6 {refuse}\n\
         \t\tiifname {runs} ip daddr 169.254.0.0/16 {refuse}\n\
         \t}}\n\
         \tchain output {{\n\
         \t\ttype filter hook output priority filter; policy accept;\n\
         \t\toifname {runs} ct state established,related accept\n\
         \t\toifname {runs} {refuse}\n\
         \t}}\n\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tiifname {runs} oifname != {runs} masquerade\n\
         \t}}\n\
         }}\n"
    )
}

/// Deletes the table `table`; absent is fine.
async fn delete_table(table: &str) -> Result<(), CommandError> {
    match command::run(nft(), ["delete", "table", "inet", table], None).await {
        Err(error) if !error.says("No such file or directory") => Err(error),
        _ => Ok(()),
    }
}

/// A server's egress: its network, its table, and where it looks for a
/// free /30 next.
#[derive(Debug)]
pub struct Egress {
    network: EgressNetwork,
    store: PathBuf,
    table: String,
    /// What runs get as `/etc/resolv.conf`, if anything.
    resolver: Option<String>,
    /// The slot the next claim tries first: starting at a random one and
    /// moving on keeps two servers from trying the same names in step,
    /// and a run's address from going at once to the next run.
    cursor: AtomicU32,
}

impl Egress {
    /// Makes the server's table for `store` (replacing a killed server's),
    /// and turns IPv4 forwarding on if it is off.
    pub async fn open(network: EgressNetwork, store: &Path) -> Result<Egress, EgressError> {
        // The marker first: a server killed right after it made the table
        // leaves what the next one looks for.
        write(store.join(MARKER), "")?;
        let table = table(store);
        command::run(nft(), ["-f", "-"], Some(&ruleset(&table, store))).await?;
        let forwarding = std::fs::read_to_string(IP_FORWARD).unwrap_or_default();
        if forwarding.trim() != "1" {
            write(PathBuf::from(IP_FORWARD), "1")?;
            warn!(
                sysctl = "net.ipv4.ip_forward=1",
                "turned IPv4 forwarding on for container egress (the host now routes between its interfaces; runs' traffic is held by the nft table)"
            );
        }
        let resolver = resolver(&std::fs::read_to_string(RESOLV_CONF).unwrap_or_default());
        if resolver.is_none() {
            warn!(
                "{RESOLV_CONF} names no name server a run can reach (loopback, link-local and IPv6 ones are not): runs with egress keep their image's own"
            );
        }
        let mut seed = [0u8; 4];
        let _ = getrandom::fill(&mut seed);
        info!(%network, %table, runs = network.slots(), "container egress on");
        Ok(Egress {
            network,
            store: store.to_owned(),
            table,
            resolver,
            cursor: AtomicU32::new(u32::from_ne_bytes(seed) % network.slots()),
        })
    }

    /// The egress network.
    pub fn network(&self) -> EgressNetwork {
        self.network
    }

    /// The server's nft table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The resolver configuration of the run whose directory is `run`,
    /// written by [`Egress::attach`], to bind at `/etc/resolv.conf`; `None`
    /// when runs keep their image's own.
    pub fn resolv_conf(&self, run: &Path) -> Option<PathBuf> {
        self.resolver.as_ref().map(|_| run.join(RUN_RESOLV_CONF))
    }

    /// Gives the run `key` (whose directory is `run`, whose namespace is
    /// made) a /30 and a veth out, its default route through the host, and
    /// its [`Egress::resolv_conf`].
    pub async fn attach(&self, key: &str, run: &Path) -> Result<Link, EgressError> {
        write(run.join(MARKER), "")?;
        if let Some(resolver) = &self.resolver {
            write(run.join(RUN_RESOLV_CONF), resolver)?;
        }
        let netns = network::namespace(key);
        let slots = self.network.slots();
        let start = self.cursor.fetch_add(1, Ordering::Relaxed) % slots;
        for step in 0..slots {
            let index = ((u64::from(start) + u64::from(step)) % u64::from(slots)) as u32;
            let link = self.network.link(index);
            // A hint only: the add below is the claim.
            if Path::new("/sys/class/net").join(&link.name).exists() {
                continue;
            }
            // The claim, then the host end's address: `ip -batch` stops at
            // the first failure, and only the claim can find its name held.
            let claim = format!(
                "link add {name} up type veth peer name {INSIDE} netns {netns}\n\
                 addr add {}/30 dev {name}\n",
                link.host,
                name = link.name
            );
            match command::run(network::ip(), ["-batch", "-"], Some(&claim)).await {
                Ok(_) => {}
                Err(error) if error.says("File exists") => continue,
                Err(error) => return Err(error.into()),
            }
            self.cursor.store(index + 1, Ordering::Relaxed);
            // The run's address, for the teardown to forget its connections.
            write(run.join(MARKER), &link.run.to_string())?;
            let inside = format!(
                "addr add {}/30 dev {INSIDE}\nlink set {INSIDE} up\nroute add default via {}\n",
                link.run, link.host
            );
            command::run(network::ip(), ["-n", &netns, "-batch", "-"], Some(&inside)).await?;
            return Ok(link);
        }
        Err(EgressError::Full(self.network))
    }

    /// Deletes the server's table (once its runs are gone).
    pub async fn close(&self) {
        if let Err(error) = delete_table(&self.table).await {
            warn!(table = %self.table, error = %Chain(&error), "cannot remove the container egress table");
            return;
        }
        let _ = std::fs::remove_file(self.store.join(MARKER));
    }
}

/// Deletes the nft table a server on `store` left (killed before it could),
/// if its marker says one may be there.
pub async fn sweep(store: &Path) {
    let marker = store.join(MARKER);
    if !marker.exists() {
        return;
    }
    let table = table(store);
    warn!(%table, "removing the container egress table of an earlier server");
    match delete_table(&table).await {
        Ok(()) => {
            let _ = std::fs::remove_file(marker);
        }
        Err(error) => {
            warn!(%table, error = %Chain(&error), "cannot remove the container egress table")
        }
    }
}

/// Deletes the veth of the run `key` (directory `run`), if it has one:
/// its end inside the run's namespace, which takes the host end, its name
/// and its route with it; then has the kernel forget the connections of
/// its address ([`conntrack::forget`]) — only when the link was there to
/// delete: until then the address was the run's, afterwards it may be
/// another's.
pub async fn detach(key: &str, run: &Path) -> Result<(), EgressError> {
    let Ok(marker) = std::fs::read_to_string(run.join(MARKER)) else {
        return Ok(());
    };
    if !network::namespace_path(key).exists() {
        return Ok(());
    }
    let netns = network::namespace(key);
    match command::run(network::ip(), ["-n", &netns, "link", "del", INSIDE], None).await {
        Err(error) if error.says("Cannot find device") => return Ok(()),
        Err(error) => return Err(error.into()),
        Ok(_) => {}
    }
    if let Ok(address) = marker.trim().parse::<Ipv4Addr>() {
        conntrack::forget(address).map_err(|source| EgressError::Conntrack { address, source })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_parses_and_names_its_slots() {
        let network: EgressNetwork = "10.213.0.0/16".parse().expect("parses");
        assert_eq!(network, DEFAULT_NETWORK);
        assert_eq!(network.to_string(), "10.213.0.0/16");
        assert_eq!(network.slots(), 16384);
        let link = network.link(1);
        assert_eq!(link.name, "rlx0ad50004");
        assert_eq!(link.host, Ipv4Addr::new(10, 213, 0, 5));
        assert_eq!(link.run, Ipv4Addr::new(10, 213, 0, 6));
        let last = network.link(network.slots() - 1);
        assert_eq!(last.run, Ipv4Addr::new(10, 213, 255, 254));
        // Interface names hold 15 bytes.
        assert!(last.name.len() <= 15);
        let one: EgressNetwork = "192.168.7.4/30".parse().expect("parses");
        assert_eq!(one.slots(), 1);
        assert_eq!(one.link(0).name, "rlxc0a80704");
    }

    #[test]
    fn runs_get_the_name_servers_they_can_reach() {
        let host = "# made by hand\nnameserver 127.0.0.53\nnameserver 10.0.0.2\n\
                    nameserver ::1\nnameserver 169.254.169.253\nnameserver 2001:db8::1\n\
                    search example.com\noptions edns0 trust-ad\n";
        assert_eq!(
            resolver(host).as_deref(),
            Some("nameserver 10.0.0.2\nsearch example.com\noptions edns0 trust-ad\n")
        );
        assert_eq!(
            resolver("nameserver 127.0.0.53\nsearch example.com\n"),
            None
        );
        assert_eq!(resolver(""), None);
    }

    #[test]
    fn a_bad_network_is_refused_saying_why() {
        for (text, says) in [
            ("10.213.0.0", "ADDRESS/PREFIX"),
            ("10.213.0.0/31", "from 8 to 30"),
            ("10.213.0.0/7", "from 8 to 30"),
            ("10.213.0.1/16", "host bits"),
            ("ten/16", "IPv4"),
        ] {
            let error = text.parse::<EgressNetwork>().expect_err(text);
            assert!(error.contains(says), "{text}: {error}");
        }
    }

    #[test]
    fn the_table_is_the_stores_and_its_rules_key_on_the_prefix() {
        let a = table(Path::new("/nonexistent/a"));
        assert_eq!(a, table(Path::new("/nonexistent/a")));
        assert_ne!(a, table(Path::new("/nonexistent/b")));
        assert_eq!(a.len(), "runloop_".len() + 16);
        let rules = ruleset(&a, Path::new("/nonexistent/\"a"));
        assert!(rules.starts_with(&format!("table inet {a}\ndelete table inet {a}\n")));
        assert!(rules.contains("--store /nonexistent/a: container egress"));
        assert!(rules.contains("iifname \"rlx*\" reject"));
        assert!(rules.contains("ip daddr 169.254.0.0/16 reject"));
        assert!(rules.contains("masquerade"));
    }
}
