//! Many servers behind a real load balancer. A caller's runs live on its
//! connection, so `runloop serve` processes share nothing and nginx only
//! has to proxy the WebSocket upgrade: 300 loops from many connections
//! spread over three servers, every loop finishes with every chunk, and
//! stopping a server (SIGTERM: a drain) loses no loop. A second variant
//! terminates TLS at nginx. The drain itself, its deadline and its second
//! signal are checked on one server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use runloop::client::{Client, ClientConfig, Event};
use runloop::proto::agents_run::{Container, Image, ImageRef, RunRequest};
use runloop::proto::run_loop::Outcome;
use runloop::tls::ClientTls;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::http;
use crate::nginx::Nginx;
use crate::serve::Serve;
use runloop_testkit::certs::Pki;

/// Chunks in each loop of the load-balanced runs.
const CHUNKS: u64 = 16;

fn request() -> RunRequest {
    let image = Image::Server(ImageRef {
        name: "demo".to_owned(),
        digest: format!("sha256:{}", "0".repeat(64)),
    });
    let agent = RawValue::from_string("{}".to_owned()).expect("JSON");
    RunRequest::new(Container::new(image, 1 << 30, 1 << 30), agent)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// One loop on a connection of its own: connect, start a run, run the
/// loop, check that it finished with chunks 0 to CHUNKS - 1 in order,
/// close. `Err` says what went wrong.
async fn one_loop(url: &str, tls: Option<&ClientTls>, prompt: &str) -> Result<(), String> {
    let mut config = ClientConfig::default();
    config.tls = tls.cloned();
    let client = Client::connect_with(url, "", config)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let run = client
        .start(request())
        .await
        .map_err(|e| format!("run: {e}"))?;
    let mut run_loop = run.run_loop(prompt);
    let mut next_seq = 0;
    let mut outcome = None;
    while let Some(event) = run_loop.next().await {
        match event {
            Event::Chunk { json, .. } => {
                let chunk: Value = serde_json::from_slice(&json).map_err(|e| e.to_string())?;
                let seq = chunk["_meta"]["runloop/seq"].as_u64();
                if seq != Some(next_seq) {
                    return Err(format!("chunk {next_seq} came as {seq:?}"));
                }
                next_seq += 1;
            }
            Event::Error(error) => return Err(format!("error: {error}")),
            Event::End(end) => outcome = Some(end),
        }
    }
    drop(run_loop);
    run.stop().await;
    client.close().await;
    match outcome {
        Some(Outcome::Finished { fatal: false }) if next_seq == CHUNKS => Ok(()),
        other => Err(format!("{other:?} after {next_seq} chunks")),
    }
}

/// Runs `loops` loops from `workers` tasks at once, each loop on a
/// connection of its own; calls `midway` once a third of them are done.
/// The loops that failed, with why.
async fn many_loops(
    url: &str,
    tls: Option<ClientTls>,
    loops: usize,
    workers: usize,
    prompt: &str,
    midway: impl FnOnce() + Send + 'static,
) -> Vec<String> {
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (url, tls, next, done) = (url.to_owned(), tls.clone(), next.clone(), done.clone());
        let prompt = prompt.to_owned();
        tasks.spawn(async move {
            let mut failed = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < loops {
                if let Err(why) = one_loop(&url, tls.as_ref(), &prompt).await {
                    failed.push(why);
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            failed
        });
    }
    let mut midway = Some(midway);
    let mut failed = Vec::new();
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                Some(result) => failed.extend(result.expect("a worker")),
                None => break,
            },
            () = tokio::time::sleep(Duration::from_millis(10)), if midway.is_some() => {
                if done.load(Ordering::Relaxed) >= loops / 3
                    && let Some(call) = midway.take()
                {
                    call();
                }
            }
        }
    }
    failed
}

/// How many runs each server's JSON log says it started.
fn runs_started(log: &str) -> usize {
    log.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["message"] == "running")
        .count()
}

fn servers(count: usize) -> Vec<Serve> {
    (0..count)
        .map(|_| {
            Serve::start(
                "info",
                &[
                    "--admin",
                    "127.0.0.1:0",
                    "--log-format",
                    "json",
                    "--drain-timeout",
                    "30",
                ],
            )
        })
        .collect()
}

#[test]
fn three_servers_behind_nginx_serve_every_loop_and_one_drains_without_loss() {
    if !runloop_testkit::needs(&[crate::nginx::PART]) {
        return;
    }
    const LOOPS: usize = 300;
    let servers = servers(3);
    let upstreams: Vec<SocketAddr> = servers.iter().map(Serve::addr).collect();
    let nginx = Nginx::start(&upstreams, None);
    let url = format!("ws://{}", nginx.addr);

    let mut servers = servers.into_iter();
    let drained = servers.next().expect("three");
    let others: Vec<Serve> = servers.collect();
    let drained = Arc::new(std::sync::Mutex::new(Some(drained)));
    let signalled = Arc::new(std::sync::Mutex::new(None));
    let prompt = format!("demo:load={CHUNKS}");
    let started = Instant::now();
    let failed = runtime().block_on(many_loops(&url, None, LOOPS, 24, &prompt, {
        let (drained, signalled) = (drained.clone(), signalled.clone());
        move || {
            let drained = drained.lock().expect("lock");
            let server = drained.as_ref().expect("the drained server");
            server.signal("TERM");
            *signalled.lock().expect("lock") = Some(Instant::now());
        }
    }));
    let took = started.elapsed();
    assert!(
        failed.is_empty(),
        "{} of {LOOPS} loops failed through nginx: {:?}\nnginx: {}",
        failed.len(),
        &failed[..failed.len().min(5)],
        nginx.log()
    );
    let drained = drained
        .lock()
        .expect("lock")
        .take()
        .expect("the drained server");
    let (status, _, drained_log) = drained.exit();
    assert!(status.success(), "{drained_log}");
    assert!(
        signalled.lock().expect("lock").is_some(),
        "SIGTERM was never sent"
    );
    let drain_line = drained_log
        .lines()
        .find(|line| line.contains("drained: every connection ended"))
        .unwrap_or_else(|| panic!("no drain in the log:\n{drained_log}"));
    let drain: Value = serde_json::from_str(drain_line).expect("a JSON line");
    let mut split = vec![runs_started(&drained_log)];
    for server in others {
        let (status, _, log) = server.terminate();
        assert!(status.success(), "{log}");
        split.push(runs_started(&log));
    }
    println!(
        "nginx: {LOOPS} loops of {CHUNKS} chunks over 24 connections at a time in {took:?}; \
         runs per server {split:?}; the first drained in {} after SIGTERM",
        drain["took"]
    );
    assert_eq!(split.iter().sum::<usize>(), LOOPS, "{split:?}");
    assert!(split.iter().all(|&runs| runs > 0), "{split:?}");
}

#[test]
fn tls_terminated_at_nginx() {
    if !runloop_testkit::needs(&[crate::nginx::PART]) {
        return;
    }
    const LOOPS: usize = 60;
    let pki = Pki::new();
    let servers = servers(3);
    let upstreams: Vec<SocketAddr> = servers.iter().map(Serve::addr).collect();
    let nginx = Nginx::start(&upstreams, Some(&pki.localhost));
    let url = format!("wss://localhost:{}", nginx.addr.port());
    let tls = ClientTls::new(std::slice::from_ref(&pki.ca)).expect("the test authority");
    let prompt = format!("demo:load={CHUNKS}");
    let failed = runtime().block_on(many_loops(&url, Some(tls), LOOPS, 12, &prompt, || {}));
    assert!(failed.is_empty(), "{failed:?}\nnginx: {}", nginx.log());
    let mut split = Vec::new();
    for server in servers {
        let (_, _, log) = server.terminate();
        split.push(runs_started(&log));
    }
    assert_eq!(split.iter().sum::<usize>(), LOOPS, "{split:?}");
    assert!(split.iter().all(|&runs| runs > 0), "{split:?}");
}

#[test]
fn a_drain_serves_the_open_connections_until_its_deadline() {
    let server = Serve::start("info", &["--admin", "127.0.0.1:0", "--drain-timeout", "2"]);
    let admin = server.admin.expect("admin");
    let url = server.url.clone();
    runtime().block_on(async {
        let open = Client::connect(&url, "").await.expect("connects");
        let long = Client::connect(&url, "").await.expect("connects");
        let long_run = long.start(request()).await.expect("a run");
        // A loop that would take a minute: the deadline cuts it.
        let mut endless = long_run.run_loop("a loop of about 24 chunks demo:pace=500");
        assert!(matches!(endless.next().await, Some(Event::Chunk { .. })));
        server.signal("TERM");
        let start = Instant::now();
        while http::get(admin, "/readyz").0 != 503 {
            assert!(start.elapsed() < Duration::from_secs(10), "never draining");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // No new connection…
        let refused = Client::connect(&url, "").await;
        assert!(refused.is_err(), "a draining server accepted a connection");
        // …but the open one is served: a run and a whole loop.
        let run = open.start(request()).await.expect("a run while draining");
        let mut short = run.run_loop(format!("demo:load={CHUNKS}"));
        let mut chunks = 0;
        let mut end = None;
        while let Some(event) = short.next().await {
            match event {
                Event::Chunk { .. } => chunks += 1,
                Event::End(outcome) => end = Some(outcome),
                Event::Error(error) => panic!("{error}"),
            }
        }
        assert_eq!(
            (chunks, end),
            (CHUNKS, Some(Outcome::Finished { fatal: false }))
        );
        // The endless loop ends at the deadline with the server's error.
        let mut error = None;
        let mut end = None;
        while let Some(event) = endless.next().await {
            match event {
                Event::Error(e) => error = Some(e.to_string()),
                Event::End(outcome) => end = Some(outcome),
                Event::Chunk { .. } => {}
            }
        }
        assert!(matches!(end, Some(Outcome::Unfinished(_))), "{end:?}");
        let error = error.expect("the server's error");
        assert!(error.contains("\"kind\":\"server\""), "{error}");
        assert!(error.contains("shutting down"), "{error}");
        assert!(
            start.elapsed() >= Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    });
    let (status, _, log) = server.exit();
    assert!(status.success(), "{log}");
    assert!(log.contains("the drain's deadline passed"), "{log}");
}

#[test]
fn a_second_signal_ends_the_drain_at_once() {
    let server = Serve::start("info", &["--drain-timeout", "60"]);
    let url = server.url.clone();
    runtime().block_on(async {
        let client = Client::connect(&url, "").await.expect("connects");
        let run = client.start(request()).await.expect("a run");
        let mut endless = run.run_loop("a loop of about 24 chunks demo:pace=500");
        assert!(matches!(endless.next().await, Some(Event::Chunk { .. })));
        server.signal("TERM");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let start = Instant::now();
        server.signal("TERM");
        let mut end = None;
        while let Some(event) = endless.next().await {
            if let Event::End(outcome) = event {
                end = Some(outcome);
            }
        }
        assert!(matches!(end, Some(Outcome::Unfinished(_))), "{end:?}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
    });
    let (status, _, log) = server.exit();
    assert!(status.success(), "{log}");
    assert!(log.contains("second signal"), "{log}");
}
