//! The soak: many loops in sequence and many at once through the real
//! chain — client, server, proxy, agent program (the builtin demo) — with
//! every chunk checked against what the demo itself yields (none lost,
//! duplicated or reordered, `_meta["runloop/seq"]` counting from 0), every
//! outcome checked against the ending the prompt asked for, and the server
//! back to holding nothing, its process's memory back near where it started.
//!
//! Short by default (300 loops in sequence, 100 at once: seconds in a debug
//! build); `RUNLOOP_SOAK=full` runs 10,000 and 1,000, then the scale of
//! issue 14: 10,000 loops at once over 100 connections, each loop its own
//! run of 100 chunks, every chunk checked in order. Best in `--release`:
//!
//! ```text
//! RUNLOOP_SOAK=full cargo test --release -p runloop --test soak -- --nocapture
//! ```
//!
//! At that scale the demo cannot be the agent: each of its runs is a proxy
//! and an agent program in this process, six descriptors a loop. The scale
//! runs on one proxy that streams numbered chunks
//! ([`FakeProxy`]), in a child process (this test again, with
//! `RUNLOOP_SOAK=proxy`), so that neither process needs more descriptors
//! than a loop's socket end each (the server's peak memory at this scale is
//! `runloop bench --loops 10000 --connections 100`'s to measure: here the
//! client shares the process).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use runloop::agent::Agent;
use runloop::agent::demo::{Demo, SEQ};
use runloop::client::{Client, Event, Run};
use runloop::runtime::{Attach, Catalog};
use runloop::server::{Credentials, Server, ServerConfig, ServerHandle};
use runloop_proto::run_loop::{AgenticLoopChunk, Outcome, RunLoopRequest};
use runloop_testkit::fake_proxy::{FakeProxy, Step};
use runloop_testkit::server::{released, run_request, texts, unbudgeted};

/// How a loop is to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Finished,
    Fatal,
    Unfinished,
    NoLoop,
}

/// What the demo yields for a prompt, straight from the agent.
#[derive(Debug, Clone)]
struct Expected {
    chunks: Vec<AgenticLoopChunk>,
    ending: Ending,
}

/// The prompt of loop `i`: a mix of every ending and of lengths.
fn prompt(i: usize) -> String {
    let words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"];
    let text = words[..1 + i % words.len()].join(" ");
    match i % 10 {
        7 => format!("{text} demo:fatal"),
        8 => format!("{text} demo:break"),
        9 => format!("{text} demo:refuse"),
        _ => text,
    }
}

async fn expected(prompt: &str) -> Expected {
    let demo = Demo::new();
    let Ok(mut stream) = demo.run_loop(RunLoopRequest::new(prompt.to_owned())).await else {
        return Expected {
            chunks: Vec::new(),
            ending: Ending::NoLoop,
        };
    };
    let mut chunks = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(chunk) => chunks.push(chunk),
            Err(_) => {
                return Expected {
                    chunks,
                    ending: Ending::Unfinished,
                };
            }
        }
    }
    let ending = if chunks.last().is_some_and(AgenticLoopChunk::is_fatal) {
        Ending::Fatal
    } else {
        Ending::Finished
    };
    Expected { chunks, ending }
}

/// Every prompt the soak uses, with what the demo yields for it.
async fn expectations() -> Arc<HashMap<String, Expected>> {
    let mut all = HashMap::new();
    for i in 0..70 {
        let prompt = prompt(i);
        let expected = expected(&prompt).await;
        all.insert(prompt, expected);
    }
    Arc::new(all)
}

/// Runs one loop and checks it chunk by chunk against `expected`.
async fn check_loop(run: &Run, prompt: &str, expected: &Expected) -> usize {
    let mut run_loop = run.run_loop(prompt);
    let mut n = 0;
    let outcome = loop {
        match run_loop.next().await.expect("an event") {
            Event::Chunk { chunk, json } => {
                let value: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
                assert_eq!(value["_meta"][SEQ], n, "{prompt}: numbered in order");
                assert_eq!(
                    Some(&chunk),
                    expected.chunks.get(n),
                    "{prompt}: chunk {n} as the demo wrote it"
                );
                n += 1;
            }
            Event::Error(_) => {}
            Event::End(outcome) => break outcome,
        }
    };
    assert_eq!(n, expected.chunks.len(), "{prompt}: no chunk lost");
    let ending = match &outcome {
        Outcome::Finished { fatal: false } => Ending::Finished,
        Outcome::Finished { fatal: true } => Ending::Fatal,
        Outcome::Unfinished(_) => Ending::Unfinished,
        Outcome::NoLoop(_) => Ending::NoLoop,
        other => panic!("{prompt}: {other:?}"),
    };
    assert_eq!(ending, expected.ending, "{prompt}: {outcome:?}");
    n
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// The process's resident memory once freed memory went back to the system.
fn settled_rss() -> u64 {
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
    rss_bytes()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

async fn serve() -> ServerHandle {
    let server = Server::bind(
        "127.0.0.1:0",
        unbudgeted(ServerConfig::new(Credentials::Any, Catalog::demo())),
    )
    .await
    .expect("bind");
    server.spawn().0
}

/// The scale of the full soak: loops at once, connections, chunks a loop.
const SCALE: (usize, usize, usize) = (10_000, 100, 100);

/// What the scale's proxy prints before its URL.
const PROXY_AT: &str = "soak proxy at ";

/// The scale's proxy, in the child process: serves numbered chunks for
/// the prompt `scale` until the soak closes its standard input.
async fn scale_proxy() {
    raise_descriptor_limit();
    let proxy = FakeProxy::start().await;
    proxy.script(
        "scale",
        vec![
            Step::Flood {
                count: SCALE.2,
                size: 64,
            },
            Step::Close,
        ],
    );
    println!("{PROXY_AT}{}", proxy.url());
    tokio::task::spawn_blocking(|| {
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new())
    })
    .await
    .expect("reads standard input")
    .expect("standard input");
}

/// Raises the soft descriptor limit to the hard one: a loop is a socket
/// end in each process.
fn raise_descriptor_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: system calls on a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
}

/// Starts the scale's proxy in a child process; the child, and its URL.
fn spawn_scale_proxy() -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().expect("this test"))
        .args([
            "--exact",
            "thousands_of_loops_lose_nothing_and_leave_nothing",
            "--nocapture",
        ])
        .env("RUNLOOP_SOAK", "proxy")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("starts the proxy");
    let stdout = child.stdout.take().expect("piped");
    let url = std::io::BufReader::new(stdout)
        .lines()
        .map(|line| line.expect("the proxy's output"))
        .find_map(|line| line.strip_prefix(PROXY_AT).map(str::to_owned))
        .expect("the proxy's URL");
    (child, url)
}

/// 10,000 loops at once over 100 connections, each its own run on the
/// proxy in the child: every chunk arrives, in order, and every loop
/// finishes. The chunks counted.
async fn at_scale() -> usize {
    let (loops, connections, chunks) = SCALE;
    raise_descriptor_limit();
    let (mut proxy, url) = spawn_scale_proxy();
    let mut catalog = Catalog::new();
    catalog.insert("demo", None, Arc::new(Attach::new(url)));
    let mut config = unbudgeted(ServerConfig::new(Credentials::Any, catalog));
    config.budget.max_runs = loops;
    config.budget.max_runs_per_identity = loops;
    config.admission.max_connections_per_address = connections;
    config.admission.max_connections_per_identity = connections;
    config.limits.max_scopes = loops.div_ceil(connections);
    let server = Server::bind("127.0.0.1:0", config).await.expect("bind");
    let (server, _task) = server.spawn();

    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(Client::connect(&server.url(), "").await.expect("connect"));
    }
    // Every run started and every loop asked for before any is read.
    let all_asked = Arc::new(tokio::sync::Barrier::new(loops));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..loops {
        let client = clients[i % connections].clone();
        let all_asked = Arc::clone(&all_asked);
        tasks.spawn(async move {
            let run = client.start(run_request()).await.expect("run");
            let run_loop = run.run_loop("scale");
            all_asked.wait().await;
            let (texts, outcome) = texts(run_loop).await;
            assert_eq!(outcome, Outcome::Finished { fatal: false }, "loop {i}");
            for (n, text) in texts.iter().enumerate() {
                assert_eq!(
                    text.get(..10).map(str::trim_start),
                    Some(&*n.to_string()),
                    "loop {i}: chunk {n} in order"
                );
            }
            assert_eq!(texts.len(), chunks, "loop {i}: no chunk lost");
            run.stop().await;
            texts.len()
        });
    }
    let mut delivered = 0;
    let all_done = async {
        while let Some(done) = tasks.join_next().await {
            delivered += done.expect("a loop's task");
        }
    };
    tokio::time::timeout(Duration::from_secs(300), all_done)
        .await
        .expect("10,000 loops within 5 minutes (a safety net, not a speed bar)");
    for client in &clients {
        client.close().await;
    }
    released(&server).await;
    server.shutdown();
    drop(proxy.stdin.take());
    proxy.wait().expect("the proxy ends");
    delivered
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_loops_lose_nothing_and_leave_nothing() {
    let mode = std::env::var("RUNLOOP_SOAK");
    if mode.as_deref() == Ok("proxy") {
        return scale_proxy().await;
    }
    let full = mode.is_ok_and(|mode| mode == "full");
    let (sequential, concurrent, connections) = if full {
        (10_000, 1_000, 10)
    } else {
        (300, 100, 4)
    };
    let expected = expectations().await;
    let server = serve().await;

    // A warm-up loop, so the baseline includes what any first use allocates.
    let client = Client::connect(&server.url(), "").await.expect("connect");
    let run = client.start(run_request()).await.expect("run");
    check_loop(&run, &prompt(0), &expected[&prompt(0)]).await;
    run.stop().await;
    client.close().await;
    released(&server).await;
    let baseline = settled_rss();

    let peak = Arc::new(AtomicU64::new(baseline));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn({
        let (peak, sampling) = (Arc::clone(&peak), Arc::clone(&sampling));
        async move {
            while sampling.load(Ordering::SeqCst) {
                peak.fetch_max(rss_bytes(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });

    // In sequence: one run, one loop after another.
    let started = Instant::now();
    let client = Client::connect(&server.url(), "").await.expect("connect");
    let run = client.start(run_request()).await.expect("run");
    let mut chunks = 0;
    for i in 0..sequential {
        let prompt = prompt(i);
        chunks += check_loop(&run, &prompt, &expected[&prompt]).await;
    }
    run.stop().await;
    client.close().await;
    let in_sequence = started.elapsed();

    // At once: a run per loop (the demo runs one loop at a time), spread
    // over several connections, every loop started before any is read.
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(Client::connect(&server.url(), "").await.expect("connect"));
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..concurrent {
        let client = clients[i % connections].clone();
        let expected = Arc::clone(&expected);
        tasks.spawn(async move {
            let run = client.start(run_request()).await.expect("run");
            let prompt = prompt(i);
            let chunks = check_loop(&run, &prompt, &expected[&prompt]).await;
            run.stop().await;
            chunks
        });
    }
    let mut concurrent_chunks = 0;
    while let Some(done) = tasks.join_next().await {
        concurrent_chunks += done.expect("a loop's task");
    }
    for client in &clients {
        client.close().await;
    }
    let at_once = started.elapsed();

    let started = Instant::now();
    let scaled = if full { at_scale().await } else { 0 };
    let at_scale = started.elapsed();

    released(&server).await;
    sampling.store(false, Ordering::SeqCst);
    sampler.await.expect("the sampler");
    let after = settled_rss();
    let peak = peak.load(Ordering::SeqCst);
    println!(
        "soak: {sequential} loops in sequence ({chunks} chunks) in {in_sequence:.2?}; \
         {concurrent} at once over {connections} connections ({concurrent_chunks} chunks) \
         in {at_once:.2?}; {} loops at once over {} connections ({scaled} chunks) in \
         {at_scale:.2?}; RSS {:.1} MiB before, {:.1} MiB at peak, {:.1} MiB after; \
         server holds {:?}",
        if full { SCALE.0 } else { 0 },
        if full { SCALE.1 } else { 0 },
        mib(baseline),
        mib(peak),
        mib(after),
        server.stats()
    );
    // Back near the baseline: what remains is allocator bookkeeping, not
    // anything that grows with the loops run.
    let left = after.saturating_sub(baseline);
    assert!(
        left < (16 << 20).max((peak - baseline) / 4),
        "{:.1} MiB more after than before",
        mib(left)
    );
}
