//! Container egress on a real kernel, with real `ip` and `nft`: two
//! servers' runs (each server its own store and table) get distinct /30s
//! claimed host-wide, reach a fake internet through NAT, and reach
//! nothing else — not the host, not each other, not 169.254.169.254, and
//! nothing reaches them; their tracked connections go with their links; a
//! killed server's link and table are removed by
//! the next server on its store, and never by a server on another. Needs
//! root, `ip` and `nft`.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use runloop_oci::egress::{self, Egress, EgressError, EgressNetwork, Link};
use runloop_oci::network;
use runloop_testkit::uplink::{Uplink, ip};
use rustix::thread::LinkNameSpaceType;

fn system_ready() -> bool {
    use runloop_testkit::{Part, needs};
    needs(&[
        Part::Root,
        Part::program("ip", "iproute2"),
        Part::program("nft", "nftables"),
    ])
}

/// Runs `work` on a thread inside the network namespace at `path`.
fn inside<T: Send + 'static>(path: &Path, work: impl FnOnce() -> T + Send + 'static) -> T {
    let netns = File::open(path).expect("the namespace");
    std::thread::spawn(move || {
        rustix::thread::move_into_link_name_space(netns.as_fd(), Some(LinkNameSpaceType::Network))
            .expect("setns");
        work()
    })
    .join()
    .expect("the thread inside")
}

/// A connection to `target` (4 s at most: the kernel rate-limits the
/// ICMP refusals, so one may come only with the SYN sent again after a
/// second): what came of it.
fn dial(target: SocketAddr) -> Result<String, ErrorKind> {
    let mut stream =
        TcpStream::connect_timeout(&target, Duration::from_secs(4)).map_err(|e| e.kind())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let mut said = String::new();
    let _ = stream.read_to_string(&mut said);
    Ok(said)
}

/// [`dial`] from inside the namespace at `path`.
fn dial_from(path: &Path, target: SocketAddr) -> Result<String, ErrorKind> {
    inside(path, move || dial(target))
}

/// A listener on every address of the namespace at `path` that answers
/// each connection with the address it came from.
fn echo_peer(path: &Path) -> u16 {
    let listener = inside(path, || {
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("bind")
    });
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let peer = stream.peer_addr().map(|a| a.ip().to_string());
            let _ = std::io::Write::write_all(&mut stream, peer.unwrap_or_default().as_bytes());
        }
    });
    port
}

/// A fake internet ([`Uplink`]) with a service on it ([`echo_peer`]).
struct Internet {
    uplink: Uplink,
    service: SocketAddr,
}

impl Internet {
    fn new(slot: u8) -> Internet {
        let uplink = Uplink::new(slot);
        let port = echo_peer(&uplink.path());
        Internet {
            service: SocketAddr::from((uplink.far, port)),
            uplink,
        }
    }
}

/// A run: its namespace, its directory and its egress link.
struct Run {
    key: String,
    dir: PathBuf,
    link: Link,
}

impl Run {
    async fn attach(egress: &Egress, runs: &Path) -> Result<Run, EgressError> {
        let key = runloop_oci::random_name();
        let dir = runs.join(&key);
        std::fs::create_dir_all(&dir).expect("run dir");
        network::create(&key).await.expect("namespace");
        match egress.attach(&key, &dir).await {
            Ok(link) => Ok(Run { key, dir, link }),
            Err(error) => {
                Run::remove(&key, &dir).await;
                Err(error)
            }
        }
    }

    fn path(&self) -> PathBuf {
        network::namespace_path(&self.key)
    }

    /// What a teardown does for the network: the link, then the namespace.
    async fn remove(key: &str, dir: &Path) {
        egress::detach(key, dir).await.expect("detached");
        network::remove(key).await.expect("namespace removed");
        let _ = std::fs::remove_dir_all(dir);
    }

    async fn end(self) {
        Run::remove(&self.key, &self.dir).await;
    }
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

fn table_exists(table: &str) -> bool {
    Command::new("nft")
        .args(["list", "table", "inet", table])
        .output()
        .expect("nft runs")
        .status
        .success()
}

/// How many connection-tracking entries have `address` as their source.
fn tracked(address: Ipv4Addr) -> usize {
    let table = std::fs::read_to_string("/proc/net/nf_conntrack").expect("nf_conntrack");
    let source = format!(" src={address} ");
    table.lines().filter(|line| line.contains(&source)).count()
}

/// The host's first global IPv4 address, if it has one.
fn host_address() -> Option<Ipv4Addr> {
    let output = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .filter(|line| !line.contains(" rlx") && !line.contains(" rlti"))
        .find_map(|line| {
            let cidr = line
                .split_whitespace()
                .skip_while(|w| *w != "inet")
                .nth(1)?;
            cidr.split('/').next()?.parse().ok()
        })
}

#[tokio::test]
async fn two_servers_runs_reach_the_internet_by_nat_and_nothing_else() {
    if !system_ready() {
        return;
    }
    let internet = Internet::new(1);
    let (store_a, store_b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let network = egress::DEFAULT_NETWORK;
    let a = Egress::open(network, store_a.path())
        .await
        .expect("a opens");
    let b = Egress::open(network, store_b.path())
        .await
        .expect("b opens");
    assert_ne!(a.table(), b.table());
    assert!(table_exists(a.table()) && table_exists(b.table()));
    assert_eq!(
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
            .expect("ip_forward")
            .trim(),
        "1"
    );
    let runs_a = store_a.path().join("runs");
    let runs_b = store_b.path().join("runs");
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(Run::attach(&a, &runs_a).await.expect("a's run"));
        runs.push(Run::attach(&b, &runs_b).await.expect("b's run"));
    }
    let mut names: Vec<&str> = runs.iter().map(|run| run.link.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), runs.len(), "two runs share a link");

    // Every run has a service on every address of its own; the host too.
    let ports: Vec<u16> = runs.iter().map(|run| echo_peer(&run.path())).collect();
    let host_service = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("host service");
    host_service.set_nonblocking(true).expect("nonblocking");
    let host_port = host_service.local_addr().expect("address").port();

    let prohibited = Err(ErrorKind::HostUnreachable);
    for (i, run) in runs.iter().enumerate() {
        // Out, through NAT: the service sees the host's address, not the run's.
        let said = dial_from(&run.path(), internet.service).expect("the internet answers");
        assert_eq!(said, internet.uplink.host.to_string(), "run {i}");
        // Its own service, on its own address: the run's own stack.
        let own = SocketAddr::from((run.link.run, ports[i]));
        assert_eq!(
            dial_from(&run.path(), own),
            Ok(run.link.run.to_string()),
            "run {i}"
        );
        // The host, on its end of the run's link and on its own address.
        let mut host_targets = vec![SocketAddr::from((run.link.host, host_port))];
        host_targets.extend(host_address().map(|address| SocketAddr::from((address, host_port))));
        for target in host_targets {
            assert_eq!(
                dial_from(&run.path(), target),
                prohibited,
                "run {i} to {target}"
            );
        }
        // Every other run, of either server, on its address and its gateway.
        for (j, other) in runs.iter().enumerate().filter(|(j, _)| *j != i) {
            for target in [
                SocketAddr::from((other.link.run, ports[j])),
                SocketAddr::from((other.link.host, host_port)),
            ] {
                assert_eq!(
                    dial_from(&run.path(), target),
                    prohibited,
                    "run {i} to {target}"
                );
            }
        }
        // Cloud metadata.
        let metadata = SocketAddr::from(([169, 254, 169, 254], 80));
        assert_eq!(dial_from(&run.path(), metadata), prohibited, "run {i}");
    }
    // Nothing gets in: not from the host, not from the internet routed at it.
    let (target, port) = (runs[0].link.run, ports[0]);
    assert_eq!(dial(SocketAddr::from((target, port))), prohibited);
    ip(&[
        "-n",
        &internet.uplink.name,
        "route",
        "add",
        &network.to_string(),
        "via",
        &internet.uplink.host.to_string(),
    ]);
    assert_eq!(
        dial_from(&internet.uplink.path(), SocketAddr::from((target, port))),
        prohibited
    );
    assert!(
        host_service.accept().is_err(),
        "a run reached the host's service"
    );

    // The kernel tracks each run's connections out; the teardown has it
    // forget them, so that a later run given the /30 is sent nothing of them.
    let addresses: Vec<Ipv4Addr> = runs.iter().map(|run| run.link.run).collect();
    for address in &addresses {
        assert!(tracked(*address) > 0, "{address}: nothing tracked");
    }
    // One run's teardown forgets its own, and no other run's.
    let links: Vec<String> = runs.iter().map(|run| run.link.name.clone()).collect();
    for (i, run) in runs.into_iter().enumerate() {
        run.end().await;
        assert!(!link_exists(&links[i]), "{} is left", links[i]);
        assert_eq!(tracked(addresses[i]), 0, "{}: still tracked", addresses[i]);
        for later in &addresses[i + 1..] {
            assert!(
                tracked(*later) > 0,
                "{later}: forgotten with {}",
                addresses[i]
            );
        }
    }
    a.close().await;
    b.close().await;
    assert!(!table_exists(a.table()) && !table_exists(b.table()));
    assert!(!store_a.path().join("egress").exists());
}

#[tokio::test]
async fn a_killed_servers_link_and_table_go_with_the_next_server_on_its_store_only() {
    if !system_ready() {
        return;
    }
    // Two /30s, outside the default network (the other test's).
    let network: EgressNetwork = "10.214.77.0/29".parse().expect("network");
    let (store_a, store_b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let (runs_a, runs_b) = (store_a.path().join("runs"), store_b.path().join("runs"));
    let killed = Egress::open(network, store_a.path())
        .await
        .expect("a opens");
    let left = Run::attach(&killed, &runs_a).await.expect("a's run");
    let table_a = killed.table().to_owned();
    // Killed: no close, no teardown.
    drop(killed);
    assert!(link_exists(&left.link.name) && table_exists(&table_a));

    // Another server on another store: the leftover's /30 is not handed
    // out again, and nothing of the leftover is touched.
    let b = Egress::open(network, store_b.path())
        .await
        .expect("b opens");
    let other = Run::attach(&b, &runs_b).await.expect("b's run");
    assert_ne!(other.link, left.link);
    assert_ne!(other.link.run, left.link.run);
    match Run::attach(&b, &runs_b).await {
        Err(EgressError::Full(full)) => assert_eq!(full, network),
        Err(error) => panic!("{error}"),
        Ok(run) => panic!("a third run got {:?} of two /30s", run.link),
    }
    assert!(link_exists(&left.link.name) && table_exists(&table_a));

    // The next server on a's store: the run's link and a's table go (the
    // sweep's teardown, then the store's table), b's stay.
    Run::remove(&left.key, &left.dir).await;
    egress::sweep(store_a.path()).await;
    assert!(!link_exists(&left.link.name));
    assert!(!table_exists(&table_a));
    assert!(!store_a.path().join("egress").exists());
    assert!(link_exists(&other.link.name) && table_exists(b.table()));
    let next = Egress::open(network, store_a.path())
        .await
        .expect("a again");
    let again = Run::attach(&next, &runs_a).await.expect("the freed /30");
    assert_eq!(again.link, left.link);

    for run in [other, again] {
        run.end().await;
    }
    next.close().await;
    b.close().await;
    assert!(!table_exists(next.table()) && !table_exists(b.table()));
}
