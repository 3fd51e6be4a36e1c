//! The cost of one large SSE event at the proxy, as a load command rather
//! than a test (it times what it does not assert, and reads the whole
//! process's CPU time, which no other test may share):
//!
//! ```sh
//! cargo bench -p runloop --bench sse_cost
//! ```
//!
//! A 15 MiB event goes through a real proxy three ways — a chunked body in
//! 4 KiB pieces, in 64 KiB pieces, and a close-delimited body written 4 KiB
//! at a time — and the demo agent's own 15 MiB chunk (one large write by
//! axum) is the baseline, in the same run. Each figure is the CPU time this
//! process spent on the exchange (the proxy, the agent program's writes and
//! the WebSocket client's reads all run here), read from `getrusage`; the
//! ratio to the baseline is what to compare across machines. A parser that
//! rescans its buffer on every read is quadratic in the event's size and
//! shows here as a ratio in the hundreds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use runloop::agent::{AgentServer, demo::Demo};
use runloop_testkit::agent_program::{self, Conn, scripted};
use runloop_testkit::path::{exchange, register};
use tokio_util::sync::CancellationToken;

/// The event's text: 15 MiB, under the proxy's 16 MiB bound on one event.
const TEXT: usize = 15 << 20;

/// CPU time (user + system) of this process so far.
fn cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// The one event: `data: <chunk JSON>` and the blank line.
fn event() -> Vec<u8> {
    let mut event = b"data: {\"type\":\"assistant_text_content\",\"text\":\"".to_vec();
    event.resize(event.len() + TEXT, b'x');
    event.extend_from_slice(b"\"}\n\n");
    event
}

/// How the scripted agent program writes its `/run` body.
async fn answer(mut conn: Conn, event: Arc<Vec<u8>>) {
    let Some(request) = conn.request().await else {
        return;
    };
    if request.path == "/register" {
        return conn.respond(204, "application/json", b"").await;
    }
    let ask: serde_json::Value = serde_json::from_slice(&request.body).expect("JSON");
    let prompt = ask["prompt"].as_str().unwrap_or_default();
    match prompt {
        "chunked 4 KiB" | "chunked 64 KiB" => {
            let piece = if prompt.ends_with("64 KiB") {
                64 << 10
            } else {
                4 << 10
            };
            conn.event_stream().await;
            for bytes in event.chunks(piece) {
                conn.chunk(bytes).await;
            }
            conn.end().await;
        }
        _ => {
            conn.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
                .await;
            for bytes in event.chunks(4 << 10) {
                conn.write(bytes).await;
            }
        }
    }
}

/// A proxy in front of the demo agent program.
async fn demo_proxy(stop: &CancellationToken) -> String {
    let agent = AgentServer::bind(SocketAddr::from(([127, 0, 0, 1], 0)), Arc::new(Demo::new()))
        .await
        .expect("binds");
    let agent_addr = agent.local_addr();
    let (agent, _) = agent.spawn();
    // It ends when the test's token fires.
    let stop = stop.clone();
    tokio::spawn(async move {
        stop.cancelled().await;
        agent.shutdown();
    });
    proxy_for(agent_addr).await
}

async fn proxy_for(agent: SocketAddr) -> String {
    let proxy = agent_program::proxy(agent).await;
    register(&proxy.url).await;
    proxy.url
}

/// The CPU time of one exchange, and the length of its first message.
async fn measure(url: &str, prompt: &str) -> (Duration, usize) {
    let ask = serde_json::to_vec(&serde_json::json!({ "prompt": prompt })).expect("JSON");
    let before = cpu();
    let done = exchange(url, "/agent/run", &ask).await;
    let spent = cpu() - before;
    let first = done.messages.first().map_or(0, Vec::len);
    (spent, first)
}

fn main() {
    runloop_testkit::run_figures(&[(
        "one_large_event_costs_time_linear_in_its_size",
        one_large_event_costs_time_linear_in_its_size,
    )]);
}

fn one_large_event_costs_time_linear_in_its_size() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(measure_all());
}

async fn measure_all() {
    let stop = CancellationToken::new();
    let event = Arc::new(event());
    let chunk_len = 1 + event.len() - "data: ".len() - 2;

    let demo = demo_proxy(&stop).await;
    let prompt = format!("demo:load=1x{TEXT}");
    let (baseline, first) = measure(&demo, &prompt).await;
    assert!(first > TEXT, "the demo's chunk arrived ({first} bytes)");
    println!(
        "the demo's own 15 MiB chunk (baseline): {:.3} s CPU",
        baseline.as_secs_f64()
    );

    let (agent, _task) = scripted(move |conn| answer(conn, Arc::clone(&event))).await;
    let url = proxy_for(agent).await;
    for shape in ["chunked 4 KiB", "chunked 64 KiB", "close-delimited"] {
        let (spent, first) = measure(&url, shape).await;
        assert_eq!(first, chunk_len, "{shape}: the event arrived whole");
        println!(
            "15 MiB event, {shape}: {:.3} s CPU, {:.1}x the baseline",
            spent.as_secs_f64(),
            spent.as_secs_f64() / baseline.as_secs_f64()
        );
    }
    stop.cancel();
}
