//! Container egress (`serve --container-egress`), proven with real servers,
//! real runc (or runsc) and hostile images against a fake internet: a
//! network namespace of the test's own behind a veth from the host, with
//! a TCP service in it and no route back to the runs' network, so that
//! only the host's NAT brings an answer back.
//!
//! - a run with egress reaches the fake internet, and nothing else: not a
//!   host service on every address (at the host's address or the run's
//!   gateway), not another run's agent listening on every address of its
//!   own, not 169.254.169.254;
//! - a run with egress gets the host's name servers it can reach as its
//!   `/etc/resolv.conf`; a run without keeps its image's own;
//! - a server killed with runs that have egress: a server on another store
//!   runs beside its veth and nft table untouched, and the next server on
//!   its store removes them (egress on or off).
//!
//! Two servers with egress at once are in `isolation` (0 crossings, no
//! address held twice); a run without egress reaching nothing is
//! `isolation::a_container_reaches_no_host_service_no_other_run_and_no_other_machine`.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use runloop_testkit::process::KillOnDrop;
use runloop_testkit::uplink::Uplink;

use super::images::Images;
use super::isolation::{first_text, host_address, run_as, wait_until};
use super::{Server, exited, json_lines, leftovers};

/// Whether the machine has `nft` for egress, and `nsenter` for the fake
/// internet (`skipped: needs …`).
pub fn ready() -> bool {
    runloop_testkit::needs(&[
        runloop_testkit::Part::program("nft", "nftables"),
        runloop_testkit::Part::program("nsenter", "util-linux"),
    ])
}

/// A `container egress` line of a server's log.
#[derive(Debug, Clone)]
pub struct Logged {
    pub key: String,
    pub link: String,
    pub address: String,
    pub gateway: String,
}

/// The value of `name=` on a log line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    line[at..].split_whitespace().next()
}

/// The runs' egress links a server's log names, in the order given.
pub fn links(log: &str) -> Vec<Logged> {
    log.lines()
        .filter(|line| line.contains("container egress") && line.contains(" link="))
        .filter_map(|line| {
            Some(Logged {
                key: field(line, "key")?.to_owned(),
                link: field(line, "link")?.to_owned(),
                address: field(line, "address")?.to_owned(),
                gateway: field(line, "gateway")?.to_owned(),
            })
        })
        .collect()
}

/// Whether the host has an interface named `name`.
pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Whether the nft table of the server on `store` is there.
pub fn table_exists(store: &Path) -> bool {
    Command::new("nft")
        .args(["list", "table", "inet", &runloop_oci::egress::table(store)])
        .output()
        .is_ok_and(|output| output.status.success())
}

/// The IPv4 address of `eth0` in each live run of `keys`: what the
/// runs hold now.
pub fn run_addresses(keys: &[String]) -> BTreeMap<String, String> {
    let mut held = BTreeMap::new();
    for key in keys {
        let netns = format!("runloop-{key}");
        if !Path::new("/run/netns").join(&netns).exists() {
            continue;
        }
        let Ok(output) = Command::new("ip")
            .args(["-n", &netns, "-o", "-4", "addr", "show", "dev", "eth0"])
            .output()
        else {
            continue;
        };
        let text = String::from_utf8_lossy(&output.stdout);
        if let Some(cidr) = text
            .split_whitespace()
            .skip_while(|word| *word != "inet")
            .nth(1)
        {
            held.insert(key.clone(), cidr.to_owned());
        }
    }
    held
}

/// A fake internet at 198.51.100.(4·slot+2) ([`Uplink`]), with the hog
/// serving on every address of it.
pub struct Internet {
    _service: KillOnDrop,
    /// `ADDRESS:PORT` of its service.
    pub target: String,
    // Dropped after the service is killed.
    _uplink: Uplink,
}

impl Internet {
    pub fn new(slot: u8, hog: &Path) -> Internet {
        let uplink = Uplink::new(slot);
        let port = 8000 + u16::from(slot);
        // nsenter, not `ip netns exec`: that makes a mount namespace too,
        // a private copy of every mount of the moment — other tests' run
        // disks among them, which it would then hold busy as long as the
        // service lives.
        let netns = format!("--net={}", uplink.path().display());
        let service = Command::new("nsenter")
            .arg(&netns)
            .arg(hog)
            .args(["tenant", "0"])
            .env("PORT", port.to_string())
            .env("LISTEN_ANY", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the internet's service starts");
        let internet = Internet {
            _service: KillOnDrop(service),
            target: format!("{}:{port}", uplink.far),
            _uplink: uplink,
        };
        // Listening: its socket in /proc/net/tcp (state 0A) of that namespace.
        let listening = format!("00000000:{port:04X} 00000000:0000 0A");
        assert!(
            wait_until(Duration::from_secs(10), || {
                Command::new("nsenter")
                    .args([&netns, "cat", "/proc/net/tcp"])
                    .output()
                    .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&listening))
            }),
            "the internet's service did not listen"
        );
        internet
    }
}

/// The outcome the hog's `reach` report gives for `target`.
fn outcome<'a>(report: &'a str, target: &str) -> &'a str {
    report
        .split("; ")
        .find_map(|part| part.strip_prefix(&format!("{target} ")))
        .unwrap_or_else(|| panic!("{target} not tried: {report}"))
}

#[test]
fn a_run_with_egress_reaches_the_internet_and_no_host_service_no_other_run() {
    if !super::ready() || !ready() {
        return;
    }
    let images = Images::get();
    let internet = Internet::new(2, &images.hog_binary());
    // A service of the host on every address.
    let service = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("host service");
    service.set_nonblocking(true).expect("nonblocking");
    let port = service.local_addr().expect("address").port();
    // Two /30s, one for each run: every address of the network is one
    // of theirs, known before they start.
    let network = "10.215.9.0/29";
    let gateways = ["10.215.9.1", "10.215.9.5"].map(|a| format!("{a}:{port}"));
    let agents = ["10.215.9.2", "10.215.9.6"].map(|a| format!("{a}:8080"));
    let metadata = "169.254.169.254:80".to_owned();
    let own_loopback = format!("127.0.0.1:{port}");
    let mut targets = vec![
        internet.target.clone(),
        metadata.clone(),
        own_loopback.clone(),
    ];
    targets.extend(gateways.iter().cloned());
    targets.extend(agents.iter().cloned());
    let host = host_address().map(|address| format!("{address}:{port}"));
    targets.extend(host.clone());
    let mut args = vec!["/hog", "reach"];
    args.extend(targets.iter().map(String::as_str));
    // The prober listens on its loopback at 9090: its own address's 8080
    // is nobody's.
    let (reach, reach_digest) =
        images.layout_with_env("egress-reach", &[&images.hog], &args, &["PORT=9090"]);
    // The other run listens on every address of its namespace.
    let (tenant, tenant_digest) = images.layout_with_env(
        "egress-tenant",
        &[&images.hog],
        &["/hog", "tenant", "6000"],
        &["LISTEN_ANY=1"],
    );
    let server = Server::start(
        &[
            format!("reach=oci:{}", reach.display()),
            format!("tenant=oci:{}", tenant.display()),
        ],
        &["--container-egress", "--container-egress-network", network],
    );
    let report = std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            run_as(
                &server.url,
                &format!("tenant@{tenant_digest}"),
                r#"{"tenant":"other"}"#,
                "held",
            )
        });
        server.logs_within(Duration::from_secs(60), "oci container ready");
        let probe = run_as(&server.url, &format!("reach@{reach_digest}"), "{}", "x");
        exited(&probe, 0, &server);
        let other = other.join().expect("joined");
        assert_eq!(other.status.code(), Some(0), "{other:?}");
        first_text(&json_lines(&probe))
    });
    println!("from inside a run with egress: {report}");
    let logged = links(&server.log());
    assert_eq!(logged.len(), 2, "{}", server.log());
    let (other, own) = (&logged[0], &logged[1]);
    assert_ne!(other.address, own.address);
    let unreachable = "No route to host";
    assert_eq!(outcome(&report, &internet.target), "connected");
    assert_eq!(outcome(&report, &metadata), unreachable);
    assert_eq!(outcome(&report, &own_loopback), "Connection refused");
    // Its own gateway (the host's end of its link) among them.
    assert!(gateways.contains(&format!("{}:{port}", own.gateway)));
    for target in &gateways {
        assert_eq!(outcome(&report, target), unreachable, "{target}");
    }
    for target in &agents {
        let expected = if target.starts_with(&format!("{}:", own.address)) {
            "Connection refused"
        } else {
            unreachable
        };
        assert_eq!(outcome(&report, target), expected, "{target}");
    }
    if let Some(host) = &host {
        assert_eq!(outcome(&report, host), unreachable);
    }
    assert!(service.accept().is_err(), "the host's service was reached");
    let keys = server.keys();
    let mut linked: Vec<String> = logged.iter().map(|link| link.key.clone()).collect();
    linked.sort();
    assert_eq!(linked, keys, "every run had its own link");
    // Its links and its nft table go with the rest.
    server.stop();
    let log = server.log();
    assert!(
        !log.contains("cannot remove the container's egress link"),
        "{log}"
    );
}

#[test]
fn a_killed_servers_egress_is_swept_by_the_next_on_its_store_and_disturbs_no_other() {
    if !super::ready() || !ready() {
        return;
    }
    let images = Images::get();
    let internet = Internet::new(3, &images.hog_binary());
    let (tenant, digest) =
        images.layout("egress-held", &[&images.hog], &["/hog", "tenant", "60000"]);
    let (reach, reach_digest) = images.layout_with_env(
        "egress-out",
        &[&images.hog],
        &["/hog", "reach", &internet.target],
        &["PORT=9090"],
    );
    let (resolv, resolv_digest) = images.layout(
        "egress-resolv",
        &[&images.hog],
        &["/hog", "cat", "/etc/resolv.conf"],
    );
    let agents = [
        format!("tenant=oci:{}", tenant.display()),
        format!("reach=oci:{}", reach.display()),
        format!("resolv=oci:{}", resolv.display()),
    ];
    let resolv = format!("resolv@{resolv_digest}");
    let egress = ["--container-egress"];
    let scratch = tempfile::tempdir().expect("temp");
    let store: PathBuf = scratch.path().join("store");
    let killed = Server::start_on(scratch, store.clone(), &agents, &egress);
    // A run that holds its container: its loop waits a minute.
    let mut held = Command::new(env!("CARGO_BIN_EXE_runloop"))
        .args([
            "run",
            "--json",
            "--url",
            &killed.url,
            "--image",
            &format!("tenant@{digest}"),
            "--memory",
            "16M",
            "--disk",
            "2M",
            "--agent-json",
            "{}",
            "slow",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run starts");
    killed.logs_within(Duration::from_secs(60), "oci container ready");
    let logged = links(&killed.log());
    assert_eq!(logged.len(), 1, "{}", killed.log());
    let mut child = killed.take().expect("running");
    child.kill().expect("killed");
    child.wait().expect("reaped");
    let _ = held.kill();
    let _ = held.wait();
    let keys = killed.keys();
    assert!(link_exists(&logged[0].link), "the killed server's link");
    assert!(table_exists(&store), "the killed server's table");

    // A server on another store, with egress: its runs get out beside the
    // leftovers, and leave them be.
    let other = Server::start(&agents, &egress);
    let output = run_as(&other.url, &format!("reach@{reach_digest}"), "{}", "x");
    exited(&output, 0, &other);
    let report = first_text(&json_lines(&output));
    assert_eq!(report, format!("{} connected", internet.target));
    // Its resolver configuration: the host's name servers it can reach.
    let output = run_as(&other.url, &resolv, "{}", "x");
    exited(&output, 0, &other);
    let resolver = first_text(&json_lines(&output));
    let host = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    for server in host
        .lines()
        .filter_map(|line| line.strip_prefix("nameserver "))
    {
        let reachable = server
            .trim()
            .parse::<Ipv4Addr>()
            .is_ok_and(|a| !a.is_loopback() && !a.is_link_local());
        assert_eq!(
            resolver.contains(&format!("nameserver {}\n", server.trim())),
            reachable,
            "{server}: {resolver:?}"
        );
    }
    let theirs = links(&other.log());
    assert_eq!(theirs.len(), 2);
    assert_ne!(theirs[0].address, logged[0].address);
    assert!(link_exists(&logged[0].link) && table_exists(&store));

    // The next server on the killed one's store, without egress: the run's
    // link and the table go before it serves; the other server's stays.
    let scratch = tempfile::tempdir().expect("temp");
    let next = Server::start_on(scratch, store.clone(), &agents, &[]);
    assert!(!link_exists(&logged[0].link), "{}", next.log());
    assert!(!table_exists(&store), "{}", next.log());
    assert_eq!(
        leftovers(&store, &keys),
        Vec::<String>::new(),
        "{}",
        next.log()
    );
    assert!(table_exists(&other.store), "the other server's table");
    assert!(
        next.log()
            .contains("removing the container egress table of an earlier server"),
        "{}",
        next.log()
    );
    // Without egress, a run reaches nothing.
    let output = run_as(&next.url, &format!("reach@{reach_digest}"), "{}", "x");
    exited(&output, 0, &next);
    let report = first_text(&json_lines(&output));
    assert_eq!(
        report,
        format!("{} Network is unreachable", internet.target)
    );
    assert!(links(&next.log()).is_empty());
    // And keeps its image's resolver configuration (the hog has none).
    let output = run_as(&next.url, &resolv, "{}", "x");
    assert_eq!(
        first_text(&json_lines(&output)),
        "/etc/resolv.conf: No such file or directory"
    );

    other.stop();
    next.stop();
    drop(killed);
}
