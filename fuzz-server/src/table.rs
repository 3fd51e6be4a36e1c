//! The table harness: the connection target's input, played in memory
//! against a server made of the connection table alone, and every frame it
//! sends checked by the same oracle.
//!
//! The whole-connection target spends most of each input on sockets, tasks
//! and a real agent; this one spends it on the rules. Everything the
//! server decides from a frame is the table's
//! ([`Table::received`](runloop_proto::connection::Table::received)): what
//! is disregarded, what opens, what gets a bare finish, what a stop does,
//! and when a number is free again. Around it, a run or a loop is a script
//! played at once, chosen as the demo agent would by the input's prompt or
//! agent value:
//!
//! ```text
//! run, agent "demo:refuse"            [1] error, finish           (refused)
//! run, any other agent                [0] {"id"}, then open
//! loop "…demo:refuse…", "…unknown"    [1] error, finish           (no loop)
//! loop "…demo:break…"                 chunk, [1] error, finish    (unfinished)
//! loop "…demo:pace…"                  chunk, then open until its run ends
//! loop, any other prompt              chunks, finish              (finished)
//! stop                                every open loop: [1] error, finish;
//!                                     then the scope's finish
//! ```
//!
//! Syncs mean nothing here: each message is played to its end before the
//! next. Racing is the whole-connection target's business; the rules are
//! this one's, at a few hundred thousand messages a second.

use runloop_proto::Decode;
use runloop_proto::agents_run::RunResponse;
use runloop_proto::connection::{Serve, Table, side};
use runloop_proto::frame::{self, ClientFrame, ServerFrame};
use runloop_proto::run_loop::{CHUNK, ERROR};
use runloop_proto::{Encode, ErrorKind, ErrorValue};

use super::{
    Asked, CREDENTIAL, LAST_STOP, NUMBERS, Played, Seen, authorizes, channel_request, check, count,
    messages, verdict,
};

/// A server made of a table: what it has sent, and whether it has ended
/// the connection.
struct Sim {
    table: Table<side::Server, (), ()>,
    authorized: bool,
    ended: bool,
    sent: Vec<Vec<u8>>,
}

impl Sim {
    fn new() -> Self {
        Sim {
            // The limits of the whole-connection target's server.
            table: Table::server(4, 3),
            authorized: false,
            ended: false,
            sent: Vec::new(),
        }
    }

    fn send(&mut self, frame: &ServerFrame<'_>) {
        self.sent.push(frame::to_message(frame));
    }

    fn respond(&mut self, scope: u32, channel: u32, tag: u8, json: &str) {
        let payload = [&[tag][..], json.as_bytes()].concat();
        self.send(&ServerFrame::ChannelResponse {
            scope,
            channel,
            payload: &payload,
        });
    }

    /// Ends the scope as a run ends: every open loop gets an error and its
    /// finish, then the scope's finish.
    fn finish_scope(&mut self, scope: u32) {
        let Some(finished) = self.table.finish_scope(scope) else {
            return;
        };
        for ended in finished.channels {
            self.respond(
                scope,
                ended.channel,
                ERROR,
                r#"{"kind":"run","error":"stopped"}"#,
            );
            self.send(&ServerFrame::ChannelResponseFinish {
                scope,
                channel: ended.channel,
            });
        }
        self.send(&ServerFrame::ResponseFinish { scope });
    }

    fn finish_channel(&mut self, scope: u32, channel: u32) {
        if self.table.finish_channel(scope, channel).is_some() {
            self.send(&ServerFrame::ChannelResponseFinish { scope, channel });
        }
    }

    /// One message from the client; what the server sends goes to `sent`.
    fn message(&mut self, message: &[u8]) {
        let Ok(frame) = ClientFrame::decode(message) else {
            // Before the authorization, no frame means a refusal.
            self.ended |= !self.authorized;
            return;
        };
        match self.table.received(frame) {
            Serve::Authorization(authorization) => {
                self.authorized = authorization.credential() == CREDENTIAL;
                self.ended |= !self.authorized;
            }
            Serve::Violation(_) => self.ended = true,
            Serve::Disregarded(_) => {}
            Serve::BareFinish { frame, .. } => self.send(&frame),
            Serve::Run { scope, request } => {
                let number = scope.scope();
                scope.open(());
                let response = if request.agent.get() == "\"demo:refuse\"" {
                    RunResponse::Error(ErrorValue::kind(ErrorKind::Agent, "registration refused"))
                } else {
                    RunResponse::Id(format!("run-{number}"))
                };
                let Ok(payload) = response.to_vec() else {
                    return;
                };
                self.send(&ServerFrame::Response {
                    scope: number,
                    payload: &payload,
                });
                if matches!(response, RunResponse::Error(_)) {
                    self.finish_scope(number);
                }
            }
            Serve::Stop { scope, .. } => self.finish_scope(scope),
            Serve::RunLoop { channel, request } => {
                let (scope, number) = (channel.scope(), channel.channel());
                channel.open(());
                self.play_loop(scope, number, request.prompt());
            }
            Serve::ChannelResponse { .. } | Serve::ChannelFinished(_) => {}
        }
    }

    /// A loop's script, as its prompt chooses.
    fn play_loop(&mut self, scope: u32, channel: u32, prompt: &str) {
        const TEXT: &str = r#"{"type":"assistant_text_content","text":"x"}"#;
        const FAILED: &str = r#"{"kind":"agent","error":"down"}"#;
        if prompt.contains("demo:refuse") || prompt.contains("demo:unknown") {
            self.respond(scope, channel, ERROR, FAILED);
        } else if prompt.contains("demo:break") {
            self.respond(scope, channel, CHUNK, TEXT);
            self.respond(scope, channel, ERROR, FAILED);
        } else if prompt.contains("demo:pace") {
            // Open until its run ends.
            return self.respond(scope, channel, CHUNK, TEXT);
        } else {
            for _ in 0..prompt.len() % 4 {
                self.respond(scope, channel, CHUNK, TEXT);
            }
        }
        self.finish_channel(scope, channel);
    }
}

/// Plays one input against a server made of the table, and checks what it
/// sent with the whole-connection target's oracle. Panics on a violation.
pub fn play(input: &[u8]) -> Played {
    let mut sim = Sim::new();
    let mut asked = Asked::default();
    let mut seen = Seen::default();
    let mut first = None;
    let deliver = |sim: &mut Sim, asked: &mut Asked, seen: &mut Seen, message: &[u8]| {
        count(asked, seen, message);
        sim.message(message);
        for frame in sim.sent.drain(..) {
            check(seen, asked, &frame);
            seen.frames.push(frame);
        }
    };
    for message in messages(input) {
        if sim.ended {
            break;
        }
        let Some(message) = message else {
            first.get_or_insert(false);
            continue;
        };
        first.get_or_insert_with(|| authorizes(&message));
        deliver(&mut sim, &mut asked, &mut seen, &message);
    }
    let authorized = first == Some(true);
    let stopped_all = authorized && !sim.ended;
    if stopped_all {
        for scope in 0..u32::from(NUMBERS) {
            let stop = channel_request(scope, LAST_STOP, &[0]);
            deliver(&mut sim, &mut asked, &mut seen, &stop);
        }
        assert_eq!(sim.table.open_scopes(), 0, "every stopped run finished");
    }
    verdict(&seen, authorized, stopped_all)
}
