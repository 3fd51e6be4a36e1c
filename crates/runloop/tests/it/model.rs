//! A stateful property test of the server's connection layer (protocol §2).
//!
//! Random interleavings of client frames, valid and invalid, while a simple
//! model keeps track of which scopes and channels are open. After every
//! frame the server's answers must be exactly what the model predicts:
//! every request answered once, or disregarded; every finish sent once;
//! nothing extra. A frame the model says is disregarded is checked with a
//! probe — a request the server must answer with a bare finish — whose
//! answer must be the very next frame. At the end every run is stopped and
//! the connection must be quiet.
//!
//! The same cases play against two servers: a real one over a real socket
//! (the I/O: the reader, the writer, the relays and their ordering), and a
//! server made of the connection table alone, in memory (the rules: every
//! decision the server takes about a frame is the table's), which runs
//! many more cases in the same time:
//!
//! ```text
//! RUNLOOP_MODEL_CASES          cases over the socket (48 by default)
//! RUNLOOP_MODEL_MEMORY_CASES   cases in memory (2000 by default)
//! ```

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::pin::pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};

use proptest::prelude::*;
use runloop::server::{Credentials, ServerHandle};
use runloop_proto::Decode;
use runloop_proto::connection::{Serve, Table, side};
use runloop_proto::frame::{self, ClientFrame, ServerFrame};
use runloop_proto::run_loop::ERROR;
use runloop_testkit::caller::{Owned, RawClient};
use runloop_testkit::fake_proxy::{FakeProxy, Step};
use runloop_testkit::message::chunk;
use runloop_testkit::server::{run_request_payload, server_for};
use runloop_testkit::wait::eventually;

/// Scope numbers the cases use; the probe's scope is outside them.
const SCOPES: u32 = 3;
const CHANNELS: u32 = 3;
const PROBE_SCOPE: u32 = 1000;

#[derive(Debug, Clone)]
enum Action {
    OpenRun(u32),
    UnservedEndpoint(u32, u8),
    UndecodableRequest(u32),
    /// A loop that sends `n` chunks and finishes, or (None) one that sends a
    /// chunk and hangs until its run ends.
    OpenLoop(u32, u32, Option<u8>),
    /// A channel request with an unserved tag, and a body after it or not.
    UnservedChannel(u32, u32, u8, bool),
    UndecodableChannel(u32, u32),
    /// A stop, with bytes after its tag (ignored) or not.
    Stop(u32, u32, bool),
    /// A finishing loop of `n` chunks and, before any answer is read, a stop
    /// on another number: the loop may finish or be cut, the run ends.
    StopRacingLoop(u32, u32, u8),
    /// A stop and, before its run's end is read, a loop on the stop's own
    /// number, which is taken until the scope's finish: disregarded.
    StopThenLoopOnIt(u32, u32),
    Malformed(Vec<u8>),
    ServerChannelResponse(u32, u32),
}

fn action() -> impl Strategy<Value = Action> {
    let scope = 0..SCOPES;
    let channel = 0..CHANNELS;
    prop_oneof![
        3 => scope.clone().prop_map(Action::OpenRun),
        1 => (scope.clone(), 1u8..=255).prop_map(|(s, t)| Action::UnservedEndpoint(s, t)),
        1 => scope.clone().prop_map(Action::UndecodableRequest),
        4 => (scope.clone(), channel.clone(), prop::option::of(0u8..4))
            .prop_map(|(s, c, n)| Action::OpenLoop(s, c, n)),
        1 => (scope.clone(), channel.clone(), prop::sample::select(vec![1u8, 2, 3, 4, 6, 7, 8, 9, 200]), any::<bool>())
            .prop_map(|(s, c, t, body)| Action::UnservedChannel(s, c, t, body)),
        1 => (scope.clone(), channel.clone()).prop_map(|(s, c)| Action::UndecodableChannel(s, c)),
        2 => (scope.clone(), channel.clone(), any::<bool>()).prop_map(|(s, c, tail)| Action::Stop(s, c, tail)),
        1 => (scope.clone(), channel.clone(), 0u8..4).prop_map(|(s, c, n)| Action::StopRacingLoop(s, c, n)),
        1 => (scope.clone(), channel.clone()).prop_map(|(s, c)| Action::StopThenLoopOnIt(s, c)),
        1 => prop_oneof![
            prop::collection::vec(any::<u8>(), 0..9),
            (prop::sample::select(vec![2u8, 3, 7, 255]), prop::collection::vec(any::<u8>(), 8..20))
                .prop_map(|(t, mut rest)| { rest.insert(0, t); rest }),
        ]
        .prop_map(Action::Malformed),
        1 => (scope, channel).prop_map(|(s, c)| Action::ServerChannelResponse(s, c)),
    ]
}

/// What the model knows: open scopes, and in each its open channels, with
/// whether each is a hanging loop (true) or a stop (false).
#[derive(Debug, Default)]
struct Model {
    scopes: BTreeMap<u32, BTreeMap<u32, bool>>,
}

/// The hanging loops among a scope's channels.
fn hanging(channels: &BTreeMap<u32, bool>) -> BTreeSet<u32> {
    channels
        .iter()
        .filter(|(_, hang)| **hang)
        .map(|(c, _)| *c)
        .collect()
}

struct World {
    runtime: tokio::runtime::Runtime,
    server: ServerHandle,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let server = runtime.block_on(async {
            let proxy = FakeProxy::start().await;
            for n in 0..4u8 {
                let mut steps: Vec<Step> =
                    (0..n).map(|i| Step::Send(chunk(&i.to_string()))).collect();
                steps.push(Step::Close);
                proxy.script(&format!("finish {n}"), steps);
            }
            proxy.script("hang", vec![Step::Send(chunk("h")), Step::AwaitClose]);
            server_for(&proxy, Credentials::Any).await
        });
        World { runtime, server }
    })
}

/// A connection the model plays: a real socket, or the table in memory.
trait Wire {
    async fn send(&mut self, bytes: Vec<u8>);

    /// The next server frame; `None` when there is none.
    async fn next_frame(&mut self) -> Option<Owned>;

    async fn send_frame(&mut self, frame: &ClientFrame<'_>) {
        self.send(frame::to_message(frame)).await;
    }

    /// Opens `scope` with a run request and checks its id came.
    async fn open_run(&mut self, scope: u32) {
        let payload = run_request_payload();
        self.send_frame(&ClientFrame::Request {
            scope,
            payload: &payload,
        })
        .await;
        match self.next_frame().await {
            Some(Owned::Response { scope: s, payload }) if s == scope && payload[0] == 0 => {}
            other => panic!("expected the run's id, got {other:?}"),
        }
    }
}

impl Wire for RawClient {
    async fn send(&mut self, bytes: Vec<u8>) {
        RawClient::send(self, bytes).await;
    }

    async fn next_frame(&mut self) -> Option<Owned> {
        RawClient::next_frame(self).await
    }
}

/// A server made of the connection table alone: every decision about a
/// frame is the table's; a run answers with its id at once, a loop plays
/// its script at once (`finish N`: N chunks and the finish; `hang`: a chunk,
/// then open until its run ends), and a stop ends its run as the server
/// does — not at once, but when the client next reads, so that frames sent
/// right after a stop meet its scope still open, as over a socket.
struct Memory {
    table: Table<side::Server, (), ()>,
    sent: VecDeque<Owned>,
    /// Scopes stopped and not yet ended, in order.
    stopping: Vec<u32>,
}

impl Memory {
    fn authorized() -> Memory {
        let limits = runloop::limits::Limits::default();
        let mut table = Table::server(limits.max_scopes, limits.max_channels);
        let authorized = table.received(ClientFrame::Authorization { payload: b"\x00" });
        assert!(matches!(authorized, Serve::Authorization(_)));
        Memory {
            table,
            sent: VecDeque::new(),
            stopping: Vec::new(),
        }
    }

    fn respond(&mut self, frame: ServerFrame<'_>) {
        self.sent.push_back(Owned::from(frame));
    }

    fn play_loop(&mut self, scope: u32, channel: u32, prompt: &str) {
        let Some(n) = prompt.strip_prefix("finish ") else {
            let payload = chunk("h");
            return self.respond(ServerFrame::ChannelResponse {
                scope,
                channel,
                payload: &payload,
            });
        };
        for i in 0..n.parse::<u8>().expect("a count") {
            let payload = chunk(&i.to_string());
            self.respond(ServerFrame::ChannelResponse {
                scope,
                channel,
                payload: &payload,
            });
        }
        if self.table.finish_channel(scope, channel).is_some() {
            self.respond(ServerFrame::ChannelResponseFinish { scope, channel });
        }
    }

    fn stop(&mut self, scope: u32) {
        let Some(finished) = self.table.finish_scope(scope) else {
            return;
        };
        for ended in finished.channels {
            let payload = [&[ERROR][..], br#"{"kind":"run","error":"stopped"}"#].concat();
            self.respond(ServerFrame::ChannelResponse {
                scope,
                channel: ended.channel,
                payload: &payload,
            });
            self.respond(ServerFrame::ChannelResponseFinish {
                scope,
                channel: ended.channel,
            });
        }
        self.respond(ServerFrame::ResponseFinish { scope });
    }
}

impl Wire for Memory {
    async fn send(&mut self, bytes: Vec<u8>) {
        let Ok(frame) = ClientFrame::decode(&bytes) else {
            return;
        };
        match self.table.received(frame) {
            Serve::Run { scope, .. } => {
                let number = scope.scope();
                scope.open(());
                self.respond(ServerFrame::Response {
                    scope: number,
                    payload: b"\x00{\"id\":\"memory\"}",
                });
            }
            Serve::RunLoop { channel, request } => {
                let (scope, number) = (channel.scope(), channel.channel());
                channel.open(());
                self.play_loop(scope, number, request.prompt());
            }
            Serve::Stop { scope, .. } => {
                if !self.stopping.contains(&scope) {
                    self.stopping.push(scope);
                }
            }
            Serve::BareFinish { frame, .. } => self.respond(frame),
            Serve::Violation(why) => panic!("the model sends no violation: {why}"),
            Serve::Disregarded(_)
            | Serve::Authorization(_)
            | Serve::ChannelResponse { .. }
            | Serve::ChannelFinished(_) => {}
        }
    }

    async fn next_frame(&mut self) -> Option<Owned> {
        for scope in std::mem::take(&mut self.stopping) {
            self.stop(scope);
        }
        self.sent.pop_front()
    }
}

/// Plays the actions against the table in memory: nothing in it waits, so
/// one poll runs the whole case.
fn play_in_memory(actions: Vec<Action>) {
    let mut memory = Memory::authorized();
    {
        let mut case = pin!(play(&mut memory, actions));
        let Poll::Ready(()) = case.as_mut().poll(&mut Context::from_waker(Waker::noop())) else {
            panic!("the in-memory connection never waits")
        };
    }
    assert!(
        memory.sent.is_empty(),
        "nothing left unread: {:?}",
        memory.sent
    );
    assert!(memory.stopping.is_empty(), "every stopped run ended");
}

fn loop_payload(prompt: &str) -> Vec<u8> {
    let mut payload = vec![5];
    payload.extend_from_slice(serde_json::json!({"prompt": prompt}).to_string().as_bytes());
    payload
}

/// Sends the probe and checks that its bare finish is the very next frame.
async fn probe(raw: &mut impl Wire, context: &str) {
    raw.send_frame(&ClientFrame::Request {
        scope: PROBE_SCOPE,
        payload: &[77],
    })
    .await;
    let next = raw.next_frame().await;
    assert_eq!(
        next,
        Some(Owned::ResponseFinish { scope: PROBE_SCOPE }),
        "after {context}"
    );
}

/// Reads frames until the scope's finish and checks the run's ending: each
/// hanging loop gets one error and one finish, and then the scope finishes.
async fn expect_run_end(raw: &mut impl Wire, scope: u32, hanging: &BTreeSet<u32>) {
    expect_run_end_racing(raw, scope, hanging, None).await;
}

/// The same, with a finishing loop of `n` chunks on `channel` racing the
/// stop: its chunks come in order, a prefix of the `n`, then its finish —
/// after an error unless all `n` came (it may be cut even then).
async fn expect_run_end_racing(
    raw: &mut impl Wire,
    scope: u32,
    hanging: &BTreeSet<u32>,
    racing: Option<(u32, u8)>,
) {
    let mut errors = BTreeSet::new();
    let mut finishes = BTreeSet::new();
    let mut racing_chunks = 0u8;
    let mut racing_error = false;
    let mut racing_finished = false;
    loop {
        match raw.next_frame().await {
            Some(Owned::ChannelResponse {
                scope: s,
                channel,
                payload,
            }) if s == scope && racing.is_some_and(|(c, _)| c == channel) => {
                assert!(!racing_finished && !racing_error, "nothing after the end");
                let n = racing.map_or(0, |(_, n)| n);
                if payload[0] == 1 {
                    racing_error = true;
                } else {
                    assert!(racing_chunks < n, "no more chunks than the loop has");
                    assert_eq!(payload, chunk(&racing_chunks.to_string()), "in order");
                    racing_chunks += 1;
                }
            }
            Some(Owned::ChannelResponseFinish { scope: s, channel })
                if s == scope && racing.is_some_and(|(c, _)| c == channel) =>
            {
                assert!(!racing_finished, "one finish");
                let n = racing.map_or(0, |(_, n)| n);
                assert!(
                    racing_error || racing_chunks == n,
                    "a loop cut short ends with an error, never a finish alone"
                );
                racing_finished = true;
            }
            Some(Owned::ChannelResponse {
                scope: s,
                channel,
                payload,
            }) if s == scope => {
                assert_eq!(payload[0], 1, "a hanging loop ends with an error");
                assert!(
                    !finishes.contains(&channel),
                    "nothing after a channel's finish"
                );
                assert!(errors.insert(channel), "one error per loop");
            }
            Some(Owned::ChannelResponseFinish { scope: s, channel }) if s == scope => {
                assert!(
                    errors.contains(&channel),
                    "the error comes before the finish"
                );
                assert!(finishes.insert(channel), "one finish per loop");
            }
            Some(Owned::ResponseFinish { scope: s }) if s == scope => break,
            other => panic!("while scope {scope} ends: unexpected {other:?}"),
        }
    }
    assert_eq!(&errors, hanging);
    assert_eq!(&finishes, hanging);
    if racing.is_some() {
        assert!(racing_finished, "the racing loop finishes before its scope");
    }
}

async fn play(raw: &mut impl Wire, actions: Vec<Action>) {
    let mut model = Model::default();
    for action in &actions {
        let context = format!("{action:?} with {model:?}");
        match action.clone() {
            Action::OpenRun(scope) => match model.scopes.entry(scope) {
                std::collections::btree_map::Entry::Occupied(_) => {
                    let payload = run_request_payload();
                    raw.send_frame(&ClientFrame::Request {
                        scope,
                        payload: &payload,
                    })
                    .await;
                    probe(raw, &context).await;
                }
                std::collections::btree_map::Entry::Vacant(vacant) => {
                    raw.open_run(scope).await;
                    vacant.insert(BTreeMap::new());
                }
            },
            Action::UnservedEndpoint(scope, tag) => {
                raw.send_frame(&ClientFrame::Request {
                    scope,
                    payload: &[tag, 1, 2],
                })
                .await;
                if model.scopes.contains_key(&scope) {
                    probe(raw, &context).await;
                } else {
                    assert_eq!(
                        raw.next_frame().await,
                        Some(Owned::ResponseFinish { scope }),
                        "{context}"
                    );
                }
            }
            Action::UndecodableRequest(scope) => {
                raw.send_frame(&ClientFrame::Request {
                    scope,
                    payload: b"\x00{\"image\":",
                })
                .await;
                if model.scopes.contains_key(&scope) {
                    probe(raw, &context).await;
                } else {
                    assert_eq!(
                        raw.next_frame().await,
                        Some(Owned::ResponseFinish { scope }),
                        "{context}"
                    );
                }
            }
            Action::OpenLoop(scope, channel, finishing) => {
                let prompt = finishing.map_or("hang".to_owned(), |n| format!("finish {n}"));
                raw.send_frame(&ClientFrame::ChannelRequest {
                    scope,
                    channel,
                    payload: &loop_payload(&prompt),
                })
                .await;
                let open = model
                    .scopes
                    .get(&scope)
                    .map(|channels| channels.contains_key(&channel));
                match (open, finishing) {
                    (None | Some(true), _) => probe(raw, &context).await,
                    (Some(false), Some(n)) => {
                        for i in 0..n {
                            let expected = chunk(&i.to_string());
                            assert_eq!(
                                raw.next_frame().await,
                                Some(Owned::ChannelResponse {
                                    scope,
                                    channel,
                                    payload: expected
                                }),
                                "{context}"
                            );
                        }
                        assert_eq!(
                            raw.next_frame().await,
                            Some(Owned::ChannelResponseFinish { scope, channel }),
                            "{context}"
                        );
                    }
                    (Some(false), None) => {
                        assert_eq!(
                            raw.next_frame().await,
                            Some(Owned::ChannelResponse {
                                scope,
                                channel,
                                payload: chunk("h")
                            }),
                            "{context}"
                        );
                        model.scopes.entry(scope).or_default().insert(channel, true);
                    }
                }
            }
            Action::UnservedChannel(scope, channel, _, _)
            | Action::UndecodableChannel(scope, channel) => {
                let payload = match action {
                    Action::UnservedChannel(_, _, tag, false) => vec![*tag],
                    Action::UnservedChannel(_, _, tag, true) => {
                        [&[*tag][..], br#"{"prompt":"p","path":["a"]}"#].concat()
                    }
                    _ => b"\x05[".to_vec(),
                };
                raw.send_frame(&ClientFrame::ChannelRequest {
                    scope,
                    channel,
                    payload: &payload,
                })
                .await;
                let fresh = matches!(model.scopes.get(&scope), Some(channels) if !channels.contains_key(&channel));
                if fresh {
                    assert_eq!(
                        raw.next_frame().await,
                        Some(Owned::ChannelResponseFinish { scope, channel }),
                        "{context}"
                    );
                } else {
                    probe(raw, &context).await;
                }
            }
            Action::Stop(scope, channel, tail) => {
                let payload: &[u8] = if tail {
                    b"\x00\x05{\"prompt\":1}"
                } else {
                    &[0]
                };
                raw.send_frame(&ClientFrame::ChannelRequest {
                    scope,
                    channel,
                    payload,
                })
                .await;
                match model.scopes.get(&scope) {
                    Some(channels) if !channels.contains_key(&channel) => {
                        let hanging = hanging(channels);
                        expect_run_end(raw, scope, &hanging).await;
                        model.scopes.remove(&scope);
                    }
                    _ => probe(raw, &context).await,
                }
            }
            Action::StopRacingLoop(scope, channel, n) => {
                // The stop's number is outside the ones other actions use.
                let stop_channel = channel + CHANNELS;
                raw.send_frame(&ClientFrame::ChannelRequest {
                    scope,
                    channel,
                    payload: &loop_payload(&format!("finish {n}")),
                })
                .await;
                raw.send_frame(&ClientFrame::ChannelRequest {
                    scope,
                    channel: stop_channel,
                    payload: &[0],
                })
                .await;
                match model.scopes.get(&scope) {
                    Some(channels) => {
                        let hanging = hanging(channels);
                        // A loop asked for on a number in use is disregarded.
                        let racing = (!channels.contains_key(&channel)).then_some((channel, n));
                        expect_run_end_racing(raw, scope, &hanging, racing).await;
                        model.scopes.remove(&scope);
                    }
                    None => probe(raw, &context).await,
                }
            }
            Action::StopThenLoopOnIt(scope, channel) => {
                raw.send_frame(&ClientFrame::ChannelRequest {
                    scope,
                    channel,
                    payload: &[0],
                })
                .await;
                raw.send_frame(&ClientFrame::ChannelRequest {
                    scope,
                    channel,
                    payload: &loop_payload("finish 1"),
                })
                .await;
                match model.scopes.get(&scope) {
                    Some(channels) if !channels.contains_key(&channel) => {
                        let hanging = hanging(channels);
                        expect_run_end(raw, scope, &hanging).await;
                        model.scopes.remove(&scope);
                    }
                    Some(channels) if channels[&channel] => {
                        // The number is a hanging loop's: both disregarded.
                    }
                    _ => {}
                }
                probe(raw, &context).await;
            }
            Action::Malformed(bytes) => {
                raw.send(bytes).await;
                probe(raw, &context).await;
            }
            Action::ServerChannelResponse(scope, channel) => {
                raw.send_frame(&ClientFrame::ChannelResponse {
                    scope,
                    channel,
                    payload: b"\x00{}",
                })
                .await;
                raw.send_frame(&ClientFrame::ChannelResponseFinish { scope, channel })
                    .await;
                probe(raw, &context).await;
            }
        }
    }
    // Stop every run still open; then the connection must be quiet.
    let open: Vec<(u32, BTreeSet<u32>)> = model
        .scopes
        .iter()
        .map(|(s, channels)| (*s, hanging(channels)))
        .collect();
    for (scope, hanging) in open {
        let stop_channel = (0..)
            .find(|c| !model.scopes[&scope].contains_key(c))
            .expect("a free number");
        raw.send_frame(&ClientFrame::ChannelRequest {
            scope,
            channel: stop_channel,
            payload: &[0],
        })
        .await;
        expect_run_end(raw, scope, &hanging).await;
    }
    probe(raw, "the end").await;
}

/// Plays the actions against the real server, over a socket.
async fn play_on_socket(actions: Vec<Action>) {
    let mut raw = RawClient::authorized(&world().server.url(), "").await;
    play(&mut raw, actions).await;
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("RUNLOOP_MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
        max_shrink_iters: 256,
        .. ProptestConfig::default()
    })]

    #[test]
    fn the_server_answers_exactly_as_the_model_says(actions in prop::collection::vec(action(), 1..40)) {
        world().runtime.block_on(play_on_socket(actions));
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("RUNLOOP_MODEL_MEMORY_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000),
        max_shrink_iters: 1024,
        .. ProptestConfig::default()
    })]

    #[test]
    fn the_table_answers_exactly_as_the_model_says(actions in prop::collection::vec(action(), 1..40)) {
        play_in_memory(actions);
    }
}

#[test]
fn nothing_is_left_open_after_the_cases() {
    let world = world();
    world.runtime.block_on(async {
        play_on_socket(vec![Action::OpenRun(0), Action::OpenLoop(0, 0, None)]).await;
        eventually("every case's runs are gone", || {
            world.server.stats().scopes == 0
        })
        .await;
    });
}
