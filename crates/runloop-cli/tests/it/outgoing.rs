//! What `runloop serve` holds for a caller that does not read what it is
//! sent (issue 13, rows 1, 2 and 9), read from the server's
//! `/proc/PID/status` (`VmRSS`, `VmHWM`) while raw WebSocket callers drive
//! it over loopback.
//!
//! - A caller that pings as fast as it can and never reads the answers,
//!   before its authorization and after it: the server's peak grows by
//!   less than 64 MiB, and it ends the connection.
//! - Callers that each ask the demo agent for 15 MiB chunks and never
//!   read: eight such loops together peak under 256 MiB. A large chunk is
//!   held once per loop, by the relay, while the caller's socket takes it
//!   in fragments; the stages before it pass it on in pieces and stop when
//!   the relay stops reading: the demo serves it as slices of one static
//!   run of letters, the proxy sends each 64 KiB of the event as it
//!   arrives. In a release build, peaks of 182 MiB for eight loops and 46
//!   MiB for one (587 and 138 when each of four stages held a whole chunk;
//!   1,132 and 211 before that).
//!
//! `RUNLOOP_BIN` names another `runloop` binary to measure (an older build,
//! for a before/after figure); the default is this build's.

use std::time::Duration;

use futures_util::SinkExt;
use runloop::proto::frame::{self, ClientFrame};
use runloop_testkit::command::{Serve, demo_request};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const MIB: u64 = 1 << 20;

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn connect(url: &str) -> Socket {
    let (socket, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("the WebSocket handshake");
    socket
}

async fn send_frame(socket: &mut Socket, frame: &ClientFrame<'_>) {
    socket
        .send(Message::Binary(frame::to_message(frame).into()))
        .await
        .expect("sends a frame");
}

async fn authorize(socket: &mut Socket) {
    // Any credential: the server has no token and listens on loopback.
    send_frame(socket, &ClientFrame::Authorization { payload: &[0] }).await;
}

/// Pings as fast as the socket takes them (masked ping frames of 125
/// bytes, written straight to the socket) and never reads, for `most` at
/// most; whether the server ended the connection before then.
async fn ping_flood(socket: &mut Socket, most: Duration) -> bool {
    let mut ping = vec![0x89, 0x80 | 125, 0, 0, 0, 0];
    ping.extend_from_slice(&[b'p'; 125]);
    let pings = ping.repeat(8192);
    let MaybeTlsStream::Plain(tcp) = socket.get_mut() else {
        unreachable!("a ws:// URL")
    };
    let flooding = async { while tcp.write_all(&pings).await.is_ok() {} };
    tokio::time::timeout(most, flooding).await.is_ok()
}

/// The server's peak growth while `attack` runs, and its result.
fn peak_growth<T>(server: &Serve, attack: impl Future<Output = T>) -> (u64, T) {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let baseline = server.status("VmRSS");
    let result = runtime.block_on(attack);
    let growth = server.status("VmHWM").saturating_sub(baseline);
    (growth, result)
}

/// A caller that floods pings and never reads, authorized first or not:
/// the server's peak grows by less than 64 MiB, and it ends the connection.
fn a_ping_flood_is_closed_and_costs_little(authorized: bool) {
    let server = Serve::start("error", &[]);
    let url = server.url.clone();
    let (growth, ended) = peak_growth(&server, async move {
        let mut socket = connect(&url).await;
        if authorized {
            authorize(&mut socket).await;
        }
        ping_flood(&mut socket, Duration::from_secs(8)).await
    });
    println!(
        "ping flood, authorized: {authorized}: peak growth {} MiB, ended: {ended}",
        growth / MIB
    );
    assert!(
        growth < 64 * MIB,
        "the server's peak grew {} MiB",
        growth / MIB
    );
    assert!(ended, "the server went on answering the flood");
}

#[test]
fn a_caller_that_pings_and_never_reads_before_authorizing_is_closed_and_costs_little() {
    a_ping_flood_is_closed_and_costs_little(false);
}

#[test]
fn a_caller_that_pings_and_never_reads_after_authorizing_is_closed_and_costs_little() {
    a_ping_flood_is_closed_and_costs_little(true);
}

/// A caller that asks the demo for `count` chunks of 15 MiB in one loop,
/// and never reads.
async fn large_chunks_unread(url: String, count: usize) -> Socket {
    let mut socket = connect(&url).await;
    authorize(&mut socket).await;
    let mut run = vec![0];
    serde_json::to_writer(&mut run, &demo_request()).expect("serializes");
    send_frame(
        &mut socket,
        &ClientFrame::Request {
            scope: 0,
            payload: &run,
        },
    )
    .await;
    let prompt = format!("demo:load={count}x{}", 15 << 20);
    let mut ask = vec![5];
    ask.extend_from_slice(
        serde_json::json!({ "prompt": prompt })
            .to_string()
            .as_bytes(),
    );
    send_frame(
        &mut socket,
        &ClientFrame::ChannelRequest {
            scope: 0,
            channel: 0,
            payload: &ask,
        },
    )
    .await;
    socket
}

/// The server's peak with `callers` loops of 15 MiB chunks nobody reads.
fn large_chunks_peak(callers: usize) -> u64 {
    let server = Serve::start("error", &[]);
    let url = server.url.clone();
    let (growth, sockets) = peak_growth(&server, async move {
        let callers = (0..callers).map(|_| tokio::spawn(large_chunks_unread(url.clone(), 64)));
        let mut sockets = Vec::new();
        for caller in callers {
            sockets.push(caller.await.expect("a caller"));
        }
        // Long enough for 64 chunks of 15 MiB a loop to pile up if nothing
        // held them.
        tokio::time::sleep(Duration::from_secs(8)).await;
        sockets
    });
    let peak = server.status("VmHWM");
    println!(
        "{callers} loops of 15 MiB chunks, never read: server peak {} MiB (growth {} MiB)",
        peak / MIB,
        growth / MIB
    );
    drop(sockets);
    peak
}

#[test]
fn a_caller_that_asks_for_15_mib_chunks_and_never_reads_is_held_to_a_bound() {
    let peak = large_chunks_peak(1);
    assert!(peak < 256 * MIB, "the server's peak is {} MiB", peak / MIB);
}

#[test]
fn eight_callers_that_ask_for_15_mib_chunks_and_never_read_keep_the_server_small() {
    let peak = large_chunks_peak(8);
    assert!(peak < 256 * MIB, "the server's peak is {} MiB", peak / MIB);
}
