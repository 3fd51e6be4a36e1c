//! The server's side of the table: a client's frame in, what to do out, and
//! the finishes the server sends (protocol §2-§6, §12).
//!
//! ```text
//! authorization (first)          ──▶ Authorization: the credential is the server's to check
//! request, scope free            ──▶ limit reached         ──▶ BareFinish
//!                                    endpoint not served   ──▶ BareFinish
//!                                    request undecodable   ──▶ BareFinish
//!                                    containers::agents::run ──▶ Run (open it)
//! channel request, number free   ──▶ stop (tag 0)          ──▶ Stop (taken below the limit;
//!                                                              obeyed either way)
//!                                    run-loop (tag 5)      ──▶ limit reached: BareFinish,
//!                                                              else RunLoop (open it)
//!                                    other tag, undecodable ──▶ BareFinish
//! the rest                       ──▶ Disregarded, or a Violation that ends the connection
//! ```
//!
//! A number is freed here the moment the server is about to send its finish
//! ([`Table::finish_channel`], [`Table::finish_scope`]): a caller that holds
//! the table under one lock while it queues the finish can never see a
//! client reuse a number the table still holds.

use crate::agents_run::RunRequest;
use crate::authorization::Authorization;
use crate::channel::ChannelRequest;
use crate::codec::Decode;
use crate::endpoint::EndpointRequest;
use crate::frame::{ClientFrame, Role, ServerFrame};
use crate::run_loop::RunLoopRequest;

use super::side::Server;
use super::{
    Disregarded, Ended, Fault, Finished, FromClient, NewChannel, NewScope, NotServed, Table,
    Violation,
};

/// What a client's frame asks of the server.
#[derive(Debug)]
pub enum Serve<'t, 'f, S, C> {
    /// The connection's first frame. The server checks the credential and
    /// closes the connection without a frame if it does not accept it.
    Authorization(Authorization<'f>),
    /// A `containers::agents::run` request for a free scope.
    Run {
        /// The scope: [`NewScope::open`] it to serve the run.
        scope: NewScope<'t, S, C>,
        /// The request, decoded.
        request: Box<RunRequest>,
    },
    /// A stop on an open scope: its run is to end. The stop's number is
    /// taken until the scope's finish (below the channel limit: past it the
    /// stop is obeyed but not kept, so a flood of stops cannot grow the
    /// table).
    Stop {
        /// The scope.
        scope: u32,
        /// Its slot.
        slot: &'t mut S,
    },
    /// A run-loop request for a free channel number.
    RunLoop {
        /// The channel: [`NewChannel::open`] it to serve the loop.
        channel: NewChannel<'t, S, C>,
        /// The request; its JSON is the caller's bytes.
        request: RunLoopRequest<'f>,
    },
    /// Send `frame`, a bare finish: received, not served. Nothing is open.
    BareFinish {
        /// A response finish, or a channel response finish.
        frame: ServerFrame<'static>,
        /// Why.
        why: NotServed,
    },
    /// An answer on one of the server's own channels. (This project's
    /// server opens none, so none ever comes.)
    ChannelResponse {
        /// The scope.
        scope: u32,
        /// The server's channel number.
        channel: u32,
        /// Its slot.
        slot: &'t mut C,
        /// One piece of the answer.
        payload: &'f [u8],
    },
    /// The end of one of the server's own channels, now free.
    ChannelFinished(Ended<C>),
    /// Nothing to do (protocol §2).
    Disregarded(Disregarded),
    /// End the connection (protocol §3).
    Violation(Violation),
}

impl<S, C> Table<Server, S, C> {
    /// A server's table for a new connection, with its limits: scopes open
    /// at once, and channels open at once in one scope.
    pub fn server(max_scopes: usize, max_channels: usize) -> Self {
        Table::with_side(Server {
            max_scopes,
            max_channels,
        })
    }

    /// A frame the client sent.
    pub fn received<'t, 'f>(&'t mut self, frame: ClientFrame<'f>) -> Serve<'t, 'f, S, C> {
        let Server {
            max_scopes,
            max_channels,
        } = self.side;
        match self.client_frame(frame) {
            Ok(FromClient::Authorization(authorization)) => Serve::Authorization(authorization),
            Ok(FromClient::Request { scope, payload }) => request(scope, payload, max_scopes),
            Ok(FromClient::ChannelRequest { channel, payload }) => {
                channel_request(channel, payload, max_channels)
            }
            Ok(FromClient::ChannelResponse {
                scope,
                channel,
                slot,
                payload,
            }) => Serve::ChannelResponse {
                scope,
                channel,
                slot,
                payload,
            },
            Ok(FromClient::ChannelFinished(ended)) => Serve::ChannelFinished(ended),
            Err(Fault::Disregarded(why)) => Serve::Disregarded(why),
            Err(Fault::Violation(why)) => Serve::Violation(why),
        }
    }

    /// Whether the client's `channel` of `scope` is open: a response on it
    /// may go out.
    pub fn is_serving(&self, scope: u32, channel: u32) -> bool {
        self.is_channel_open(scope, Role::Client, channel)
    }

    /// The server is about to send the finish of the client's `channel` of
    /// `scope`: frees the number. `None` when it is not open (its scope has
    /// finished already, or it is a stop, which no finish answers): then the
    /// finish must not go out.
    pub fn finish_channel(&mut self, scope: u32, channel: u32) -> Option<C> {
        self.channel_finish(Role::Client, scope, channel)
            .ok()
            .map(|ended| ended.slot)
    }

    /// The server is about to send the finish of `scope`: frees it and every
    /// number in it. The channels it returns are still unanswered, and must
    /// each end (an error, then a channel finish) before the scope's finish.
    /// `None` when the scope is not open: then no finish goes out.
    pub fn finish_scope(&mut self, scope: u32) -> Option<Finished<S, C>> {
        self.finish(scope).ok()
    }
}

/// A request for a free scope number.
fn request<'t, 'f, S, C>(
    scope: NewScope<'t, S, C>,
    payload: &'f [u8],
    limit: usize,
) -> Serve<'t, 'f, S, C> {
    let number = scope.scope();
    let bare_finish = |why| Serve::BareFinish {
        frame: ServerFrame::ResponseFinish { scope: number },
        why,
    };
    if scope.open_scopes() >= limit {
        return bare_finish(NotServed::Scopes { limit });
    }
    match EndpointRequest::decode(payload) {
        Ok(EndpointRequest::AgentsRun(request)) => Serve::Run { scope, request },
        Ok(EndpointRequest::Unserved(tag)) => bare_finish(NotServed::Endpoint(tag)),
        Err(error) => bare_finish(NotServed::Request(error)),
    }
}

/// A channel request for a free number.
fn channel_request<'t, 'f, S, C>(
    channel: NewChannel<'t, S, C>,
    payload: &'f [u8],
    limit: usize,
) -> Serve<'t, 'f, S, C> {
    let (scope, number) = (channel.scope(), channel.channel());
    let bare_finish = |why| Serve::BareFinish {
        frame: ServerFrame::ChannelResponseFinish {
            scope,
            channel: number,
        },
        why,
    };
    match ChannelRequest::decode(payload) {
        Ok(ChannelRequest::Stop) => {
            let slot = if channel.open_channels() < limit {
                channel.stop()
            } else {
                channel.into_scope_slot()
            };
            Serve::Stop { scope, slot }
        }
        Ok(ChannelRequest::RunLoop(_)) if channel.open_channels() >= limit => {
            bare_finish(NotServed::Channels { limit })
        }
        Ok(ChannelRequest::RunLoop(request)) => Serve::RunLoop { channel, request },
        Ok(ChannelRequest::Unserved(tag)) => bare_finish(NotServed::Channel(tag)),
        Err(error) => bare_finish(NotServed::ChannelRequest(error)),
    }
}
