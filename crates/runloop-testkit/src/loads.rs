//! The loads of `runloop serve` that a test runs small and a figure of
//! `runloop-cli`'s `benches/figures/` runs at full size (issue 13's rows
//! as measured): floods before authorization, a slowloris, one token's
//! runs, exec runs at a budget, a large prompt. Each starts its own
//! server, drives it over real loopback sockets and returns what it
//! measured; the caller asserts.
//!
//! The attackers connect from 127.0.0.2, the callers from 127.0.0.1: two
//! addresses, both loopback.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use runloop_client::Client;
use runloop_proto::run_loop::Outcome;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::caller::{UPGRADE, connect_from, upgrade};
use crate::command::{Serve, demo_request, request};
use crate::server::served_with;
pub use crate::server::{held_loops, loop_refusal, refusal};

/// A mebibyte.
pub const MIB: u64 = 1 << 20;

/// The attackers' address.
pub const ATTACKER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

/// A runtime for a test's async part.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("a runtime")
}

/// Descriptors process `pid` has open.
pub fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |fds| fds.count())
}

/// One demo loop on a new connection with `credential`: whether it finished.
pub async fn served(url: &str, credential: &str) -> Result<(), String> {
    served_with(url, credential, request("demo", MIB, 0), "hello there").await
}

/// From `from`: the handshake, then the start of one binary message of
/// `size` bytes (masked with a zero key, so its payload is zeros on the
/// wire), written until the server stops taking it. How many bytes went,
/// and whether all of them did.
pub async fn flood_before_authorizing(from: IpAddr, to: SocketAddr, size: u64) -> (u64, bool) {
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

/// `connections` connections from distinct ports of `from`, each sending
/// 15 MiB before authorizing, all at once; the server's peak RSS growth.
pub fn pre_authorization_flood(args: &[&str], connections: usize) -> (u64, u64) {
    let server = Serve::start("error", args);
    let to = server.addr();
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

/// A slowloris from `from` until `stop`: `sockets` connections, each
/// silent, or sending its upgrade request a byte at a time; reconnecting a
/// second after the server closes one. How many connects it made.
pub async fn slowloris(
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
pub fn served_during_slowloris(sockets: usize, tries: usize) -> (usize, usize, u64) {
    let server = Serve::start("error", &[]);
    let to = server.addr();
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

/// one token's connections × runs of the demo, at once; then
/// another token's loop. (served, refused, the server's descriptors at
/// the height, whether the other token was served).
pub fn one_token_floods_runs(connections: usize, runs: usize) -> (usize, usize, usize, bool) {
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
            .flat_map(|client| (0..runs).map(move |_| client.start(request("demo", MIB, 0))));
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

/// Whether exec runs get cgroups here (root, memory and pids controllers).
pub fn cgroups() -> bool {
    crate::needs(&[crate::Part::Cgroups])
}

/// The agent `sse`: the facade's SSE fixture under exec.
pub fn sse_agent() -> String {
    format!("sse=exec:python3 {}", crate::fixture("sse_agent.py"))
}

/// Processes whose parent is `pid`, and theirs, all the way down.
pub fn descendants(pid: u32) -> usize {
    let mut children: std::collections::HashMap<u32, Vec<u32>> = Default::default();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        if let Some(parent) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|ppid| ppid.parse().ok())
        {
            children.entry(parent).or_default().push(child);
        }
    }
    let mut stack = vec![pid];
    let mut count = 0;
    while let Some(next) = stack.pop() {
        for &child in children.get(&next).into_iter().flatten() {
            count += 1;
            stack.push(child);
        }
    }
    count
}

/// One connection asks for `asked` runs of an exec agent, 256 MiB each, at
/// once; how many start, how many are refused and why, and how many
/// processes the server has while they run.
pub fn exec_runs(args: &[&str], asked: usize) -> (usize, Vec<String>, usize) {
    let agent = sse_agent();
    let server = Serve::start(
        "error",
        &[&["--exec-disk", "unenforced", "--agent", &agent], args].concat(),
    );
    runtime().block_on(async {
        let client = Client::connect(&server.url, "").await.expect("connects");
        let started = futures_util::future::join_all(
            (0..asked).map(|_| client.start(request("sse", 256 * MIB, 0))),
        )
        .await;
        let mut runs = Vec::new();
        let mut refused = Vec::new();
        for start in started {
            match start {
                Ok(run) => runs.push(run),
                Err(error) => refused.push(refusal(Err(error))),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let processes = descendants(server.pid());
        for run in runs.iter() {
            run.stop().await;
        }
        (runs.len(), refused, processes)
    })
}

/// A prompt of `size` bytes: words of `word` letters and a space.
pub fn prompt(size: usize, word: usize) -> String {
    let unit = format!("{} ", "w".repeat(word));
    let mut prompt = unit.repeat(size / unit.len());
    prompt.truncate(size);
    prompt
}

/// One demo loop with `prompt`, to its end.
pub async fn one_loop(url: &str, prompt: String) {
    let client = Client::connect(url, "").await.expect("connects");
    let run = client.start(demo_request()).await.expect("the run starts");
    let outcome = run.run_loop(prompt).outcome().await;
    assert_eq!(outcome, Outcome::Finished { fatal: false });
    run.stop().await;
    client.close().await;
}

/// The server's peak with one loop of a 15.9 MiB prompt of `word`-letter words.
pub fn large_prompt_peak(word: usize) -> u64 {
    let server = Serve::start("error", &[]);
    let baseline = server.status("VmRSS");
    let prompt = prompt(15_900 * 1024, word);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(one_loop(&server.url, prompt));
    let peak = server.status("VmHWM");
    println!(
        "15.9 MiB prompt, {word}-letter words: server baseline {} MiB, peak {} MiB, after {} MiB",
        baseline / MIB,
        peak / MIB,
        server.status("VmRSS") / MIB
    );
    peak
}

/// `runloop serve` at `RUST_LOG=level` with two tenants, `alice` (and
/// `alice_settings`, lines of her `[[tenant]]` table) and `bob`, whose
/// tokens are `alice` and `bob`, serving `agents` (exec, disk unenforced);
/// and the directory that holds its configuration file.
pub fn alice_and_bob(
    level: &str,
    alice_settings: &str,
    agents: &[String],
) -> (Serve, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a directory");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "[[tenant]]\nname = \"alice\"\ntokens = [\"sha256:2bd806c97f0e00af1a1fc3328fa763a9269723c8db8fac4f93af71db186d6e90\"]\n{alice_settings}\
             [[tenant]]\nname = \"bob\"\ntokens = [\"sha256:81b637d8fcd2c6da6359e6963113a1170de795e4b725b84d1e0b4cfd9ec58ce9\"]\n"
        ),
    )
    .expect("written");
    let mut args = vec![
        "--config",
        config.to_str().expect("a path"),
        "--exec-disk",
        "unenforced",
    ];
    for agent in agents {
        args.extend(["--agent", agent.as_str()]);
    }
    (Serve::start(level, &args), dir)
}
