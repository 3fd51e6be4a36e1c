//! The admin listener's metrics, as an operator's Prometheus sees them: a
//! real Prometheus scrapes `serve --admin` every second while loops of
//! every outcome run, and its HTTP API then gives the exact counts. The
//! exposition also passes `promtool check metrics`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use runloop_testkit::command::run;
use serde_json::Value;

use crate::http;
use crate::prometheus::{Prometheus, promtool_passes};
use crate::serve::Serve;

const TOKEN: &str = "metrics-test-token";

/// `runloop serve` with [`TOKEN`], an admin listener and `args`; the
/// server and its admin listener's address.
fn serve_with_admin(args: &[&str]) -> (Serve, SocketAddr) {
    let server = Serve::start(
        "warn",
        &[&["--token", TOKEN, "--admin", "127.0.0.1:0"], args].concat(),
    );
    let admin = server.admin.expect("an admin listener");
    (server, admin)
}

/// `runloop run --json` against `url`: the exit code and the chunks it got.
fn run_loop(url: &str, args: &[&str]) -> (Option<i32>, u64, String) {
    let (status, stdout, stderr) =
        run(&[&["run", "--url", url, "--token", TOKEN, "--json"], args].concat());
    let chunks = stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line.get("chunk").is_some())
        .count() as u64;
    (status.code(), chunks, format!("{stdout}{stderr}"))
}

/// The value of each series of `metric` by the value of `label`.
fn by_label(prometheus: &Prometheus, metric: &str, label: &str) -> BTreeMap<String, f64> {
    prometheus
        .query(metric)
        .into_iter()
        .map(|(labels, _, value)| {
            let key = labels[label].as_str().unwrap_or_default().to_owned();
            (key, value)
        })
        .collect()
}

/// The one value of `query`.
fn value(prometheus: &Prometheus, query: &str) -> f64 {
    let series = prometheus.query(query);
    assert_eq!(series.len(), 1, "{query}: {series:?}");
    series[0].2
}

/// Each query of `expected` has one series, of its value.
fn values_are(prometheus: &Prometheus, expected: &[(&str, f64)]) {
    for &(query, expected) in expected {
        assert_eq!(value(prometheus, query), expected, "{query}");
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

#[test]
fn prometheus_scrapes_the_exact_counts_of_every_outcome() {
    if !runloop_testkit::needs(crate::prometheus::PARTS) {
        return;
    }
    let (server, admin) = serve_with_admin(&[
        "--agent",
        "demo=builtin:demo",
        "--agent",
        "missing=exec:/nonexistent/agent-program",
    ]);
    let prometheus = Prometheus::start(&[admin]);

    // (what, arguments, the exit code runloop run must give)
    let loops: [(&str, &[&str], i32); 7] = [
        ("finished", &["demo:load=5"], 0),
        ("finished", &["demo:load=7"], 0),
        ("finished", &["count these words"], 0),
        ("fatal", &["demo:fatal"], 6),
        ("unfinished", &["demo:break"], 1),
        ("no loop", &["demo:refuse"], 3),
        ("not served", &["demo:load=0"], 4),
    ];
    let mut chunks = 0;
    for (what, args, code) in loops {
        let (exit, got, said) = run_loop(&server.url, args);
        assert_eq!(exit, Some(code), "{what}: {said}");
        chunks += got;
    }
    let refused: [(&str, &[&str]); 3] = [
        ("an image not in the catalog", &["--image", "nosuch", "hi"]),
        (
            "a registration the agent refuses",
            &["--agent-json", "\"demo:refuse\"", "hi"],
        ),
        (
            "a program that does not start",
            &["--image", "missing", "hi"],
        ),
    ];
    for (what, args) in refused {
        let (exit, _, said) = run_loop(&server.url, args);
        assert_eq!(exit, Some(7), "{what}: {said}");
        assert!(said.contains("the run was refused"), "{what}: {said}");
    }
    let (status, _, stderr) = run(&["run", "--url", &server.url, "--token", "wrong", "hi"]);
    assert_eq!(status.code(), Some(7), "{stderr}");
    let done = unix_now();

    // A scrape from after the last run, whose samples are then final.
    let start = Instant::now();
    loop {
        let scraped = prometheus
            .query("timestamp(runloop_connections_total)")
            .first()
            .map(|(_, _, at)| *at);
        if scraped.is_some_and(|at| at > done + 0.5) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no scrape after the runs within 30 s (last at {scraped:?}, runs done at {done})"
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    let outcomes = by_label(&prometheus, "runloop_loops_total", "outcome");
    let expected: BTreeMap<String, f64> = [
        ("finished", 3.0),
        ("fatal", 1.0),
        ("unfinished", 1.0),
        ("no_loop", 1.0),
        ("not_served", 1.0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(outcomes, expected);
    let refusals = by_label(&prometheus, "runloop_runs_refused_total", "reason");
    for (reason, count) in [
        ("request", 0.0),
        ("policy", 1.0),
        ("runtime", 1.0),
        ("registration", 1.0),
        ("abandoned", 0.0),
        ("server", 0.0),
    ] {
        assert_eq!(refusals.get(reason), Some(&count), "{reason}: {refusals:?}");
    }
    assert_eq!(value(&prometheus, "runloop_runs_started_total"), 7.0);
    // `runloop run` stops its run and closes its connection: whichever the
    // server sees first ends the run.
    let ended = by_label(&prometheus, "runloop_runs_ended_total", "reason");
    assert_eq!(ended.values().sum::<f64>(), 7.0, "{ended:?}");
    assert_eq!(ended["container"] + ended["shutdown"], 0.0, "{ended:?}");
    values_are(
        &prometheus,
        &[
            ("runloop_runs_open", 0.0),
            ("runloop_loops_open", 0.0),
            ("runloop_connections_open", 0.0),
            ("runloop_chunks_relayed_total", chunks as f64),
            ("runloop_relay_latency_seconds_count", chunks as f64),
        ],
    );
    assert!(value(&prometheus, "runloop_relayed_bytes_total") > chunks as f64 * 10.0);
    // Every `runloop run` is one connection; the last was refused.
    assert_eq!(value(&prometheus, "runloop_connections_total"), 11.0);
    let refused = by_label(&prometheus, "runloop_connections_refused_total", "reason");
    assert_eq!(refused["credential"], 1.0, "{refused:?}");
    assert_eq!(
        refused["malformed"] + refused["timeout"],
        0.0,
        "{refused:?}"
    );
    // Eight containers started (the seven runs and the refused
    // registration); one program did not.
    values_are(
        &prometheus,
        &[
            ("runloop_runtime_start_seconds_count", 8.0),
            ("runloop_runtime_start_failures_total", 1.0),
            ("runloop_draining", 0.0),
        ],
    );
    let faults = by_label(&prometheus, "runloop_proxy_faults_total", "kind");
    assert_eq!(faults.values().sum::<f64>(), 0.0, "{faults:?}");
    // The same by tenant (issue 27): the one token is the tenant
    // `token #1`, and the tenant label holds nothing else.
    let tenant = |metric: &str| by_label(&prometheus, metric, "tenant");
    let one = |n: f64| BTreeMap::from([("token #1".to_owned(), n)]);
    assert_eq!(tenant("runloop_tenant_runs_started_total"), one(7.0));
    assert_eq!(tenant("runloop_tenant_runs_refused_total"), one(3.0));
    assert_eq!(tenant("runloop_tenant_loops_total"), one(7.0));
    assert_eq!(tenant("runloop_tenant_loops_refused_total"), one(0.0));
    assert_eq!(tenant("runloop_tenant_connections_refused_total"), one(0.0));
    assert_eq!(
        tenant("runloop_tenant_chunks_relayed_total"),
        one(chunks as f64)
    );
    assert_eq!(
        tenant("runloop_tenant_relayed_bytes_total"),
        one(value(&prometheus, "runloop_relayed_bytes_total"))
    );

    // The exposition itself, as promtool reads it.
    promtool_passes(&http::metrics(admin));
    assert_eq!(http::get(admin, "/healthz"), (200, "ok\n".to_owned()));
    assert_eq!(http::get(admin, "/readyz"), (200, "ready\n".to_owned()));
}

/// A metric's one sample in an exposition, by its full series name.
fn sample(exposition: &str, series: &str) -> f64 {
    exposition
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{exposition}"))
}

#[test]
fn a_loop_past_the_identity_s_limit_is_counted_as_refused() {
    use futures_util::StreamExt;
    use runloop::client::{Client, Event};
    use runloop::proto::run_loop::Outcome;

    let (server, admin) = serve_with_admin(&["--max-loops-per-identity", "1"]);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let client = Client::connect(&server.url, TOKEN).await.expect("connects");
        let first = client
            .start(runloop_testkit::command::demo_request())
            .await
            .expect("a run");
        let second = client
            .start(runloop_testkit::command::demo_request())
            .await
            .expect("a run");
        // The one loop the token may have, held while the next is asked.
        let mut held = first.run_loop("held demo:pace=200");
        assert!(
            matches!(held.next().await, Some(Event::Chunk { .. })),
            "the first loop is relayed"
        );
        let outcome = second.run_loop("one too many").outcome().await;
        assert!(matches!(outcome, Outcome::NoLoop(_)), "{outcome:?}");
        let (_, outcome) = held.collect_chunks().await;
        assert!(matches!(outcome, Outcome::Finished { .. }), "{outcome:?}");
        first.stop().await;
        second.stop().await;
        client.close().await;
    });
    let text = http::metrics(admin);
    for series in [
        "runloop_loops_refused_total",
        "runloop_loops_total{outcome=\"no_loop\"}",
        "runloop_loops_total{outcome=\"finished\"}",
    ] {
        assert_eq!(sample(&text, series), 1.0, "{series}");
    }
}

#[test]
fn the_proxy_counts_its_side() {
    if !runloop_testkit::needs(&[runloop_testkit::Part::program("promtool", "prometheus")]) {
        return;
    }
    // The demo agent program and a proxy in front of it, each a process.
    let mut agent =
        runloop_testkit::command::start("warn", &["agent", "demo", "--listen", "127.0.0.1:0"]);
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(agent.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("the agent's URL");
    let port = line.trim().rsplit(':').next().expect("a port").to_owned();
    let mut proxy = runloop_testkit::command::start(
        "warn",
        &[
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--agent-port",
            &port,
            "--admin",
            "127.0.0.1:0",
        ],
    );
    let mut out = std::io::BufReader::new(proxy.stdout.take().expect("stdout"));
    let mut url = String::new();
    std::io::BufRead::read_line(&mut out, &mut url).expect("the proxy's URL");
    let admin = runloop_testkit::command::admin_address(&mut out);
    let server = Serve::start(
        "warn",
        &["--agent", &format!("attached=proxy:{}", url.trim())],
    );
    let (status, stdout, stderr) = run(&[
        "run",
        "--url",
        &server.url,
        "--image",
        "attached",
        "demo:load=4",
    ]);
    assert_eq!(status.code(), Some(0), "{stdout}{stderr}");
    let text = http::metrics(admin);
    for line in [
        "runloop_proxy_registrations_total{result=\"registered\"} 1",
        "runloop_proxy_loops_total{outcome=\"finished\"} 1",
        "runloop_proxy_chunks_total 4",
        "runloop_proxy_first_chunk_seconds_count 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} is not in\n{text}");
    }
    promtool_passes(&text);
    assert_eq!(http::get(admin, "/readyz").0, 200);
    for child in [&mut proxy, &mut agent] {
        let _ = child.kill();
        let _ = child.wait();
    }
}
