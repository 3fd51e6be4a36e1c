//! The connection harness: fuzz input in, a whole server connection driven
//! with it, and the server's every frame checked against the protocol.
//!
//! One server lives for the whole process (the catalog's `demo` on the
//! builtin runtime, a real agent program behind a real proxy), with small
//! limits so that an input reaches them. Each input is one connection over
//! an in-memory pipe handed to [`ServerHandle::serve_connection`]: the
//! server runs exactly as for a TCP caller, the WebSocket handshake
//! included, with no port and no kernel buffer in the way.
//!
//! The input is a flags byte and then records, each one client message
//! built from a template (so that inputs reach running runs and loops
//! instead of dying at the authorization) or taken as raw bytes:
//!
//! ```text
//! input  := flags:u8 record*          flags bit 0: authorize first, with the
//!                                     accepted credential
//! record := op:u8 …                   op % 8:
//!   0 raw      len:u8 bytes[len]                  the message, as is
//!   1 run      s:u8                               run request on scope s % 8
//!                                                 (s ≥ 128: an agent that refuses)
//!   2 loop     s:u8 c:u8 p:u8                     run-loop request, prompt PROMPTS[p]
//!   3 stop     s:u8 c:u8                          stop channel
//!   4 frame    type:u8 s:u8 c:u8 len:u8 bytes     any header, len % 64 payload bytes
//!   5 sync                                        a probe; wait for it, for every
//!                                                 run's answer, every loop's finish
//!   6 channel  s:u8 c:u8 tag:u8                   a channel request with any tag
//!   7 auth     len:u8 bytes[len % 32]             a type-0 frame
//! ```
//!
//! Missing bytes at the end of the input read as zeros. A **probe** is a
//! request for an unserved endpoint on a scope no record can name; its bare
//! finish, when it comes back, proves that the server has dispatched every
//! message sent before it. A sync then also waits until every run asked for
//! has its answer and every loop asked for on a running scope has its
//! finish, so that inputs can build on a run that has started; between
//! syncs, records go out back to back and race whatever the server does.
//!
//! When the records are done, and the connection is still up, every scope
//! is stopped and the harness waits until the server holds no scope, so the
//! connection's end is checked too. Then the client closes, and the
//! server's frames are checked:
//!
//! - every message is binary and decodes as a frame a server may send, and
//!   none is an authorization or a channel request (the server opens none);
//! - a connection that did not authorize with the accepted credential first
//!   gets no frame at all;
//! - no frame of a scope after its finish, unless the client asked for the
//!   scope again; at most one main-stream response per scope, and it decodes;
//! - no response on a channel after its finish, unless asked for again;
//!   every channel's responses read through the caller's
//!   [`Reader`](runloop_proto::run_loop::Reader) without ever breaking;
//!   no channel left without its finish when its scope finishes or when
//!   everything was stopped;
//! - nothing panics, in the harness or in any task of the server;
//! - when the connection is over, the server holds nothing
//!   ([`ServerHandle::stats`] back to zero).
//!
//! A violation panics with what was seen, which libFuzzer records as a
//! crash; `cargo test` replays the committed corpus through the same code.
//!
//! The same inputs also play against the connection table alone, in memory
//! ([`table`], the fuzz target `table`), checked by the same oracle: the
//! rules at the speed of a function call, where this target spends most of
//! an input on sockets and tasks.

pub mod table;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use runloop::runtime::Catalog;
use runloop::server::{Credentials, Server, ServerConfig, ServerHandle, StatsSnapshot};
use runloop_proto::Decode;
use runloop_proto::agents_run::RunResponse;
use runloop_proto::authorization::Authorization;
use runloop_proto::frame::{self, ClientFrame, ServerFrame};
use runloop_proto::run_loop::{Outcome, Reader, Step};
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::Message;

/// The credential the server accepts.
pub const CREDENTIAL: &str = "fuzz";
/// The scope of the probes; no record can name it.
const PROBE: u32 = 0xFFFF_FFF0;
/// The channel of the final stops; no record can name it.
const LAST_STOP: u32 = 0xFFFF_FF00;
/// Scope and channel numbers the records use.
const NUMBERS: u8 = 8;
/// The most records one input plays.
const MAX_RECORDS: usize = 256;
/// A bound on any wait, so a server that hangs is a finding, not a stall.
const PATIENCE: Duration = Duration::from_secs(20);

/// The prompts a loop record picks from: every ending of the demo.
const PROMPTS: [&str; 8] = [
    "count these words",
    "please demo:fatal",
    "please demo:break",
    "please demo:refuse",
    "please demo:refuse-text",
    "demo:load=40",
    "demo:pace=2 slow enough to stop",
    "demo:unknown",
];

struct World {
    runtime: tokio::runtime::Runtime,
    server: ServerHandle,
}

/// Set by the panic hook: some thread (a server task too) panicked.
static PANICKED: AtomicBool = AtomicBool::new(false);

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            // Under libFuzzer, its C++ `main` runs instead of Rust's, which
            // would have set SIGPIPE to be ignored: a vectored write to a
            // socket whose peer has gone would then end the process instead
            // of failing the write.
            // SAFETY: setting a signal's disposition to "ignore" before any
            // thread of ours exists; no handler code is involved.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            }
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                PANICKED.store(true, Ordering::SeqCst);
                previous(info);
            }));
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let server = runtime.block_on(async {
            let mut config = ServerConfig::new(
                Credentials::Tokens(vec![CREDENTIAL.into()]),
                Catalog::demo(),
            );
            config.limits.max_scopes = 4;
            config.limits.max_channels = 3;
            config.limits.max_queued_responses = 4;
            config.limits.max_message_size = 64 << 10;
            let server = Server::bind("127.0.0.1:0", config)
                .await
                .expect("a loopback port");
            server.spawn().0
        });
        World { runtime, server }
    })
}

/// What one input drew from the server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Played {
    /// Frames the server sent, probes' answers included.
    pub frames: usize,
    /// The outcome of every channel that finished, by name, in order.
    pub outcomes: Vec<&'static str>,
}

/// Plays one input against the server and checks everything it answered.
/// Panics on any violation.
pub fn play(input: &[u8]) -> Played {
    let world = world();
    let played = world.runtime.block_on(connection(&world.server, input));
    assert!(
        !PANICKED.load(Ordering::SeqCst),
        "a thread panicked while this input played"
    );
    played
}

/// Reads the input, zeros past its end.
struct Input<'a> {
    bytes: &'a [u8],
}

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((&first, rest)) => {
                self.bytes = rest;
                first
            }
            None => 0,
        }
    }

    fn number(&mut self) -> u32 {
        u32::from(self.byte() % NUMBERS)
    }

    fn take(&mut self, len: usize) -> Vec<u8> {
        let len = len.min(self.bytes.len());
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        taken.to_vec()
    }
}

/// What the client has asked for so far, counted before each send, so that
/// whatever the server sends answers something already counted.
#[derive(Debug, Default)]
struct Asked {
    scopes: HashMap<u32, u32>,
    channels: HashMap<(u32, u32), u32>,
}

/// What the reading side has seen.
#[derive(Debug, Default)]
struct Seen {
    frames: Vec<Vec<u8>>,
    probes: u32,
    ended: bool,
    violations: Vec<String>,
    scope_finishes: HashMap<u32, u32>,
    /// Per scope: a lifetime in progress and whether it answered yet.
    scope_answered: HashMap<u32, bool>,
    /// Per scope: frames seen since its last finish.
    scope_active: HashMap<u32, bool>,
    channel_finishes: HashMap<(u32, u32), u32>,
    readers: HashMap<(u32, u32), (Reader, u64)>,
    outcomes: Vec<Outcome>,
    /// Scopes asked for and not answered yet, as far as the client knows.
    starting: HashSet<u32>,
    /// Channels asked for on a running scope and not finished yet.
    looping: HashSet<(u32, u32)>,
}

struct Shared {
    asked: Mutex<Asked>,
    seen: Mutex<Seen>,
    progress: Notify,
}

impl Shared {
    fn asked(&self) -> std::sync::MutexGuard<'_, Asked> {
        self.asked.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`count`]s a message, locking as the reader does: what it has seen,
    /// then what was asked.
    fn count(&self, message: &[u8]) {
        let mut seen = self.seen();
        count(&mut self.asked(), &mut seen, message);
    }
}

fn run_request(scope: u32, refuses: bool) -> Vec<u8> {
    let agent = if refuses {
        "\"demo:refuse\""
    } else {
        "{\"model\":\"fuzz\"}"
    };
    let json = format!(
        "{{\"image\":{{\"server\":{{\"name\":\"demo\",\"digest\":\"sha256:{}\"}}}},\"memory\":1048576,\"disk\":0,\"agent\":{agent}}}",
        "0".repeat(64)
    );
    let payload = [&[0u8][..], json.as_bytes()].concat();
    frame::to_message(&ClientFrame::Request {
        scope,
        payload: &payload,
    })
}

fn channel_request(scope: u32, channel: u32, payload: &[u8]) -> Vec<u8> {
    frame::to_message(&ClientFrame::ChannelRequest {
        scope,
        channel,
        payload,
    })
}

/// The message a record stands for; `None` for a sync.
fn record(op: u8, input: &mut Input<'_>) -> Option<Vec<u8>> {
    Some(match op % 8 {
        0 => {
            let len = usize::from(input.byte());
            input.take(len)
        }
        1 => {
            let byte = input.byte();
            run_request(u32::from(byte % NUMBERS), byte >= 128)
        }
        2 => {
            let (scope, channel) = (input.number(), input.number());
            let prompt = PROMPTS[usize::from(input.byte()) % PROMPTS.len()];
            let json = format!("{{\"prompt\":\"{prompt}\"}}");
            channel_request(scope, channel, &[&[5u8][..], json.as_bytes()].concat())
        }
        3 => {
            let (scope, channel) = (input.number(), input.number());
            channel_request(scope, channel, &[0])
        }
        4 => {
            let frame_type = input.byte();
            let (scope, channel) = (input.number(), input.number());
            let len = usize::from(input.byte() % 64);
            frame::raw(frame_type, scope, channel, &input.take(len))
        }
        5 => return None,
        6 => {
            let (scope, channel) = (input.number(), input.number());
            let tag = input.byte();
            channel_request(
                scope,
                channel,
                &[&[tag][..], b"{\"prompt\":\"x\"}"].concat(),
            )
        }
        _ => {
            let len = usize::from(input.byte() % 32);
            frame::to_message(&ClientFrame::Authorization {
                payload: &input.take(len),
            })
        }
    })
}

/// The messages an input stands for, in order; `None` for a sync.
fn messages(input: &[u8]) -> Vec<Option<Vec<u8>>> {
    let mut input = Input { bytes: input };
    let flags = input.byte();
    let mut messages = Vec::new();
    if flags & 1 == 1 {
        let payload = [&[0u8][..], CREDENTIAL.as_bytes()].concat();
        messages.push(Some(frame::to_message(&ClientFrame::Authorization {
            payload: &payload,
        })));
    }
    while !input.bytes.is_empty() && messages.len() < MAX_RECORDS {
        let op = input.byte();
        match record(op, &mut input) {
            Some(message) if reserved(&message) => {}
            other => messages.push(other),
        }
    }
    messages
}

/// Whether a message names the probe's scope or the last stops' channel,
/// which only the harness may use.
fn reserved(message: &[u8]) -> bool {
    match ClientFrame::decode(message) {
        Ok(ClientFrame::Request { scope, .. }) => scope == PROBE,
        Ok(
            ClientFrame::ChannelRequest { scope, channel, .. }
            | ClientFrame::ChannelResponse { scope, channel, .. }
            | ClientFrame::ChannelResponseFinish { scope, channel },
        ) => scope == PROBE || channel == LAST_STOP,
        _ => false,
    }
}

/// Whether `message`, sent first, authorizes with the accepted credential.
fn authorizes(message: &[u8]) -> bool {
    match ClientFrame::decode(message) {
        Ok(ClientFrame::Authorization { payload }) => {
            Authorization::decode(payload).is_ok_and(|a| a.credential() == CREDENTIAL)
        }
        _ => false,
    }
}

async fn connection(server: &ServerHandle, input: &[u8]) -> Played {
    let (near, far) = tokio::io::duplex(64 << 10);
    let connection = server.serve_connection(far, "fuzz");
    let (ws, _) = tokio_tungstenite::client_async("ws://fuzz/", near)
        .await
        .expect("the handshake over a pipe");
    let (mut sink, mut stream) = ws.split();
    let shared = Arc::new(Shared {
        asked: Mutex::default(),
        seen: Mutex::default(),
        progress: Notify::new(),
    });
    let reading = tokio::spawn({
        let shared = Arc::clone(&shared);
        async move {
            while let Some(message) = stream.next().await {
                let mut seen = shared.seen();
                match message {
                    Ok(Message::Binary(bytes)) => {
                        let asked = shared.asked();
                        check(&mut seen, &asked, &bytes);
                        seen.frames.push(bytes.to_vec());
                    }
                    Ok(Message::Close(_)) => {}
                    Ok(other) => seen
                        .violations
                        .push(format!("a message that is not binary: {other:?}")),
                    Err(_) => break,
                }
                drop(seen);
                shared.progress.notify_waiters();
            }
            shared.seen().ended = true;
            shared.progress.notify_waiters();
        }
    });

    let mut first = None;
    let mut probes = 0;
    for message in messages(input) {
        if shared.seen().ended {
            break;
        }
        match message {
            Some(message) => {
                first.get_or_insert_with(|| authorizes(&message));
                shared.count(&message);
                if sink.send(Message::Binary(message.into())).await.is_err() {
                    break;
                }
            }
            None => {
                first.get_or_insert(false);
                probes += 1;
                if !probe(&mut sink, &shared, probes).await {
                    break;
                }
            }
        }
    }
    let authorized = first == Some(true);
    // Stop whatever runs, and wait until the server holds no scope.
    if authorized && !shared.seen().ended {
        for scope in 0..u32::from(NUMBERS) {
            let stop = channel_request(scope, LAST_STOP, &[0]);
            shared.count(&stop);
            let _ = sink.send(Message::Binary(stop.into())).await;
        }
        probes += 1;
        if probe(&mut sink, &shared, probes).await {
            let stopped = tokio::time::timeout(PATIENCE, async {
                while server.stats().scopes > 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
            .await;
            assert!(
                stopped.is_ok(),
                "a stopped run never ended: {:?}",
                server.stats()
            );
            probes += 1;
            probe(&mut sink, &shared, probes).await;
        }
    }
    let stopped_all = authorized && !shared.seen().ended;
    let _ = sink.close().await;
    tokio::time::timeout(PATIENCE, reading)
        .await
        .expect("the server closes the connection")
        .expect("the reader does not panic");
    tokio::time::timeout(PATIENCE, connection)
        .await
        .expect("the connection's task ends")
        .expect("the connection's task does not panic");

    let played = verdict(&shared.seen(), authorized, stopped_all);
    let released = tokio::time::timeout(PATIENCE, async {
        loop {
            let stats = server.stats();
            if stats
                == (StatsSnapshot {
                    disregarded: stats.disregarded,
                    ..StatsSnapshot::default()
                })
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert!(
        released.is_ok(),
        "the server still holds {:?} after the connection",
        server.stats()
    );
    played
}

/// The checks on a whole connection, once it is over: what it drew.
fn verdict(seen: &Seen, authorized: bool, stopped_all: bool) -> Played {
    if !authorized {
        assert!(
            seen.frames.is_empty(),
            "a connection that did not authorize got frames: {:?}",
            seen.frames
        );
    }
    if stopped_all {
        for ((scope, channel), (reader, responses)) in &seen.readers {
            assert!(
                *responses == 0 || reader.is_ended(),
                "channel {channel} of scope {scope} never finished"
            );
        }
        for (scope, active) in &seen.scope_active {
            assert!(!active, "scope {scope} never finished");
        }
    }
    assert!(
        seen.violations.is_empty(),
        "violations: {:?}\nframes: {:?}",
        seen.violations,
        seen.frames
    );
    Played {
        frames: seen.frames.len(),
        outcomes: seen.outcomes.iter().map(Outcome::name).collect(),
    }
}

/// Counts what a message asks for, before it is sent, and notes what a
/// sync is to wait for: a run's answer, a loop's finish.
fn count(asked: &mut Asked, seen: &mut Seen, message: &[u8]) {
    match ClientFrame::decode(message) {
        Ok(ClientFrame::Request { scope, .. }) => {
            *asked.scopes.entry(scope).or_default() += 1;
            if !seen.scope_active.get(&scope).copied().unwrap_or(false) {
                seen.starting.insert(scope);
            }
        }
        Ok(ClientFrame::ChannelRequest {
            scope,
            channel,
            payload,
        }) => {
            *asked.channels.entry((scope, channel)).or_default() += 1;
            let running = seen.scope_answered.get(&scope).copied().unwrap_or(false)
                && seen.scope_active.get(&scope).copied().unwrap_or(false);
            if running && payload.first() != Some(&0) {
                seen.looping.insert((scope, channel));
            }
        }
        _ => {}
    }
}

/// Sends probe number `n` and waits for its bare finish, then for every
/// run asked for to be answered and every loop asked for on a running
/// scope to finish. `false` when the connection ended first.
async fn probe<S>(sink: &mut S, shared: &Shared, n: u32) -> bool
where
    S: futures_util::Sink<Message> + Unpin,
{
    let message = frame::to_message(&ClientFrame::Request {
        scope: PROBE,
        payload: &[77],
    });
    if sink.send(Message::Binary(message.into())).await.is_err() {
        return false;
    }
    let answered = tokio::time::timeout(PATIENCE, async {
        loop {
            let progress = shared.progress.notified();
            {
                let seen = shared.seen();
                if seen.probes >= n && seen.starting.is_empty() && seen.looping.is_empty() {
                    return true;
                }
                if seen.ended {
                    return false;
                }
            }
            progress.await;
        }
    })
    .await;
    answered.unwrap_or_else(|_| {
        let seen = shared.seen();
        panic!(
            "no answer in time: probe {n} of {}, runs starting {:?}, loops running {:?}",
            seen.probes, seen.starting, seen.looping
        )
    })
}

/// Checks one server frame against everything seen and asked so far.
fn check(seen: &mut Seen, asked: &Asked, bytes: &[u8]) {
    let frame = match ServerFrame::decode(bytes) {
        Ok(frame) => frame,
        Err(error) => {
            return seen
                .violations
                .push(format!("a frame that does not decode: {error}"));
        }
    };
    let scope_alive = |seen: &Seen, scope: u32| {
        seen.scope_finishes.get(&scope).copied().unwrap_or(0)
            < asked.scopes.get(&scope).copied().unwrap_or(0)
    };
    match frame {
        ServerFrame::Authorization { .. } => {
            seen.violations
                .push("the server sent an authorization".into());
        }
        ServerFrame::ChannelRequest { scope, channel, .. } => seen.violations.push(format!(
            "the server opened channel {channel} of scope {scope}"
        )),
        ServerFrame::ResponseFinish { scope } if scope == PROBE => seen.probes += 1,
        ServerFrame::Response { scope, .. } | ServerFrame::ResponseFinish { scope }
            if scope == PROBE =>
        {
            seen.violations
                .push("a response on the probe's scope".into());
        }
        ServerFrame::Response { scope, payload } => {
            seen.starting.remove(&scope);
            if !scope_alive(seen, scope) {
                seen.violations
                    .push(format!("a response on scope {scope} after its finish"));
            }
            if seen.scope_answered.insert(scope, true) == Some(true) {
                seen.violations
                    .push(format!("a second response on scope {scope}"));
            }
            seen.scope_active.insert(scope, true);
            if let Err(error) = RunResponse::decode(payload) {
                seen.violations.push(format!(
                    "a response on scope {scope} does not decode: {error}"
                ));
            }
        }
        ServerFrame::ResponseFinish { scope } => {
            if !scope_alive(seen, scope) {
                seen.violations
                    .push(format!("a second finish of scope {scope}"));
            }
            *seen.scope_finishes.entry(scope).or_default() += 1;
            seen.starting.remove(&scope);
            seen.looping.retain(|(s, _)| *s != scope);
            seen.scope_answered.remove(&scope);
            seen.scope_active.insert(scope, false);
            let left_open: Vec<u32> = seen
                .readers
                .iter()
                .filter(|((s, _), (reader, responses))| {
                    *s == scope && *responses > 0 && !reader.is_ended()
                })
                .map(|((_, channel), _)| *channel)
                .collect();
            for channel in left_open {
                seen.violations.push(format!(
                    "channel {channel} of scope {scope} left open at the scope's finish"
                ));
            }
            seen.readers.retain(|(s, _), _| *s != scope);
        }
        ServerFrame::ChannelResponse {
            scope,
            channel,
            payload,
        } => {
            if !scope_alive(seen, scope) {
                seen.violations.push(format!(
                    "a response on channel {channel} of scope {scope} after the scope's finish"
                ));
            }
            seen.scope_active.insert(scope, true);
            let finishes = seen
                .channel_finishes
                .get(&(scope, channel))
                .copied()
                .unwrap_or(0);
            if finishes >= asked.channels.get(&(scope, channel)).copied().unwrap_or(0) {
                seen.violations.push(format!(
                    "a response on channel {channel} of scope {scope} after its finish"
                ));
            }
            let (reader, responses) = seen
                .readers
                .entry((scope, channel))
                .or_insert_with(|| (Reader::new(), 0));
            *responses += 1;
            match reader.response(payload) {
                Some(Step::End(outcome)) => seen.violations.push(format!(
                    "channel {channel} of scope {scope} broke: {outcome:?}"
                )),
                None => seen.violations.push(format!(
                    "a response on channel {channel} of scope {scope} after its outcome"
                )),
                Some(Step::Chunk(_) | Step::Error(_)) => {}
            }
        }
        ServerFrame::ChannelResponseFinish { scope, channel } => {
            if !scope_alive(seen, scope) {
                seen.violations.push(format!(
                    "a finish of channel {channel} of scope {scope} after the scope's finish"
                ));
            }
            seen.scope_active.insert(scope, true);
            seen.looping.remove(&(scope, channel));
            let finishes = seen.channel_finishes.entry((scope, channel)).or_default();
            *finishes += 1;
            if *finishes > asked.channels.get(&(scope, channel)).copied().unwrap_or(0) {
                seen.violations.push(format!(
                    "a finish of channel {channel} of scope {scope}, which was not asked for"
                ));
            }
            let (mut reader, _) = seen
                .readers
                .remove(&(scope, channel))
                .unwrap_or_else(|| (Reader::new(), 0));
            match reader.finish() {
                Some(outcome) => seen.outcomes.push(outcome),
                None => seen.violations.push(format!(
                    "a finish of channel {channel} of scope {scope} after its outcome"
                )),
            }
        }
    }
}
