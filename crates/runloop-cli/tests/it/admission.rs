//! `runloop serve` and the connections it takes on (issue 13, rows 3–7):
//! little read before authorization, few connections not yet authorized,
//! few per address and per token, the rest closed at once — and callers
//! within the limits still served, over real loopback sockets, with the
//! server's memory and descriptors read from `/proc/PID`.
//!
//! The attackers connect from 127.0.0.2, the callers from 127.0.0.1: two
//! addresses, both loopback. The loads at the full size are
//! figures of `benches/figures.rs`:
//! `cargo bench -p runloop-cli --bench figures -- admission`.

use crate::common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::Serve;
use runloop::client::{Client, RunError};
use runloop::proto::agents_run::{Container, Image, ImageRef, RunRequest};
use runloop::proto::run_loop::Outcome;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const MIB: u64 = 1 << 20;

/// The attackers' address.
const ATTACKER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("a runtime")
}

fn addr(server: &Serve) -> SocketAddr {
    server
        .url
        .trim_start_matches("ws://")
        .parse()
        .expect("an address")
}

/// Descriptors process `pid` has open.
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |fds| fds.count())
}

fn demo_request() -> RunRequest {
    let image = Image::Server(ImageRef {
        name: "demo".into(),
        digest: format!("sha256:{}", "0".repeat(64)),
    });
    let agent = serde_json::value::RawValue::from_string("{}".into()).expect("JSON");
    RunRequest::new(Container::new(image, MIB, 0), agent)
}

/// One demo loop on a new connection with `credential`: whether it finished.
async fn served(url: &str, credential: &str) -> Result<(), String> {
    let client = Client::connect(url, credential)
        .await
        .map_err(|e| e.to_string())?;
    let run = client
        .start(demo_request())
        .await
        .map_err(|e| e.to_string())?;
    let outcome = run.run_loop("hello there").outcome().await;
    run.stop().await;
    client.close().await;
    match outcome {
        Outcome::Finished { fatal: false } => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

/// A TCP connection to `to` from `from`.
async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

const UPGRADE: &str = "GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: \
                       Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                       Sec-WebSocket-Version: 13\r\n\r\n";

/// Completes the WebSocket handshake by hand on `tcp`.
async fn upgrade(tcp: &mut TcpStream) -> std::io::Result<()> {
    tcp.write_all(UPGRADE.as_bytes()).await?;
    let mut response = Vec::new();
    let mut byte = [0u8; 1];
    while !response.ends_with(b"\r\n\r\n") {
        if tcp.read(&mut byte).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        response.push(byte[0]);
    }
    if response.starts_with(b"HTTP/1.1 101") {
        Ok(())
    } else {
        Err(std::io::Error::other("not upgraded"))
    }
}

/// From `from`: the handshake, then the start of one binary message of
/// `size` bytes (masked with a zero key, so its payload is zeros on the
/// wire), written until the server stops taking it. How many bytes went,
/// and whether all of them did.
async fn flood_before_authorizing(from: IpAddr, to: SocketAddr, size: u64) -> (u64, bool) {
    let Ok(mut tcp) = connect_from(from, to).await else {
        return (0, false);
    };
    if upgrade(&mut tcp).await.is_err() {
        return (0, false);
    }
    let mut header = vec![0x82, 0x80 | 127];
    header.extend_from_slice(&size.to_be_bytes());
    header.extend_from_slice(&[0; 4]);
    if tcp.write_all(&header).await.is_err() {
        return (0, false);
    }
    let zeros = vec![0u8; 64 << 10];
    let mut sent = 0;
    while sent < size {
        let piece = zeros.len().min((size - sent) as usize);
        let written = tokio::time::timeout(Duration::from_secs(5), tcp.write_all(&zeros[..piece]));
        match written.await {
            Ok(Ok(())) => sent += piece as u64,
            _ => return (sent, false),
        }
    }
    (sent, true)
}

#[test]
fn a_message_over_the_bound_before_authorization_ends_the_connection_unread() {
    let mut server = Serve::start("info", &[]);
    let log = common::drain(server.stderr());
    let to = addr(&server);
    runtime().block_on(async {
        // 15 MiB: the server stops reading it, and closes.
        let (sent, all) = flood_before_authorizing(ATTACKER, to, 15 * MIB).await;
        assert!(!all, "the whole 15 MiB was taken ({sent} bytes)");
        // An authorization over 64 KiB is refused; one under it is served.
        let refused = served(&server.url, &"t".repeat(65 << 10)).await;
        assert!(refused.is_err(), "{refused:?}");
        served(&server.url, &"t".repeat(60 << 10))
            .await
            .expect("an authorization within the bound");
    });
    drop(server);
    let log = log.join().expect("the log");
    assert!(
        log.contains(
            "more than max_authorization_size (65536 bytes) was sent before authorization"
        ),
        "{log}"
    );
}

/// `connections` connections from distinct ports of `from`, each sending
/// 15 MiB before authorizing, all at once; the server's peak RSS growth.
fn pre_authorization_flood(args: &[&str], connections: usize) -> (u64, u64) {
    let server = Serve::start("error", args);
    let to = addr(&server);
    let runtime = runtime();
    runtime.block_on(async {
        served(&server.url, "").await.expect("a warm-up loop");
    });
    let baseline = server.status("VmRSS");
    runtime.block_on(async {
        let floods: Vec<_> = (0..connections)
            .map(|_| tokio::spawn(flood_before_authorizing(ATTACKER, to, 15 * MIB)))
            .collect();
        for flood in floods {
            let (_, all) = flood.await.expect("a flood");
            assert!(!all, "a whole 15 MiB message was taken");
        }
        served(&server.url, "").await.expect("served after");
    });
    let peak = server.status("VmHWM");
    (baseline, peak)
}

#[test]
fn floods_before_authorization_keep_the_server_small() {
    // Many attacking addresses, as far as the per-address limit goes: only
    // the bound on what is read, and the limit of connections not yet
    // authorized, hold the server.
    let (baseline, peak) = pre_authorization_flood(&["--max-connections-per-address", "1024"], 64);
    assert!(
        peak < baseline + 64 * MIB,
        "peak {} MiB over a baseline of {} MiB",
        peak / MIB,
        baseline / MIB
    );
}

/// 1024 connections × 15 MiB before authorizing.
/// A figure of `benches/figures.rs` (not a test: a load).
#[allow(dead_code)]
pub fn a_thousand_floods_before_authorization() {
    for (what, args) in [
        ("defaults", &[][..]),
        (
            "--max-connections-per-address 1024",
            &["--max-connections-per-address", "1024"][..],
        ),
    ] {
        let (baseline, peak) = pre_authorization_flood(args, 1024);
        println!(
            "row 3 ({what}): 1024 connections × 15 MiB before authorizing: baseline {} MiB, \
             peak {} MiB, growth {} MiB",
            baseline / MIB,
            peak / MIB,
            (peak - baseline) / MIB
        );
        assert!(peak < baseline + 64 * MIB);
    }
}

/// A slowloris from `from` until `stop`: `sockets` connections, each
/// silent, or sending its upgrade request a byte at a time; reconnecting a
/// second after the server closes one. How many connects it made.
async fn slowloris(
    from: IpAddr,
    to: SocketAddr,
    sockets: usize,
    stop: tokio_util::sync::CancellationToken,
) -> u64 {
    let tasks: Vec<_> = (0..sockets)
        .map(|i| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut connects = 0u64;
                while !stop.is_cancelled() {
                    connects += 1;
                    let Ok(mut tcp) = connect_from(from, to).await else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let hold = async {
                        if i % 2 == 0 {
                            // Silent: wait for the server to close.
                            let _ = tcp.read(&mut [0u8; 64]).await;
                        } else {
                            for byte in UPGRADE.as_bytes() {
                                if tcp.write_all(&[*byte]).await.is_err() {
                                    return;
                                }
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    };
                    tokio::select! {
                        () = hold => {}
                        () = stop.cancelled() => {}
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                connects
            })
        })
        .collect();
    let mut connects = 0;
    for task in tasks {
        connects += task.await.unwrap_or(0);
    }
    connects
}

/// Callers served during a slowloris of `sockets` from another address:
/// (served, tries, the attacker's connects).
fn served_during_slowloris(sockets: usize, tries: usize) -> (usize, usize, u64) {
    let server = Serve::start("error", &[]);
    let to = addr(&server);
    runtime().block_on(async {
        let stop = tokio_util::sync::CancellationToken::new();
        let attack = tokio::spawn(slowloris(ATTACKER, to, sockets, stop.clone()));
        // Let the attack fill what it can.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut ok = 0;
        for _ in 0..tries {
            if served(&server.url, "").await.is_ok() {
                ok += 1;
            }
        }
        stop.cancel();
        let connects = attack.await.expect("the attack");
        (ok, tries, connects)
    })
}

#[test]
fn callers_are_served_during_a_slowloris_from_another_address() {
    let (ok, tries, _) = served_during_slowloris(1024, 10);
    assert!(ok * 10 >= tries * 9, "served {ok} of {tries}");
}

/// 1024 slowloris sockets from one address, 50 tries.
/// A figure of `benches/figures.rs` (not a test: a load).
#[allow(dead_code)]
pub fn slowloris_from_one_address() {
    let (ok, tries, connects) = served_during_slowloris(1024, 50);
    println!(
        "row 4: 1024 slowloris sockets from 127.0.0.2: callers from 127.0.0.1 served {ok} of {tries} tries; the attacker made {connects} connects"
    );
    assert!(ok * 10 >= tries * 9);
}

/// `runloop serve ARGS…` under `ulimit -n NOFILE`, its log drained.
struct Limited {
    child: std::process::Child,
    url: String,
    log: std::thread::JoinHandle<String>,
}

impl Limited {
    fn start(nofile: u32, args: &str) -> Limited {
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -n {nofile} && exec \"$0\" serve --listen 127.0.0.1:0 {args}"
            ))
            .arg(env!("CARGO_BIN_EXE_runloop"))
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("sh runs");
        let url = common::url(&mut child);
        let log = common::drain(child.stderr.take().expect("stderr"));
        Limited { child, url, log }
    }

    /// Ends the server, and checks that it never ran out of descriptors.
    fn never_ran_out(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let log = self.log.join().expect("the log");
        assert!(!log.contains("Too many open files"), "{log}");
    }
}

#[test]
fn silent_sockets_past_the_limits_hold_no_descriptors() {
    // 64 + 100 + 50 + 4 × 10 + 4 × 10 = 294 descriptors at most, in 512;
    // one address holds fewer than all the places of connections not yet
    // authorized.
    let server = Limited::start(
        512,
        "--max-connections 100 --max-unauthorized 50 --max-runs 10 \
         --max-loops-per-identity 10 --max-connections-per-address 16",
    );
    let url = &server.url;
    let to: SocketAddr = url.trim_start_matches("ws://").parse().expect("an address");
    runtime().block_on(async {
        // A caller authorized before the attack, with a run.
        let client = Client::connect(url, "").await.expect("connects");
        let run = client.start(demo_request()).await.expect("a run");
        let mut silent = Vec::new();
        for _ in 0..2000 {
            if let Ok(tcp) = connect_from(ATTACKER, to).await {
                silent.push(tcp);
            }
        }
        let held = descriptors(server.child.id());
        assert!(held < 512, "{held} descriptors open");
        // Both the caller already served and a new one are served.
        let outcome = run.run_loop("still here").outcome().await;
        assert_eq!(outcome, Outcome::Finished { fatal: false });
        served(url, "").await.expect("a new caller is served");
        run.stop().await;
        client.close().await;
        drop(silent);
    });
    server.never_ran_out();
}

#[test]
fn past_max_connections_under_a_small_nofile_callers_get_1013() {
    // 64 + 40 + 20 + 4 × 10 + 4 × 10 = 204 descriptors at most, in 256.
    let server = Limited::start(
        256,
        "--max-connections 40 --max-unauthorized 20 --max-runs 10 \
         --max-loops-per-identity 10 --max-connections-per-address 100",
    );
    let url = &server.url;
    runtime().block_on(async {
        let mut clients = Vec::new();
        for _ in 0..40 {
            clients.push(Client::connect(url, "").await.expect("connects"));
        }
        for _ in 0..30 {
            let client = Client::connect(url, "").await.expect("the handshake");
            match client.start(demo_request()).await {
                Err(RunError::Closed { code: 1013, .. }) => {}
                other => panic!("past the limit: {:?}", other.map(|_| "a run")),
            }
        }
        for client in clients {
            client.close().await;
        }
    });
    server.never_ran_out();
}

/// one token's connections × runs of the demo, at once; then
/// another token's loop. (served, refused, the server's descriptors at
/// the height, whether the other token was served).
fn one_token_floods_runs(connections: usize, runs: usize) -> (usize, usize, usize, bool) {
    let tokens = tempfile::NamedTempFile::new().expect("a token file");
    std::fs::write(tokens.path(), "alice\nbob\n").expect("tokens written");
    let path = tokens.path().to_str().expect("a path").to_owned();
    let server = Serve::start("error", &["--token-file", &path]);
    runtime().block_on(async {
        let mut clients = Vec::new();
        for _ in 0..connections {
            clients.push(
                Client::connect(&server.url, "alice")
                    .await
                    .expect("connects"),
            );
        }
        let starts = clients
            .iter()
            .flat_map(|client| (0..runs).map(move |_| client.start(demo_request())));
        let started = futures_util::future::join_all(starts).await;
        let (ok, refused): (Vec<_>, Vec<_>) = started.into_iter().partition(Result::is_ok);
        let held = descriptors(server.pid());
        let other = served(&server.url, "bob").await;
        for run in ok.iter().flatten() {
            run.stop().await;
        }
        (ok.len(), refused.len(), held, other.is_ok())
    })
}

#[test]
fn one_token_cannot_take_every_run_and_another_is_served() {
    let (ok, refused, _, other) = one_token_floods_runs(2, 64);
    assert_eq!(ok, 64, "the default of 64 runs per token");
    assert_eq!(refused, 64);
    assert!(other, "bob was not served");
}

/// A figure of `benches/figures.rs` (not a test: a load).
#[allow(dead_code)]
pub fn one_token_24_connections_of_256_runs() {
    let (ok, refused, held, other) = one_token_floods_runs(24, 256);
    println!(
        "row 7: one token, 24 connections × 256 demo runs at once: {ok} served, {refused} \
         refused, {held} server descriptors at the height; another token served: {other}"
    );
    assert!(other);
}

#[test]
fn refusal_lines_are_rate_limited_per_address_with_a_summary() {
    let mut server = Serve::start("warn", &["--max-connections-per-address", "1"]);
    let log = common::drain(server.stderr());
    let to = addr(&server);
    runtime().block_on(async {
        // The address's one place, held; each connect after it is closed
        // at once, with a refusal line.
        let held = connect_from(ATTACKER, to).await.expect("connects");
        let refused = || async {
            let mut tcp = connect_from(ATTACKER, to).await.expect("connects");
            let _ = tcp.read(&mut [0u8; 1]).await;
        };
        for _ in 0..100 {
            refused().await;
        }
        // The next refusal, once the window is over, says how many of the
        // window's lines were suppressed first. (The place held before
        // was given back at the handshake timeout: it is taken again.)
        tokio::time::sleep(Duration::from_millis(10_500)).await;
        drop(held);
        let _held = connect_from(ATTACKER, to).await.expect("connects");
        refused().await;
    });
    // A graceful end, so that every line written is flushed.
    assert!(server.terminate().success());
    let log = log.join().expect("the log");
    let closed = log.matches("closed at once").count();
    assert_eq!(closed, 11, "10 in the first window, 1 in the next: {log}");
    // 90 of the refusals at accept, and the line (at info level) of the
    // first place's handshake timeout: a refusal line too.
    assert!(
        log.contains("refusal lines suppressed address=127.0.0.2 suppressed=91"),
        "{log}"
    );
}

/// After the WebSocket handshake on `tcp`, the close frame the server
/// sends: its code and reason.
async fn close_frame(tcp: &mut TcpStream) -> std::io::Result<(u16, String)> {
    let mut head = [0u8; 2];
    tcp.read_exact(&mut head).await?;
    if head[0] != 0x88 || head[1] > 125 {
        return Err(std::io::Error::other(format!(
            "not a close frame: {head:?}"
        )));
    }
    let mut payload = vec![0u8; usize::from(head[1])];
    tcp.read_exact(&mut payload).await?;
    let code = u16::from_be_bytes([payload[0], payload[1]]);
    Ok((code, String::from_utf8_lossy(&payload[2..]).into_owned()))
}

#[test]
fn an_address_past_its_handshake_rate_is_told_why_and_another_is_served() {
    use std::io::{BufRead, BufReader};
    let mut child = common::start(
        "warn",
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--handshake-rate",
            "1",
            "--admin",
            "127.0.0.1:0",
        ],
    );
    let _log = common::drain(child.stderr.take().expect("stderr"));
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("the URL");
    let url = line.trim().to_owned();
    line.clear();
    stdout.read_line(&mut line).expect("the admin URL");
    let admin: SocketAddr = line
        .trim()
        .trim_start_matches("http://")
        .parse()
        .expect("an admin address");
    let to: SocketAddr = url.trim_start_matches("ws://").parse().expect("an address");
    let (refusal, served_elsewhere, metrics) = runtime().block_on(async {
        // One a second from the attacker: its first connection is taken,
        // and one of the next few, made at once, is told why it is not.
        let mut first = connect_from(ATTACKER, to).await.expect("connects");
        upgrade(&mut first).await.expect("the first is taken");
        let mut refusal = None;
        for _ in 0..5 {
            let mut tcp = connect_from(ATTACKER, to).await.expect("connects");
            if upgrade(&mut tcp).await.is_ok()
                && let Ok(frame) =
                    tokio::time::timeout(Duration::from_secs(5), close_frame(&mut tcp)).await
            {
                refusal = frame.ok();
                break;
            }
        }
        drop(first);
        // Another address has its own bucket.
        let served_elsewhere = served(&url, "").await;
        let mut http = TcpStream::connect(admin).await.expect("the admin listener");
        http.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .await
            .expect("asked");
        let mut metrics = String::new();
        http.read_to_string(&mut metrics).await.expect("read");
        (refusal, served_elsewhere, metrics)
    });
    let (code, reason) = refusal.expect("a connection past the rate was refused");
    assert_eq!(code, 1013);
    assert_eq!(
        reason,
        "this address opens new connections faster than the server's handshake-rate; try again later"
    );
    assert_eq!(served_elsewhere, Ok(()));
    let counted = metrics
        .lines()
        .find(|line| {
            line.starts_with("runloop_connections_closed_at_accept_total{reason=\"rate\"}")
        })
        .and_then(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .expect("the rate's series");
    assert!(counted >= 1, "{metrics}");
    let _ = child.kill();
    let _ = child.wait();
}
