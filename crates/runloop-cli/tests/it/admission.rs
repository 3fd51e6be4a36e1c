//! `runloop serve` and the connections it takes on (issue 13, rows 3–7):
//! little read before authorization, few connections not yet authorized,
//! few per address and per token, the rest closed at once — and callers
//! within the limits still served, over real loopback sockets, with the
//! server's memory and descriptors read from `/proc/PID`.
//!
//! The attackers connect from 127.0.0.2, the callers from 127.0.0.1: two
//! addresses, both loopback. The loads at the full size are
//! figures of `benches/figures/`:
//! `cargo bench -p runloop-cli --bench figures -- admission`.

use std::net::SocketAddr;
use std::time::Duration;

use runloop::client::{Client, RunError};
use runloop::proto::run_loop::Outcome;
use runloop_testkit::caller::{connect_from, upgrade};
use runloop_testkit::command::{self, Serve, request};
use runloop_testkit::loads::{
    ATTACKER, MIB, descriptors, flood_before_authorizing, one_token_floods_runs,
    pre_authorization_flood, runtime, served, served_during_slowloris,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[test]
fn a_message_over_the_bound_before_authorization_ends_the_connection_unread() {
    let mut server = Serve::start("info", &[]);
    let log = command::drain(server.stderr());
    let to = server.addr();
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

#[test]
fn callers_are_served_during_a_slowloris_from_another_address() {
    let (ok, tries, _) = served_during_slowloris(1024, 10);
    assert!(ok * 10 >= tries * 9, "served {ok} of {tries}");
}

/// `runloop serve` under `ulimit -n NOFILE`, its log drained.
struct Limited {
    child: std::process::Child,
    url: String,
    log: std::thread::JoinHandle<String>,
}

impl Limited {
    /// With `--max-connections`, `--max-unauthorized` and
    /// `--max-connections-per-address` as given, and ten runs and ten
    /// loops an identity: 64 + connections + unauthorized + 4 × 10 + 4 ×
    /// 10 descriptors at most.
    fn start(nofile: u32, connections: u32, unauthorized: u32, per_address: u32) -> Limited {
        let args = format!(
            "--max-connections {connections} --max-unauthorized {unauthorized} --max-runs 10 \
             --max-loops-per-identity 10 --max-connections-per-address {per_address}"
        );
        let (mut child, url) = command::serve_under(&[&format!("-n {nofile}")], "warn", &args);
        let log = command::drain(child.stderr.take().expect("stderr"));
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
    let server = Limited::start(512, 100, 50, 16);
    let url = &server.url;
    let to: SocketAddr = url.trim_start_matches("ws://").parse().expect("an address");
    runtime().block_on(async {
        // A caller authorized before the attack, with a run.
        let client = Client::connect(url, "").await.expect("connects");
        let run = client.start(request("demo", MIB, 0)).await.expect("a run");
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
    let server = Limited::start(256, 40, 20, 100);
    let url = &server.url;
    runtime().block_on(async {
        let mut clients = Vec::new();
        for _ in 0..40 {
            clients.push(Client::connect(url, "").await.expect("connects"));
        }
        for _ in 0..30 {
            let client = Client::connect(url, "").await.expect("the handshake");
            match client.start(request("demo", MIB, 0)).await {
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

#[test]
fn one_token_cannot_take_every_run_and_another_is_served() {
    let (ok, refused, _, other) = one_token_floods_runs(2, 64);
    assert_eq!(ok, 64, "the default of 64 runs per token");
    assert_eq!(refused, 64);
    assert!(other, "bob was not served");
}

#[test]
fn refusal_lines_are_rate_limited_per_address_with_a_summary() {
    let mut server = Serve::start("warn", &["--max-connections-per-address", "1"]);
    let log = command::drain(server.stderr());
    let to = server.addr();
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
    let mut child = command::start(
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
    let _log = command::drain(child.stderr.take().expect("stderr"));
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
