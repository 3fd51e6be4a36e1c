//! What a test's process still holds after the server let go: tasks
//! alive on the test's runtime and connected sockets to a port.

use std::time::Duration;

use runloop_testkit::wait::PATIENCE;

/// Tasks alive on the current runtime (each `#[tokio::test]` has its own).
pub fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Waits until the runtime is back to `baseline` tasks.
pub async fn tasks_back_to(baseline: usize) {
    let wait = async {
        while alive_tasks() > baseline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    if tokio::time::timeout(PATIENCE, wait).await.is_err() {
        panic!("{} tasks alive, {baseline} before", alive_tasks());
    }
}

/// Connected TCP sockets this process holds (listeners excluded) with
/// `port` at either end, from `/proc/self/fd` and `/proc/net/tcp{,6}`.
pub fn held_sockets(port: u16) -> usize {
    let ours: std::collections::HashSet<u64> = std::fs::read_dir("/proc/self/fd")
        .expect("procfs")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?.to_owned();
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect();
    let port_of = |address: &str| {
        address
            .rsplit_once(':')
            .and_then(|(_, port)| u16::from_str_radix(port, 16).ok())
    };
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| table.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(state), Some(inode)) =
                (fields.get(1), fields.get(2), fields.get(3), fields.get(9))
            else {
                return false;
            };
            let listening = *state == "0A";
            let inode: u64 = inode.parse().unwrap_or(0);
            !listening
                && ours.contains(&inode)
                && (port_of(local) == Some(port) || port_of(remote) == Some(port))
        })
        .count()
}

/// Waits until this process holds no connected socket to or from `port`.
pub async fn sockets_closed(port: u16) {
    let wait = async {
        while held_sockets(port) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    if tokio::time::timeout(PATIENCE, wait).await.is_err() {
        panic!("{} sockets to port {port} still open", held_sockets(port));
    }
}
