//! Container networks: a network namespace and a veth pair per container,
//! with addresses from a configured pool.
//!
//! ```text
//! host netns                          container netns (runloop-KEY)
//!   rlKEY  10.x.y.1/30  ◀── veth ──▶   eth0  10.x.y.2/30, lo up, default via 10.x.y.1
//!   proxy (127.0.0.1) ── link ── dials 10.x.y.2:PORT
//! ```
//!
//! Each container gets a /30 from the pool: the host end and the container
//! end of its veth, nothing shared with another container, so containers
//! cannot reach each other and the host reaches each one at its own
//! address. The namespace is made before runc starts (runc joins it by
//! path), so the agent's network is up when it starts, and it is named
//! after the run so that a server restarted after a crash can find and
//! remove it. Deleting the namespace deletes the veth pair with it.
//!
//! The container's default route goes to the host end. Nothing is
//! forwarded from there unless the operator enables forwarding and NAT for
//! the pool: by default a container reaches the host's addresses and
//! nothing beyond.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fmt;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use crate::command::{self, CommandError};

/// The name of a run's network namespace.
pub fn namespace(key: &str) -> String {
    format!("runloop-{key}")
}

/// Where a run's network namespace is bound (what runc joins).
pub fn namespace_path(key: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(namespace(key))
}

/// The host end of a run's veth pair: `rl` + the key, 14 characters
/// (interface names hold 15).
pub fn host_interface(key: &str) -> String {
    format!("rl{key}")
}

/// An IPv4 network the containers' addresses come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet {
    base: u32,
    prefix: u8,
}

impl FromStr for Subnet {
    type Err = String;

    fn from_str(text: &str) -> Result<Subnet, String> {
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
            .ok_or_else(|| format!("prefix {prefix:?} is not a number from 8 to 30"))?;
        let mask = u32::MAX << (32 - u32::from(prefix));
        Ok(Subnet {
            base: u32::from(address) & mask,
            prefix,
        })
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.base), self.prefix)
    }
}

/// The subnet containers' addresses come from unless configured otherwise:
/// 10.213.0.0/16, 16384 containers.
pub const DEFAULT_SUBNET: Subnet = Subnet {
    base: u32::from_be_bytes([10, 213, 0, 0]),
    prefix: 16,
};

impl Subnet {
    /// How many /30s it holds.
    fn slots(&self) -> u32 {
        1 << ((32 - u32::from(self.prefix)) - 2)
    }
}

/// The pool of /30s containers take their addresses from.
#[derive(Debug, Clone)]
pub struct Pool {
    subnet: Subnet,
    used: Arc<Mutex<BTreeSet<u32>>>,
}

/// One container's /30, returned to the pool when dropped.
#[derive(Debug)]
pub struct Slot {
    index: u32,
    /// The host end's address.
    pub host: Ipv4Addr,
    /// The container's address.
    pub container: Ipv4Addr,
    used: Arc<Mutex<BTreeSet<u32>>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        used.remove(&self.index);
    }
}

impl Pool {
    /// A pool over `subnet`.
    pub fn new(subnet: Subnet) -> Pool {
        Pool {
            subnet,
            used: Arc::new(Mutex::new(BTreeSet::new())),
        }
    }

    /// The pool's subnet.
    pub fn subnet(&self) -> Subnet {
        self.subnet
    }

    /// A free /30, if any is left.
    pub fn take(&self) -> Option<Slot> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        // The used slots are sorted: the first gap is the first free one.
        let index = used
            .iter()
            .zip(0..)
            .find(|(used, expected)| **used != *expected)
            .map_or(used.len() as u32, |(_, free)| free);
        if index >= self.subnet.slots() {
            return None;
        }
        used.insert(index);
        let network = self.subnet.base + index * 4;
        Some(Slot {
            index,
            host: Ipv4Addr::from(network + 1),
            container: Ipv4Addr::from(network + 2),
            used: Arc::clone(&self.used),
        })
    }
}

fn ip() -> &'static OsStr {
    OsStr::new("ip")
}

/// Makes the run's namespace and veth pair, addressed from `slot`.
pub async fn create(key: &str, slot: &Slot) -> Result<(), CommandError> {
    let netns = namespace(key);
    let host = host_interface(key);
    let outside = format!(
        "netns add {netns}\n\
         link add {host} type veth peer name eth0 netns {netns}\n\
         addr add {}/30 dev {host}\n\
         link set {host} up\n",
        slot.host
    );
    command::run(ip(), ["-batch", "-"], Some(&outside)).await?;
    let inside = format!(
        "addr add {}/30 dev eth0\n\
         link set eth0 up\n\
         link set lo up\n\
         route add default via {}\n",
        slot.container, slot.host
    );
    command::run(ip(), ["-n", &netns, "-batch", "-"], Some(&inside)).await?;
    Ok(())
}

/// Removes the run's namespace (and with it the veth pair) and, should
/// the namespace have gone first, the host end. Absent is fine.
pub async fn remove(key: &str) -> Result<(), CommandError> {
    let netns = namespace(key);
    if namespace_path(key).exists() {
        match command::run(ip(), ["netns", "del", &netns], None).await {
            Err(error) if !error.says("No such file") => return Err(error),
            _ => {}
        }
    }
    let host = host_interface(key);
    if PathBuf::from("/sys/class/net").join(&host).exists() {
        match command::run(ip(), ["link", "del", &host], None).await {
            Err(error) if !error.says("Cannot find device") => return Err(error),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_parse_and_pools_hand_out_slash_30s() {
        let subnet: Subnet = "10.213.7.9/29".parse().expect("parses");
        assert_eq!(subnet.to_string(), "10.213.7.8/29");
        let pool = Pool::new(subnet);
        let first = pool.take().expect("first");
        let second = pool.take().expect("second");
        assert_eq!(
            (first.host, first.container),
            (Ipv4Addr::new(10, 213, 7, 9), Ipv4Addr::new(10, 213, 7, 10))
        );
        assert_eq!(
            (second.host, second.container),
            (Ipv4Addr::new(10, 213, 7, 13), Ipv4Addr::new(10, 213, 7, 14))
        );
        assert!(pool.take().is_none(), "a /29 holds two /30s");
        drop(first);
        assert_eq!(
            pool.take().expect("returned").host,
            Ipv4Addr::new(10, 213, 7, 9)
        );
        for (text, message) in [
            (
                "10.0.0.0",
                "\"10.0.0.0\" is not ADDRESS/PREFIX (such as 10.213.0.0/16)",
            ),
            ("10.0.0/8", "\"10.0.0\" is not an IPv4 address"),
            ("10.0.0.0/31", "prefix \"31\" is not a number from 8 to 30"),
            ("10.0.0.0/7", "prefix \"7\" is not a number from 8 to 30"),
        ] {
            assert_eq!(text.parse::<Subnet>(), Err(message.to_owned()));
        }
        assert_eq!(host_interface("0123456789ab").len(), 14);
    }
}
