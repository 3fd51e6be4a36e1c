//! The agent program's port: handed out once, and checked to belong to
//! the run before anything is sent to it.
//!
//! Agent programs take a port number (`$PORT`, protocol §10) and bind it
//! themselves, so between the server's choice and the child's `bind`
//! anyone can take the port. Two things keep one run from ever reaching
//! another's agent program:
//!
//! - **Leases.** A port handed to a run is not handed to another run of
//!   this process while the first one lives, even after the child stops
//!   listening on it.
//! - **The owner check.** Before the server registers, it looks up every
//!   socket listening on the port where `127.0.0.1` reaches it (in
//!   `/proc/self/net/tcp` and `tcp6`: the loopback address, `0.0.0.0`,
//!   `::` and `::ffff:127.0.0.1`) and requires each to be open in a
//!   process of the run (a socket inode among the `/proc/PID/fd` links of
//!   the run's processes). A port someone else listens on is given up and
//!   the start is tried again on another.

use std::collections::{BTreeSet, HashSet};
use std::io;
use std::net::Ipv4Addr;
use std::sync::Mutex;

/// Ports leased to running children of this process.
static LEASED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A port leased to one run until this is dropped.
#[derive(Debug)]
pub(super) struct Lease(u16);

impl Lease {
    /// A loopback port no one listens on now and no run of this process
    /// holds.
    pub(super) fn take() -> io::Result<Lease> {
        for _ in 0..64 {
            let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
                .local_addr()?
                .port();
            let mut leased = LEASED
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if leased.insert(port) {
                return Ok(Lease(port));
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "64 ports in a row were already leased to runs",
        ))
    }

    /// The port.
    pub(super) fn port(&self) -> u16 {
        self.0
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        LEASED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&self.0);
    }
}

/// Who listens on a port, as far as `127.0.0.1` is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Listener {
    /// Nobody.
    Nobody,
    /// Only processes of the run.
    Run,
    /// Somebody else (perhaps with the run too).
    Other,
}

/// Who listens on `port`, where `run` is the run's processes.
pub(super) fn listener(port: u16, run: &[u32]) -> Listener {
    let inodes = listening_inodes(port);
    if inodes.is_empty() {
        return Listener::Nobody;
    }
    let ours = socket_inodes(run);
    if inodes.iter().all(|inode| ours.contains(inode)) {
        Listener::Run
    } else {
        Listener::Other
    }
}

/// Addresses `127.0.0.1` reaches, as `/proc/net/tcp{,6}` writes them.
const REACHED: [&str; 4] = [
    "0100007F",
    "00000000",
    "00000000000000000000000000000000",
    "0000000000000000FFFF00000100007F",
];

/// The inodes of the sockets listening on `port` that `127.0.0.1` reaches.
fn listening_inodes(port: u16) -> Vec<u64> {
    let mut found = Vec::new();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            found.extend(listening_in(&text, port));
        }
    }
    found
}

/// The inodes of the listening sockets of one `/proc/net/tcp{,6}` table
/// on `port` that `127.0.0.1` reaches.
fn listening_in(table: &str, port: u16) -> impl Iterator<Item = u64> + '_ {
    const LISTEN: &str = "0A";
    table.lines().skip(1).filter_map(move |line| {
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (address, local_port) = fields.get(1)?.split_once(':')?;
        let matches = *fields.get(3)? == LISTEN
            && u16::from_str_radix(local_port, 16).ok()? == port
            && REACHED.contains(&address);
        if matches {
            fields.get(9)?.parse().ok()
        } else {
            None
        }
    })
}

/// The inodes of the sockets the processes `pids` have open.
fn socket_inodes(pids: &[u32]) -> HashSet<u64> {
    let mut inodes = HashSet::new();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && let Some(inode) = target
                    .to_str()
                    .and_then(|t| t.strip_prefix("socket:["))
                    .and_then(|t| t.strip_suffix(']'))
                    .and_then(|t| t.parse().ok())
            {
                inodes.insert(inode);
            }
        }
    }
    inodes
}

/// `pid` and every process descended from it (for a run without a
/// cgroup), from the parent links in `/proc/*/stat`.
pub(super) fn descendants(pid: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let parent = std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                });
            if let Some(parent) = parent {
                parents.push((child, parent));
            }
        }
    }
    let mut family = vec![pid];
    let mut grew = true;
    while grew {
        grew = false;
        for &(child, parent) in &parents {
            if family.contains(&parent) && !family.contains(&child) {
                family.push(child);
                grew = true;
            }
        }
    }
    family
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0000000000000000 100 0 0 10 0
   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 333 1 0000000000000000 20 4 30 10 -1
   3: 0200007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 444 1 0000000000000000 100 0 0 10 0
   4: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 555 1 0000000000000000 100 0 0 10 0
";

    #[test]
    fn only_listeners_on_the_port_that_loopback_reaches_count() {
        // 8080 = 0x1F90: the loopback and wildcard listeners, not the
        // connection (state 01), 127.0.0.2, or another port.
        assert_eq!(listening_in(TABLE, 8080).collect::<Vec<_>>(), [111, 222]);
        assert_eq!(listening_in(TABLE, 8081).collect::<Vec<_>>(), [555]);
        assert_eq!(listening_in(TABLE, 1).count(), 0);
    }

    #[test]
    fn a_socket_of_this_process_is_the_run_s_and_no_one_else_s() {
        let socket = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binds");
        let port = socket.local_addr().expect("address").port();
        assert_eq!(listener(port, &[std::process::id()]), Listener::Run);
        assert_eq!(listener(port, &[]), Listener::Other);
        drop(socket);
        assert_eq!(listener(port, &[std::process::id()]), Listener::Nobody);
    }

    #[test]
    fn leases_are_not_handed_out_twice() {
        let a = Lease::take().expect("a port");
        let b = Lease::take().expect("another");
        assert_ne!(a.port(), b.port());
        let port = a.port();
        assert!(LEASED.lock().expect("lock").contains(&port));
        drop(a);
        assert!(!LEASED.lock().expect("lock").contains(&port));
    }

    #[test]
    fn this_process_descends_from_itself() {
        assert_eq!(descendants(std::process::id())[0], std::process::id());
    }
}
