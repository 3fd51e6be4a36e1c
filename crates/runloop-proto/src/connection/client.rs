//! The client's side of the table: the numbers it chooses for its requests,
//! and a server's frame in, where it goes out (protocol §2, §3, §5, §6).
//!
//! ```text
//! open_scope(slot)          ──▶ the first free scope number from a cursor, taken
//! open_channel(scope, slot) ──▶ the first free channel number of the scope, taken
//! open_stop(scope)          ──▶ the same, taken until the scope's finish
//!
//! response                  ──▶ Response: to the scope's slot
//! response finish           ──▶ Finished: the scope and its channels, free
//! channel response          ──▶ ChannelResponse: to the channel's slot (a loop)
//! channel response finish   ──▶ ChannelFinished: the channel, free
//! channel request (server)  ──▶ BareFinish: the client serves no channels
//! the rest                  ──▶ Disregarded, or a Violation that ends the connection
//! ```
//!
//! Numbers are chosen from a cursor that moves past each one taken, so a
//! number just freed is not the next one used: a late frame of a channel
//! that ended cannot be read as a frame of the next one.

use crate::frame::{ClientFrame, Role, ServerFrame};

use super::side::Client;
use super::{
    Disregarded, Ended, Fault, Finished, FromServer, NotServed, Table, Violation, free_number,
};

/// Where a server's frame goes at the client.
#[derive(Debug)]
pub enum Route<'t, 'f, S, C> {
    /// A response on an open scope: its main stream.
    Response {
        /// The scope.
        scope: u32,
        /// Its slot.
        slot: &'t mut S,
        /// One piece of its answer.
        payload: &'f [u8],
    },
    /// The scope finished; it and its channels are free.
    Finished(Finished<S, C>),
    /// A channel response on one of the client's open channels.
    ChannelResponse {
        /// The scope.
        scope: u32,
        /// The channel.
        channel: u32,
        /// Its slot.
        slot: &'t mut C,
        /// One piece of its answer.
        payload: &'f [u8],
    },
    /// One of the client's channels finished; it is free.
    ChannelFinished(Ended<C>),
    /// Send `frame`, a bare channel finish: the server opened a channel, and
    /// the client serves none.
    BareFinish {
        /// The channel response finish.
        frame: ClientFrame<'static>,
        /// Why.
        why: NotServed,
    },
    /// Nothing to do (protocol §2).
    Disregarded(Disregarded),
    /// End the connection (protocol §3).
    Violation(Violation),
}

impl<S, C> Table<Client, S, C> {
    /// A client's table for a connection it dialled and has just authorized
    /// (its authorization is the first frame it sends).
    pub fn client() -> Self {
        let mut table = Table::with_side(Client::default());
        table.connector = Some(Role::Client);
        table
    }

    /// Takes a free scope number for a request the client is about to send.
    pub fn open_scope(&mut self, slot: S) -> u32 {
        let scope = free_number(self.side.next_scope, |n| self.scopes.contains_key(&n));
        self.side.next_scope = scope.wrapping_add(1);
        match self.request(scope) {
            Ok(new) => {
                new.open(slot);
            }
            Err(taken) => debug_assert!(false, "a free number was taken: {taken}"),
        }
        scope
    }

    /// Takes a free channel number of `scope` for a channel request the
    /// client is about to send; `None` when the scope is not open.
    pub fn open_channel(&mut self, scope: u32, slot: C) -> Option<u32> {
        let channel = self.free_channel(scope)?;
        if let Ok(new) = self.channel_request(Role::Client, scope, channel) {
            new.open(slot);
        }
        Some(channel)
    }

    /// Takes a free channel number of `scope` for a stop the client is about
    /// to send; `None` when the scope is not open.
    pub fn open_stop(&mut self, scope: u32) -> Option<u32> {
        let channel = self.free_channel(scope)?;
        if let Ok(new) = self.channel_request(Role::Client, scope, channel) {
            new.stop();
        }
        Some(channel)
    }

    /// A frame the server sent.
    pub fn received<'t, 'f>(&'t mut self, frame: ServerFrame<'f>) -> Route<'t, 'f, S, C> {
        match self.server_frame(frame) {
            // The client dialled: a server's authorization is never the first.
            Ok(FromServer::Authorization(_)) => {
                Route::Violation(Violation::AuthorizationFromAcceptor {
                    sender: Role::Server,
                })
            }
            Ok(FromServer::Response {
                scope,
                slot,
                payload,
            }) => Route::Response {
                scope,
                slot,
                payload,
            },
            Ok(FromServer::Finished(finished)) => Route::Finished(finished),
            Ok(FromServer::ChannelRequest { channel, .. }) => Route::BareFinish {
                frame: ClientFrame::ChannelResponseFinish {
                    scope: channel.scope(),
                    channel: channel.channel(),
                },
                why: NotServed::ServerChannel,
            },
            Ok(FromServer::ChannelResponse {
                scope,
                channel,
                slot,
                payload,
            }) => Route::ChannelResponse {
                scope,
                channel,
                slot,
                payload,
            },
            Ok(FromServer::ChannelFinished(ended)) => Route::ChannelFinished(ended),
            Err(Fault::Disregarded(why)) => Route::Disregarded(why),
            Err(Fault::Violation(why)) => Route::Violation(why),
        }
    }

    /// The first free channel number of `scope` from its cursor, and the
    /// cursor moved past it.
    fn free_channel(&mut self, scope: u32) -> Option<u32> {
        let open = self.scopes.get_mut(&scope)?;
        let channel = free_number(open.next_channel, |n| open.is_taken(Role::Client, n));
        open.next_channel = channel.wrapping_add(1);
        Some(channel)
    }
}
