//! The table's rules, side by side, and a client's and a server's table kept
//! in step over a simulated connection.

use std::collections::{BTreeSet, VecDeque};

use proptest::prelude::*;

use super::side::{Client, Observer, Server};
use super::*;
use crate::error_chain::Chain;
use crate::frame::HeaderError;

const RUN: &[u8] = b"\x00{\"image\":{\"server\":{\"name\":\"demo\",\"digest\":\"sha256:0000000000000000000000000000000000000000000000000000000000000000\"}},\"memory\":1,\"disk\":0,\"agent\":{}}";
const LOOP: &[u8] = b"\x05{\"prompt\":\"hi\"}";
const STOP: &[u8] = b"\x00";
const AUTH: &[u8] = b"\x00token";

fn authorized_server(max_scopes: usize, max_channels: usize) -> Table<Server, u32, u32> {
    let mut table = Table::server(max_scopes, max_channels);
    match table.received(ClientFrame::Authorization { payload: AUTH }) {
        Serve::Authorization(authorization) => assert_eq!(authorization.credential(), "token"),
        other => panic!("{other:?}"),
    }
    table
}

/// Opens `scope` on a server table with a run request; its slot is `scope`.
fn open_run(table: &mut Table<Server, u32, u32>, scope: u32) {
    match table.received(ClientFrame::Request {
        scope,
        payload: RUN,
    }) {
        Serve::Run { scope: new, .. } => {
            new.open(scope);
        }
        other => panic!("{other:?}"),
    }
}

fn channel_request(scope: u32, channel: u32, payload: &[u8]) -> ClientFrame<'_> {
    ClientFrame::ChannelRequest {
        scope,
        channel,
        payload,
    }
}

/// Opens a run-loop channel on a server table; its slot is `channel`.
fn open_loop(table: &mut Table<Server, u32, u32>, scope: u32, channel: u32) {
    match table.received(channel_request(scope, channel, LOOP)) {
        Serve::RunLoop {
            channel: new,
            request,
        } => {
            assert_eq!(request.prompt(), "hi");
            new.open(channel);
        }
        other => panic!("{other:?}"),
    }
}

fn disregarded<S: std::fmt::Debug, C: std::fmt::Debug>(serve: Serve<'_, '_, S, C>) -> String {
    match serve {
        Serve::Disregarded(why) => why.to_string(),
        other => panic!("not disregarded: {other:?}"),
    }
}

#[test]
fn authorization_comes_first_and_once() {
    let mut table: Table<Server, (), ()> = Table::server(8, 8);
    let Serve::Violation(why) = table.received(ClientFrame::Request {
        scope: 1,
        payload: RUN,
    }) else {
        panic!("a request before the authorization")
    };
    assert_eq!(
        why.to_string(),
        "the client's request came before the authorization"
    );
    assert!(matches!(
        table.received(ClientFrame::Authorization { payload: AUTH }),
        Serve::Authorization(_)
    ));
    let Serve::Violation(why) = table.received(ClientFrame::Authorization { payload: AUTH }) else {
        panic!("a second authorization")
    };
    assert_eq!(
        why,
        Violation::SecondAuthorization {
            sender: Role::Client
        }
    );
    assert_eq!(why.to_string(), "a second authorization, from the client");

    let mut rejected: Table<Server, (), ()> = Table::server(8, 8);
    let Serve::Violation(why) = rejected.received(ClientFrame::Authorization { payload: b"\x07" })
    else {
        panic!("an unknown mode")
    };
    assert_eq!(
        Chain(&why).to_string(),
        "the authorization is rejected: unknown authorization mode 7"
    );
    assert!(std::error::Error::source(&why).is_some());
    // The rejected one was still the first.
    assert!(matches!(
        rejected.received(ClientFrame::Authorization { payload: AUTH }),
        Serve::Violation(Violation::SecondAuthorization { .. })
    ));
}

#[test]
fn a_scope_number_is_taken_from_its_request_to_its_finish() {
    let mut table = authorized_server(8, 8);
    open_run(&mut table, 1);
    assert_eq!(
        disregarded(table.received(ClientFrame::Request {
            scope: 1,
            payload: RUN
        })),
        "request for scope 1, which is already open: disregarded"
    );
    assert!(table.is_open(1));
    let finished = table.finish_scope(1).expect("open");
    assert_eq!((finished.scope, finished.slot), (1, 1));
    assert!(!table.is_open(1));
    assert!(table.finish_scope(1).is_none(), "one finish");
    open_run(&mut table, 1);
}

#[test]
fn a_scope_finish_frees_its_channels_in_the_order_they_opened() {
    let mut table = authorized_server(8, 8);
    open_run(&mut table, 1);
    open_run(&mut table, 2);
    for channel in [5, 3, 9] {
        open_loop(&mut table, 1, channel);
    }
    open_loop(&mut table, 2, 3);
    assert!(matches!(
        table.received(channel_request(1, 4, STOP)),
        Serve::Stop { scope: 1, slot: 1 }
    ));
    assert!(table.finish_channel(1, 3).is_some());
    let finished = table.finish_scope(1).expect("open");
    let channels: Vec<u32> = finished.channels.iter().map(|c| c.channel).collect();
    assert_eq!(
        channels,
        [5, 9],
        "opening order; the stop is not among them"
    );
    // Scope 2 and its channel are untouched.
    assert!(table.is_serving(2, 3));
    // Every number of scope 1 is free again.
    open_run(&mut table, 1);
    for channel in [5, 3, 9, 4] {
        open_loop(&mut table, 1, channel);
    }
}

#[test]
fn channel_numbers_belong_to_their_opener() {
    let mut table: Table<Observer, (), &str> = Table::observer();
    assert!(matches!(
        table.from_client(ClientFrame::Authorization { payload: AUTH }),
        Ok(FromClient::Authorization(_))
    ));
    let Ok(FromClient::Request { scope, .. }) = table.from_client(ClientFrame::Request {
        scope: 1,
        payload: RUN,
    }) else {
        panic!("a request")
    };
    scope.open(());
    let Ok(FromClient::ChannelRequest { channel, .. }) =
        table.from_client(channel_request(1, 7, LOOP))
    else {
        panic!("the client's 7")
    };
    channel.open("client");
    let Ok(FromServer::ChannelRequest { channel, .. }) =
        table.from_server(ServerFrame::ChannelRequest {
            scope: 1,
            channel: 7,
            payload: b"\x09",
        })
    else {
        panic!("the server's 7")
    };
    channel.open("server");
    // The client answers the server's 7; the server answers the client's.
    let Ok(FromClient::ChannelFinished(ended)) =
        table.from_client(ClientFrame::ChannelResponseFinish {
            scope: 1,
            channel: 7,
        })
    else {
        panic!("the server's 7 ends")
    };
    assert_eq!((ended.opener, ended.slot), (Role::Server, "server"));
    let Ok(FromServer::ChannelResponse { slot, .. }) =
        table.from_server(ServerFrame::ChannelResponse {
            scope: 1,
            channel: 7,
            payload: b"\x00{}",
        })
    else {
        panic!("the client's 7 is still open")
    };
    assert_eq!(*slot, "client");
    assert_eq!(
        table
            .from_client(ClientFrame::ChannelResponse {
                scope: 1,
                channel: 7,
                payload: b"late"
            })
            .map(drop),
        Err(Fault::Disregarded(Disregarded::ChannelNotOpen {
            frame_type: FrameType::ChannelResponse,
            opener: Role::Server,
            scope: 1,
            channel: 7
        }))
    );
}

#[test]
fn a_stop_is_taken_until_its_scope_finishes_and_nothing_answers_it() {
    let mut table = authorized_server(8, 8);
    open_run(&mut table, 1);
    assert!(matches!(
        table.received(channel_request(1, 2, STOP)),
        Serve::Stop { .. }
    ));
    assert_eq!(
        disregarded(table.received(channel_request(1, 2, LOOP))),
        "channel request for the client's channel 2 of scope 1, which is already open: disregarded"
    );
    assert!(
        table.finish_channel(1, 2).is_none(),
        "no finish answers a stop"
    );
    let mut client: Table<Client, (), ()> = Table::client();
    let scope = client.open_scope(());
    let stop = client.open_stop(scope).expect("open");
    assert!(matches!(
        client.received(ServerFrame::ChannelResponseFinish {
            scope,
            channel: stop
        }),
        Route::Disregarded(Disregarded::StopAnswered { .. })
    ));
    assert!(client.is_channel_open(scope, Role::Client, stop));
    let Route::Finished(finished) = client.received(ServerFrame::ResponseFinish { scope }) else {
        panic!("the scope's finish")
    };
    assert!(finished.channels.is_empty());
    assert!(!client.is_channel_open(scope, Role::Client, stop));
}

#[test]
fn bare_finishes_open_nothing() {
    let mut table = authorized_server(1, 1);
    let cases: [(ClientFrame<'_>, &str); 2] = [
        (
            ClientFrame::Request {
                scope: 3,
                payload: b"\x07",
            },
            "endpoint tag 7 is not served",
        ),
        (
            ClientFrame::Request {
                scope: 3,
                payload: b"\x00{",
            },
            "the request did not decode: containers::agents::run request did not parse",
        ),
    ];
    for (frame, words) in cases {
        match table.received(frame) {
            Serve::BareFinish { frame, why } => {
                assert_eq!(frame, ServerFrame::ResponseFinish { scope: 3 });
                let said = Chain(&why).to_string();
                assert!(said.starts_with(words), "{said}");
                assert!(!why.is_limit());
            }
            other => panic!("{other:?}"),
        }
        assert!(!table.is_open(3));
    }
    open_run(&mut table, 1);
    match table.received(ClientFrame::Request {
        scope: 2,
        payload: RUN,
    }) {
        Serve::BareFinish { why, .. } => {
            assert_eq!(why.to_string(), "too many open scopes (the limit is 1)");
            assert!(why.is_limit());
        }
        other => panic!("{other:?}"),
    }
    for (payload, words) in [
        (&b"\x02{}"[..], "channel tag 2 is not served"),
        (
            b"",
            "the channel request did not decode: channel request is empty",
        ),
        (
            b"\x05{}",
            "the channel request did not decode: run-loop request did not parse",
        ),
    ] {
        match table.received(channel_request(1, 4, payload)) {
            Serve::BareFinish { frame, why } => {
                assert_eq!(
                    frame,
                    ServerFrame::ChannelResponseFinish {
                        scope: 1,
                        channel: 4
                    }
                );
                let said = Chain(&why).to_string();
                assert!(said.starts_with(words), "{said}");
            }
            other => panic!("{other:?}"),
        }
        assert!(!table.is_serving(1, 4));
    }
    open_loop(&mut table, 1, 4);
    match table.received(channel_request(1, 5, LOOP)) {
        Serve::BareFinish { why, .. } => assert!(why.is_limit()),
        other => panic!("{other:?}"),
    }
    // A stop past the limit is obeyed, not kept.
    assert!(matches!(
        table.received(channel_request(1, 5, STOP)),
        Serve::Stop { .. }
    ));
    assert!(!table.is_channel_open(1, Role::Client, 5));
}

#[test]
fn frames_naming_what_is_not_open() {
    let mut table = authorized_server(8, 8);
    assert_eq!(
        disregarded(table.received(channel_request(3, 1, LOOP))),
        "channel request for scope 3, which is not open"
    );
    open_run(&mut table, 3);
    assert_eq!(
        disregarded(table.received(ClientFrame::ChannelResponseFinish {
            scope: 3,
            channel: 1
        })),
        "channel response finish for the server's channel 1 of scope 3, which is not open"
    );
    let mut client: Table<Client, (), ()> = Table::client();
    for (frame, words) in [
        (
            ServerFrame::Response {
                scope: 0,
                payload: b"",
            },
            "response for scope 0, which is not open",
        ),
        (
            ServerFrame::ResponseFinish { scope: 0 },
            "response finish for scope 0, which is not open",
        ),
    ] {
        match client.received(frame) {
            Route::Disregarded(why) => assert_eq!(why.to_string(), words),
            other => panic!("{other:?}"),
        }
    }
    let scope = client.open_scope(());
    match client.received(ServerFrame::ChannelResponse {
        scope,
        channel: 0,
        payload: b"",
    }) {
        Route::Disregarded(why) => assert_eq!(
            why.to_string(),
            "channel response for the client's channel 0 of scope 0, which is not open"
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        client.received(ServerFrame::Authorization { payload: AUTH }),
        Route::Violation(Violation::AuthorizationFromAcceptor {
            sender: Role::Server
        })
    ));
    assert_eq!(
        Disregarded::from(HeaderError::Truncated { len: 3 }).to_string(),
        "frame is truncated: 3 bytes, the header alone is 9"
    );
}

#[test]
fn the_client_chooses_free_numbers_past_the_last_one() {
    let mut client: Table<Client, u8, u8> = Table::client();
    assert_eq!(client.open_scope(0), 0);
    assert_eq!(client.open_scope(1), 1);
    let Route::Finished(_) = client.received(ServerFrame::ResponseFinish { scope: 0 }) else {
        panic!("scope 0 ends")
    };
    assert_eq!(client.open_scope(2), 2, "not the number just freed");
    assert_eq!(client.open_channel(1, 9), Some(0));
    assert_eq!(client.open_stop(1), Some(1));
    assert_eq!(client.open_channel(1, 9), Some(2));
    assert_eq!(client.open_channel(7, 9), None, "scope 7 is not open");
    // The server opens a channel: the client serves none.
    match client.received(ServerFrame::ChannelRequest {
        scope: 1,
        channel: 0,
        payload: b"\x01",
    }) {
        Route::BareFinish { frame, why } => {
            assert_eq!(
                frame,
                ClientFrame::ChannelResponseFinish {
                    scope: 1,
                    channel: 0
                }
            );
            assert_eq!(why.to_string(), "the client serves no channels");
        }
        other => panic!("{other:?}"),
    }
    let ending = client.end();
    assert_eq!(ending.scopes, [(1, 1), (2, 2)]);
    let channels: Vec<u32> = ending.channels.iter().map(|c| c.channel).collect();
    assert_eq!(channels, [0, 2]);
    assert_eq!(client.open_scopes(), 0);
}

#[test]
fn free_numbers_skip_taken_ones_and_wrap() {
    assert_eq!(free_number(0, |_| false), 0);
    assert_eq!(free_number(5, |n| n == 5 || n == 6), 7);
    assert_eq!(free_number(u32::MAX, |n| n == u32::MAX), 0);
}

/// One step of a simulated connection.
#[derive(Debug, Clone)]
enum Op {
    /// The client asks for a run (`true`) or for an endpoint nobody serves.
    Request(bool),
    /// The client asks for a loop on the `n`th open scope.
    Loop(usize),
    /// The client stops the `n`th open scope.
    Stop(usize),
    /// The server finishes the `n`th channel it serves.
    FinishChannel(usize),
    /// The server finishes the `n`th scope it serves, if no stop is pending
    /// (a stopped scope always finishes; see `deliver`).
    FinishScope(usize),
    /// The next frame in flight, either way, arrives.
    Deliver(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => any::<bool>().prop_map(Op::Request),
        3 => (0usize..4).prop_map(Op::Loop),
        1 => (0usize..4).prop_map(Op::Stop),
        2 => (0usize..6).prop_map(Op::FinishChannel),
        1 => (0usize..4).prop_map(Op::FinishScope),
        6 => any::<bool>().prop_map(Op::Deliver),
    ]
}

/// A client table and a server table with frames in flight between them.
struct Wire {
    client: Table<Client, (), ()>,
    server: Table<Server, (), ()>,
    to_server: VecDeque<Vec<u8>>,
    to_client: VecDeque<Vec<u8>>,
    /// Scopes the server has been asked to stop and has not finished.
    stopping: BTreeSet<u32>,
}

impl Wire {
    fn new(max_scopes: usize, max_channels: usize) -> Self {
        let mut server = Table::server(max_scopes, max_channels);
        assert!(matches!(
            server.received(ClientFrame::Authorization { payload: AUTH }),
            Serve::Authorization(_)
        ));
        Wire {
            client: Table::client(),
            server,
            to_server: VecDeque::new(),
            to_client: VecDeque::new(),
            stopping: BTreeSet::new(),
        }
    }

    fn client_scopes(&self) -> Vec<u32> {
        let mut scopes: Vec<u32> = self.client.scopes.keys().copied().collect();
        scopes.sort_unstable();
        scopes
    }

    fn server_scopes(&self) -> Vec<u32> {
        let mut scopes: Vec<u32> = self.server.scopes.keys().copied().collect();
        scopes.sort_unstable();
        scopes
    }

    fn send_client(&mut self, frame: &ClientFrame<'_>) {
        self.to_server.push_back(crate::frame::to_message(frame));
    }

    fn send_server(&mut self, frame: &ServerFrame<'_>) {
        self.to_client.push_back(crate::frame::to_message(frame));
    }

    fn play(&mut self, op: Op) {
        match op {
            Op::Request(run) => {
                let scope = self.client.open_scope(());
                let payload: &[u8] = if run { RUN } else { b"\x09" };
                self.send_client(&ClientFrame::Request { scope, payload });
            }
            Op::Loop(n) | Op::Stop(n) => {
                let Some(&scope) = self.client_scopes().get(n) else {
                    return;
                };
                let (channel, payload) = if matches!(op, Op::Loop(_)) {
                    (self.client.open_channel(scope, ()), LOOP)
                } else {
                    (self.client.open_stop(scope), STOP)
                };
                let channel = channel.expect("an open scope");
                self.send_client(&channel_request(scope, channel, payload));
            }
            Op::FinishChannel(n) => {
                let mut open: Vec<(u32, u32)> = self
                    .server
                    .scopes
                    .iter()
                    .flat_map(|(s, open)| open.channels.keys().map(move |(_, c)| (*s, *c)))
                    .collect();
                open.sort_unstable();
                if let Some(&(scope, channel)) = open.get(n) {
                    assert!(self.server.finish_channel(scope, channel).is_some());
                    self.send_server(&ServerFrame::ChannelResponseFinish { scope, channel });
                }
            }
            Op::FinishScope(n) => {
                if let Some(&scope) = self.server_scopes().get(n) {
                    self.finish_scope(scope);
                }
            }
            Op::Deliver(to_server) => self.deliver(to_server),
        }
    }

    fn finish_scope(&mut self, scope: u32) {
        let finished = self.server.finish_scope(scope).expect("open");
        for ended in finished.channels {
            self.send_server(&ServerFrame::ChannelResponseFinish {
                scope,
                channel: ended.channel,
            });
        }
        self.send_server(&ServerFrame::ResponseFinish { scope });
        self.stopping.remove(&scope);
    }

    fn deliver(&mut self, to_server: bool) {
        if to_server {
            let Some(message) = self.to_server.pop_front() else {
                return;
            };
            let frame = ClientFrame::decode(&message).expect("a client frame");
            let mut answer = None;
            let mut stopped = None;
            match self.server.received(frame) {
                Serve::Run { scope, .. } => {
                    scope.open(());
                }
                Serve::RunLoop { channel, .. } => {
                    channel.open(());
                }
                Serve::Stop { scope, .. } => stopped = Some(scope),
                Serve::BareFinish { frame, .. } => answer = Some(frame),
                // A request on a scope whose finish is on its way.
                Serve::Disregarded(Disregarded::ScopeNotOpen {
                    frame_type: FrameType::ChannelRequest,
                    ..
                }) => {}
                other => panic!("the client's own frame was not served: {other:?}"),
            }
            if let Some(frame) = answer {
                self.send_server(&frame);
            }
            if let Some(scope) = stopped {
                self.stopping.insert(scope);
            }
        } else {
            let Some(message) = self.to_client.pop_front() else {
                return;
            };
            let frame = ServerFrame::decode(&message).expect("a server frame");
            match self.client.received(frame) {
                Route::Finished(_) | Route::ChannelFinished(_) => {}
                other => panic!("the server's own frame was not routed: {other:?}"),
            }
        }
    }

    /// Both tables hold the same numbers.
    fn agree(&self) {
        assert_eq!(self.client_scopes(), self.server_scopes());
        for scope in self.client_scopes() {
            let numbers = |channels: &HashMap<(Role, u32), (u64, ())>| {
                let mut numbers: Vec<u32> = channels.keys().map(|&(_, c)| c).collect();
                numbers.sort_unstable();
                numbers
            };
            let client = numbers(&self.client.scopes[&scope].channels);
            let server = numbers(&self.server.scopes[&scope].channels);
            assert_eq!(client, server, "channels of scope {scope}");
        }
    }
}

proptest! {
    /// Whatever the client asks and the server answers, in whatever order
    /// the frames cross, the two tables agree once every frame has arrived
    /// and every stopped run has finished; and the server's answers never
    /// name a number the client does not hold (the client routes every one).
    #[test]
    fn a_client_and_a_server_table_agree(ops in prop::collection::vec(op(), 0..120), max_scopes in 1usize..4, max_channels in 1usize..4) {
        let mut wire = Wire::new(max_scopes, max_channels);
        for op in ops {
            wire.play(op);
        }
        // Every frame arrives and every stopped run finishes.
        while !wire.to_server.is_empty() || !wire.to_client.is_empty() || !wire.stopping.is_empty() {
            wire.deliver(true);
            if let Some(&scope) = wire.stopping.iter().next() {
                wire.finish_scope(scope);
            }
            wire.deliver(false);
        }
        wire.agree();
        // The server ends everything; then both are empty.
        for scope in wire.server_scopes() {
            wire.finish_scope(scope);
        }
        while !wire.to_client.is_empty() {
            wire.deliver(false);
        }
        prop_assert!(wire.client.scopes.is_empty());
        prop_assert!(wire.server.scopes.is_empty());
    }

    /// Any frames at all, in either direction: an observer's table never
    /// panics, and a channel that ends, ends once.
    #[test]
    fn any_frames_apply_without_panic(frames in prop::collection::vec((any::<bool>(), 0u8..8, 0u32..3, 0u32..3, prop::collection::vec(any::<u8>(), 0..4)), 0..80)) {
        let mut table: Table<Observer, (), u64> = Table::observer();
        let authorized = table.from_client(ClientFrame::Authorization { payload: AUTH }).is_ok();
        prop_assert!(authorized);
        let mut opened = 0u64;
        let mut ended = BTreeSet::new();
        for (from_client, frame_type, scope, channel, payload) in frames {
            let mut message = vec![frame_type];
            message.extend_from_slice(&scope.to_be_bytes());
            message.extend_from_slice(&channel.to_be_bytes());
            message.extend_from_slice(&payload);
            let mut end = |slot: u64| -> Result<(), TestCaseError> {
                prop_assert!(ended.insert(slot), "ended twice");
                Ok(())
            };
            if from_client {
                let Ok(frame) = ClientFrame::decode(&message) else { continue };
                match table.from_client(frame) {
                    Ok(FromClient::Request { scope, .. }) => { scope.open(()); }
                    Ok(FromClient::ChannelRequest { channel, .. }) => { channel.open(opened); opened += 1; }
                    Ok(FromClient::ChannelFinished(e)) => end(e.slot)?,
                    _ => {}
                }
            } else {
                let Ok(frame) = ServerFrame::decode(&message) else { continue };
                match table.from_server(frame) {
                    Ok(FromServer::Finished(f)) => for e in f.channels { end(e.slot)? },
                    Ok(FromServer::ChannelRequest { channel, .. }) => { channel.open(opened); opened += 1; }
                    Ok(FromServer::ChannelFinished(e)) => end(e.slot)?,
                    _ => {}
                }
            }
        }
        for e in table.end().channels {
            prop_assert!(ended.insert(e.slot), "ended twice");
        }
        prop_assert_eq!(ended.len() as u64, opened, "every channel ends once");
    }
}
