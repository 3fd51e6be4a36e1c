//! Run networks on a real kernel: namespaces made with `ip`, listeners put
//! inside them by a thread that enters them, and the host's dials through
//! [`Netns::connect`] — which reach the run's own loopback and nothing
//! else: not another run listening on the same port, not a host service
//! on every address, not a namespace that was removed. Needs root.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsFd;
use std::process::Command;

use runloop_oci::network::{self, Netns};
use rustix::thread::LinkNameSpaceType;
use tokio::io::AsyncReadExt;

/// Whether the machine can run this test; says why not when it cannot
/// (`skipped: needs …`, a failure under `RUNLOOP_REQUIRE_SYSTEM=1`).
fn system_ready() -> bool {
    use runloop_testkit::{Part, needs};
    needs(&[Part::Root, Part::program("ip", "iproute2")])
}

/// A listener on 127.0.0.1:`port` inside the namespace of run `key`, made
/// by a thread that enters it; it answers each connection with `word`.
fn listen_inside(key: &str, port: u16, word: &'static str) -> std::thread::JoinHandle<()> {
    let netns = File::open(network::namespace_path(key)).expect("namespace file");
    let (bound_tx, bound) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        rustix::thread::move_into_link_name_space(netns.as_fd(), Some(LinkNameSpaceType::Network))
            .expect("setns");
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("bind inside");
        bound_tx.send(()).expect("bound");
        // Two connections, then done.
        for _ in 0..2 {
            let (mut stream, _) = listener.accept().expect("accept");
            stream.write_all(word.as_bytes()).expect("write");
        }
    });
    bound.recv().expect("the listener is up");
    thread
}

async fn read_all(netns: &Netns, port: u16) -> std::io::Result<String> {
    let mut stream = netns.connect(port).await?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await?;
    Ok(text)
}

#[tokio::test]
async fn a_dial_through_a_run_namespace_reaches_that_run_and_nothing_else() {
    if !system_ready() {
        return;
    }
    let (a_key, b_key) = (runloop_oci::random_name(), runloop_oci::random_name());
    let a = network::create(&a_key).await.expect("namespace a");
    let b = network::create(&b_key).await.expect("namespace b");
    assert_eq!(a.name(), network::namespace(&a_key));

    // The same port in two runs: each dial reaches its own.
    let port = 8080;
    let a_thread = listen_inside(&a_key, port, "a");
    let b_thread = listen_inside(&b_key, port, "b");
    assert_eq!(read_all(&a, port).await.expect("a answers"), "a");
    assert_eq!(read_all(&b, port).await.expect("b answers"), "b");
    // The host's own loopback does not have them.
    let on_host = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port));
    assert!(
        on_host.is_err() || {
            // Something of the host's own may listen there; it is not a run.
            let mut text = String::new();
            let _ = on_host.expect("connected").read_to_string(&mut text);
            text != "a" && text != "b"
        },
        "a run's listener is reachable from the host's loopback"
    );

    // A host service on every address: not reachable from inside a run.
    let host_service = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("host service");
    let host_port = host_service.local_addr().expect("address").port();
    let refused = a
        .connect(host_port)
        .await
        .expect_err("the host's service is not in the run");
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "{refused}"
    );

    // A removed namespace: still held open, nothing in it answers.
    assert_eq!(read_all(&a, port).await.expect("a answers twice"), "a");
    a_thread.join().expect("a's listener");
    network::remove(&a_key).await.expect("removed");
    assert!(!network::namespace_path(&a_key).exists());
    let gone = a.connect(port).await.expect_err("nothing is left in a");
    assert_eq!(gone.kind(), std::io::ErrorKind::ConnectionRefused, "{gone}");
    // Removing twice is fine.
    network::remove(&a_key).await.expect("removed again");

    assert_eq!(read_all(&b, port).await.expect("b answers twice"), "b");
    b_thread.join().expect("b's listener");
    network::remove(&b_key).await.expect("removed");
    let names = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns");
    let names = String::from_utf8_lossy(&names.stdout);
    assert!(
        !names.contains(&a_key) && !names.contains(&b_key),
        "{names}"
    );
}

#[tokio::test]
async fn many_dials_at_once_through_many_namespaces_each_reach_their_own() {
    if !system_ready() {
        return;
    }
    let keys: Vec<String> = (0..8).map(|_| runloop_oci::random_name()).collect();
    let mut namespaces = Vec::new();
    for key in &keys {
        namespaces.push(network::create(key).await.expect("namespace"));
    }
    let words: Vec<&'static str> = ["0", "1", "2", "3", "4", "5", "6", "7"].to_vec();
    let threads: Vec<_> = keys
        .iter()
        .zip(&words)
        .map(|(key, word)| listen_inside(key, 9000, word))
        .collect();
    // Two dials to each, all at once.
    let dials = namespaces
        .iter()
        .chain(namespaces.iter())
        .map(|netns| read_all(netns, 9000));
    let answers = futures_util::future::join_all(dials).await;
    for (i, answer) in answers.into_iter().enumerate() {
        assert_eq!(answer.expect("answers"), words[i % words.len()]);
    }
    for thread in threads {
        thread.join().expect("listener");
    }
    for key in &keys {
        network::remove(key).await.expect("removed");
    }
}
