//! The connection table: which scope and channel numbers are open on one
//! connection, and what each frame does to them (protocol §2, §3, §6).
//!
//! The rules of a connection are the same whichever party applies them, so
//! they are written once, here, and the server, the client and the observer
//! of a capture all keep their connection in a [`Table`]. A table holds the
//! state both parties agree on: every frame, in either direction, is applied
//! to it once — by the receiver when it arrives, by the sender as it goes
//! out — and changes it the same way. What differs between the sides is what
//! they decide on top of it ([`side`]): the server answers requests, the
//! client picks numbers and routes responses to its loops, the observer only
//! watches. Nothing here does I/O; each side's caller moves the bytes.
//!
//! ```text
//! authorization   none ──type 0 from the party that dialled──▶ authorized
//!                 any other frame first, a second type 0, a type 0 from
//!                 the party that accepted: a violation, the connection ends
//!
//! scope n         free ──request──▶ open ──response finish──▶ free
//!                          │ n open: disregarded     │ frees every channel of n
//!                          ▼                         ▼ (channels still open end with it)
//!                  (server) answered at once with a bare finish: never open
//!
//! channel c of    free ──channel request from o──▶ open ──channel finish from o's peer──▶ free
//! opener o in n,           │ (o, c) open: disregarded
//! while n is open          ▼ stop (client channel tag 0): taken until n's finish,
//!                            and nothing answers it — a response or finish on it
//!                            is disregarded
//!
//! any frame naming a scope, or a channel, that is not open: disregarded
//! ```
//!
//! Channel numbers belong to their opener: the client's channel 7 and the
//! server's channel 7 in one scope are two channels, and a frame's direction
//! says which one it names (a channel request names the sender's own, a
//! channel response or finish the receiver's). Every reason a frame is
//! disregarded, and every reason one ends the connection, is a value
//! ([`Disregarded`], [`Violation`]), so a log line, a counter and a capture's
//! report say the same thing.
//!
//! Each open scope and channel carries a slot of the caller's type (`S`,
//! `C`): the server keeps a run's stop and orders there, the client a loop's
//! queue, the observer a loop's [`Reader`](crate::run_loop::Reader). A
//! request for a free number is handed back as a [`NewScope`] or a
//! [`NewChannel`], which opens it with the caller's slot, so a number is
//! taken exactly when the caller has what the number stands for.
//!
//! Channels end in the order they were opened, whatever ends them (a
//! scope's finish, the end of the connection), so an ending is the same
//! every time the same frames are applied.

mod client;
mod reason;
mod server;
pub mod side;

use std::collections::{HashMap, HashSet};

pub use client::Route;
pub use reason::{Disregarded, Fault, NotServed, Violation};
pub use server::Serve;

use crate::authorization::Authorization;
use crate::codec::Decode;
use crate::frame::{ClientFrame, FrameType, Role, ServerFrame};

use self::side::Side;

/// The scopes and channels open on one connection, as the side `P` keeps
/// them, with a slot `S` per open scope and `C` per open channel.
#[derive(Debug)]
pub struct Table<P: Side, S, C> {
    side: P,
    /// The party that sent the authorization, once it has.
    connector: Option<Role>,
    scopes: HashMap<u32, Scope<S, C>>,
    /// Channels opened so far: the order channels end in.
    opened: u64,
}

/// An open scope.
#[derive(Debug)]
struct Scope<S, C> {
    slot: S,
    /// Open channels, stops aside, by opener and number, with their order.
    channels: HashMap<(Role, u32), (u64, C)>,
    /// Open stop channels (a client's numbers): freed with the scope.
    stops: HashSet<u32>,
    /// Where the local side looks for its next free channel number.
    next_channel: u32,
}

impl<S, C> Scope<S, C> {
    fn new(slot: S) -> Self {
        Scope {
            slot,
            channels: HashMap::new(),
            stops: HashSet::new(),
            next_channel: 0,
        }
    }

    fn is_taken(&self, opener: Role, channel: u32) -> bool {
        self.channels.contains_key(&(opener, channel))
            || (opener == Role::Client && self.stops.contains(&channel))
    }

    fn len(&self) -> usize {
        self.channels.len() + self.stops.len()
    }
}

/// A channel that ended, with the slot it was opened with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended<C> {
    /// The scope it lived in.
    pub scope: u32,
    /// Whose numbering `channel` is in.
    pub opener: Role,
    /// The channel number, free again.
    pub channel: u32,
    /// Its slot.
    pub slot: C,
}

/// A scope that finished: its slot, and the channels still open in it, in
/// the order they were opened. Stop channels are not among them: nothing
/// answers a stop, so nothing of one is left to end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished<S, C> {
    /// The scope number, free again.
    pub scope: u32,
    /// Its slot.
    pub slot: S,
    /// Channels that end with it.
    pub channels: Vec<Ended<C>>,
}

/// What was open when the connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending<S, C> {
    /// Every scope, by number.
    pub scopes: Vec<(u32, S)>,
    /// Every channel still open, stops aside, in the order they were opened.
    pub channels: Vec<Ended<C>>,
}

/// A request for a free scope number. [`open`](Self::open) takes the number;
/// dropping it leaves the number free (a bare finish answers it).
#[derive(Debug)]
#[must_use = "a new scope opens only with open()"]
pub struct NewScope<'t, S, C> {
    scopes: &'t mut HashMap<u32, Scope<S, C>>,
    scope: u32,
}

impl<'t, S, C> NewScope<'t, S, C> {
    /// The scope number asked for.
    pub fn scope(&self) -> u32 {
        self.scope
    }

    /// How many scopes are open on the connection, this one not counted.
    pub fn open_scopes(&self) -> usize {
        self.scopes.len()
    }

    /// Opens the scope with `slot`; its number is taken until its finish.
    /// Returns the slot, in place.
    pub fn open(self, slot: S) -> &'t mut S {
        &mut self
            .scopes
            .entry(self.scope)
            .or_insert(Scope::new(slot))
            .slot
    }
}

/// A channel request for a free number in an open scope.
/// [`open`](Self::open) or [`stop`](Self::stop) takes the number; dropping
/// it leaves the number free (a bare channel finish answers it).
#[derive(Debug)]
#[must_use = "a new channel opens only with open() or stop()"]
pub struct NewChannel<'t, S, C> {
    scope: u32,
    opener: Role,
    channel: u32,
    entry: &'t mut Scope<S, C>,
    opened: &'t mut u64,
}

impl<'t, S, C> NewChannel<'t, S, C> {
    /// The scope the channel is asked for in.
    pub fn scope(&self) -> u32 {
        self.scope
    }

    /// The channel number, in the opener's numbering.
    pub fn channel(&self) -> u32 {
        self.channel
    }

    /// Who asked for it.
    pub fn opener(&self) -> Role {
        self.opener
    }

    /// How many channels are open in the scope (stops included), this one
    /// not counted.
    pub fn open_channels(&self) -> usize {
        self.entry.len()
    }

    /// Opens the channel with `slot`, until its finish or its scope's.
    /// Returns the scope's slot.
    pub fn open(self, slot: C) -> &'t mut S {
        let order = *self.opened;
        *self.opened += 1;
        self.entry
            .channels
            .insert((self.opener, self.channel), (order, slot));
        &mut self.entry.slot
    }

    /// Takes the number for a stop, which nothing answers: it is freed with
    /// its scope. Returns the scope's slot.
    pub fn stop(self) -> &'t mut S {
        self.entry.stops.insert(self.channel);
        &mut self.entry.slot
    }

    /// Leaves the number free; returns the scope's slot.
    pub fn into_scope_slot(self) -> &'t mut S {
        &mut self.entry.slot
    }
}

/// What a client's frame did to a table, before a side decides anything
/// about it.
#[derive(Debug)]
pub enum FromClient<'t, 'f, S, C> {
    /// The connection's first frame, an authorization, its payload decoded.
    /// Whether the credential is accepted is not the table's to say.
    Authorization(Authorization<'f>),
    /// A request naming a free scope number.
    Request {
        /// The scope, to open or to answer at once.
        scope: NewScope<'t, S, C>,
        /// Endpoint tag and request.
        payload: &'f [u8],
    },
    /// A channel request naming one of the client's free numbers in an open
    /// scope.
    ChannelRequest {
        /// The channel, to open or to answer at once.
        channel: NewChannel<'t, S, C>,
        /// Channel tag and request.
        payload: &'f [u8],
    },
    /// A channel response on one of the server's open channels.
    ChannelResponse {
        /// The scope the channel lives in.
        scope: u32,
        /// The server's channel number.
        channel: u32,
        /// Its slot.
        slot: &'t mut C,
        /// One piece of its answer.
        payload: &'f [u8],
    },
    /// A channel response finish: one of the server's channels is free.
    ChannelFinished(Ended<C>),
}

/// What a server's frame did to a table, before a side decides anything
/// about it.
#[derive(Debug)]
pub enum FromServer<'t, 'f, S, C> {
    /// The connection's first frame, an authorization from a server that
    /// dialled, its payload decoded.
    Authorization(Authorization<'f>),
    /// A response on an open scope.
    Response {
        /// The scope.
        scope: u32,
        /// Its slot.
        slot: &'t mut S,
        /// One piece of its answer.
        payload: &'f [u8],
    },
    /// A response finish: the scope and every channel in it are free.
    Finished(Finished<S, C>),
    /// A channel request naming one of the server's free numbers in an open
    /// scope.
    ChannelRequest {
        /// The channel, to open or to answer at once.
        channel: NewChannel<'t, S, C>,
        /// Channel tag and request.
        payload: &'f [u8],
    },
    /// A channel response on one of the client's open channels.
    ChannelResponse {
        /// The scope the channel lives in.
        scope: u32,
        /// The client's channel number.
        channel: u32,
        /// Its slot.
        slot: &'t mut C,
        /// One piece of its answer.
        payload: &'f [u8],
    },
    /// A channel response finish: one of the client's channels is free.
    ChannelFinished(Ended<C>),
}

impl<P: Side, S, C> Table<P, S, C> {
    fn with_side(side: P) -> Self {
        Table {
            side,
            connector: None,
            scopes: HashMap::new(),
            opened: 0,
        }
    }

    /// Whether `scope` is open.
    pub fn is_open(&self, scope: u32) -> bool {
        self.scopes.contains_key(&scope)
    }

    /// How many scopes are open.
    pub fn open_scopes(&self) -> usize {
        self.scopes.len()
    }

    /// The slot of an open scope.
    pub fn scope_mut(&mut self, scope: u32) -> Option<&mut S> {
        self.scopes.get_mut(&scope).map(|open| &mut open.slot)
    }

    /// Whether `opener`'s channel `channel` of `scope` is open, a stop
    /// included.
    pub fn is_channel_open(&self, scope: u32, opener: Role, channel: u32) -> bool {
        self.scopes
            .get(&scope)
            .is_some_and(|open| open.is_taken(opener, channel))
    }

    /// The connection is over: every scope and every channel ends.
    pub fn end(&mut self) -> Ending<S, C> {
        let mut scopes = Vec::with_capacity(self.scopes.len());
        let mut channels = Vec::new();
        for (scope, open) in self.scopes.drain() {
            channels.extend(ended(scope, open.channels));
            scopes.push((scope, open.slot));
        }
        scopes.sort_unstable_by_key(|&(scope, _)| scope);
        channels.sort_unstable_by_key(|&(order, _)| order);
        Ending {
            scopes,
            channels: channels.into_iter().map(|(_, ended)| ended).collect(),
        }
    }

    /// Applies a frame the client sent.
    fn client_frame<'t, 'f>(
        &'t mut self,
        frame: ClientFrame<'f>,
    ) -> Result<FromClient<'t, 'f, S, C>, Fault> {
        let sender = Role::Client;
        self.authorized(sender, frame.frame_type())?;
        Ok(match frame {
            ClientFrame::Authorization { payload } => {
                FromClient::Authorization(self.authorization(sender, payload)?)
            }
            ClientFrame::Request { scope, payload } => FromClient::Request {
                scope: self.request(scope)?,
                payload,
            },
            ClientFrame::ChannelRequest {
                scope,
                channel,
                payload,
            } => FromClient::ChannelRequest {
                channel: self.channel_request(sender, scope, channel)?,
                payload,
            },
            ClientFrame::ChannelResponse {
                scope,
                channel,
                payload,
            } => FromClient::ChannelResponse {
                scope,
                channel,
                slot: self.channel_response(Role::Server, scope, channel)?,
                payload,
            },
            ClientFrame::ChannelResponseFinish { scope, channel } => {
                FromClient::ChannelFinished(self.channel_finish(Role::Server, scope, channel)?)
            }
        })
    }

    /// Applies a frame the server sent.
    fn server_frame<'t, 'f>(
        &'t mut self,
        frame: ServerFrame<'f>,
    ) -> Result<FromServer<'t, 'f, S, C>, Fault> {
        let sender = Role::Server;
        self.authorized(sender, frame.frame_type())?;
        Ok(match frame {
            ServerFrame::Authorization { payload } => {
                FromServer::Authorization(self.authorization(sender, payload)?)
            }
            ServerFrame::Response { scope, payload } => FromServer::Response {
                scope,
                slot: self.response(scope)?,
                payload,
            },
            ServerFrame::ResponseFinish { scope } => FromServer::Finished(self.finish(scope)?),
            ServerFrame::ChannelRequest {
                scope,
                channel,
                payload,
            } => FromServer::ChannelRequest {
                channel: self.channel_request(sender, scope, channel)?,
                payload,
            },
            ServerFrame::ChannelResponse {
                scope,
                channel,
                payload,
            } => FromServer::ChannelResponse {
                scope,
                channel,
                slot: self.channel_response(Role::Client, scope, channel)?,
                payload,
            },
            ServerFrame::ChannelResponseFinish { scope, channel } => {
                FromServer::ChannelFinished(self.channel_finish(Role::Client, scope, channel)?)
            }
        })
    }

    /// Every frame but the first authorization comes after it (protocol §3).
    fn authorized(&self, sender: Role, frame_type: FrameType) -> Result<(), Violation> {
        match self.connector {
            None if frame_type != FrameType::Authorization => {
                Err(Violation::BeforeAuthorization { sender, frame_type })
            }
            _ => Ok(()),
        }
    }

    /// A type-0 frame from `sender`: the first frame of the connection, from
    /// the party that dialled, and only once (protocol §3). Its sender is the
    /// connector from then on, even when its payload is rejected.
    fn authorization<'f>(
        &mut self,
        sender: Role,
        payload: &'f [u8],
    ) -> Result<Authorization<'f>, Violation> {
        match self.connector {
            None => {
                self.connector = Some(sender);
                Authorization::decode(payload).map_err(Violation::Rejected)
            }
            Some(connector) if connector == sender => {
                Err(Violation::SecondAuthorization { sender })
            }
            Some(_) => Err(Violation::AuthorizationFromAcceptor { sender }),
        }
    }

    /// A request for `scope`: the number must be free.
    fn request(&mut self, scope: u32) -> Result<NewScope<'_, S, C>, Disregarded> {
        if self.scopes.contains_key(&scope) {
            return Err(Disregarded::ScopeOpen { scope });
        }
        Ok(NewScope {
            scopes: &mut self.scopes,
            scope,
        })
    }

    /// A response on `scope`: it must be open.
    fn response(&mut self, scope: u32) -> Result<&mut S, Disregarded> {
        self.scope_mut(scope).ok_or(Disregarded::ScopeNotOpen {
            frame_type: FrameType::Response,
            scope,
        })
    }

    /// A response finish for `scope`: frees it and every channel in it.
    fn finish(&mut self, scope: u32) -> Result<Finished<S, C>, Disregarded> {
        let open = self
            .scopes
            .remove(&scope)
            .ok_or(Disregarded::ScopeNotOpen {
                frame_type: FrameType::ResponseFinish,
                scope,
            })?;
        let mut channels: Vec<_> = ended(scope, open.channels).collect();
        channels.sort_unstable_by_key(|&(order, _)| order);
        Ok(Finished {
            scope,
            slot: open.slot,
            channels: channels.into_iter().map(|(_, ended)| ended).collect(),
        })
    }

    /// A channel request from `opener` for its `channel` of `scope`: the
    /// scope must be open and the number free in the opener's numbering.
    fn channel_request(
        &mut self,
        opener: Role,
        scope: u32,
        channel: u32,
    ) -> Result<NewChannel<'_, S, C>, Disregarded> {
        let entry = self
            .scopes
            .get_mut(&scope)
            .ok_or(Disregarded::ScopeNotOpen {
                frame_type: FrameType::ChannelRequest,
                scope,
            })?;
        if entry.is_taken(opener, channel) {
            return Err(Disregarded::ChannelOpen {
                opener,
                scope,
                channel,
            });
        }
        Ok(NewChannel {
            scope,
            opener,
            channel,
            entry,
            opened: &mut self.opened,
        })
    }

    /// The scope a channel response or finish names, or why not; and why
    /// not, should the channel not be open in it.
    fn channel_scope(
        &mut self,
        frame_type: FrameType,
        opener: Role,
        scope: u32,
        channel: u32,
    ) -> Result<(&mut Scope<S, C>, Disregarded), Disregarded> {
        let open = self
            .scopes
            .get_mut(&scope)
            .ok_or(Disregarded::ScopeNotOpen { frame_type, scope })?;
        let not_open = if opener == Role::Client && open.stops.contains(&channel) {
            Disregarded::StopAnswered {
                frame_type,
                scope,
                channel,
            }
        } else {
            Disregarded::ChannelNotOpen {
                frame_type,
                opener,
                scope,
                channel,
            }
        };
        Ok((open, not_open))
    }

    /// A channel response on `opener`'s `channel` of `scope`: it must be open.
    fn channel_response(
        &mut self,
        opener: Role,
        scope: u32,
        channel: u32,
    ) -> Result<&mut C, Disregarded> {
        let (open, not_open) =
            self.channel_scope(FrameType::ChannelResponse, opener, scope, channel)?;
        let (_, slot) = open.channels.get_mut(&(opener, channel)).ok_or(not_open)?;
        Ok(slot)
    }

    /// A channel response finish on `opener`'s `channel` of `scope`: it must
    /// be open, and it is free from now on.
    fn channel_finish(
        &mut self,
        opener: Role,
        scope: u32,
        channel: u32,
    ) -> Result<Ended<C>, Disregarded> {
        let (open, not_open) =
            self.channel_scope(FrameType::ChannelResponseFinish, opener, scope, channel)?;
        let (_, slot) = open.channels.remove(&(opener, channel)).ok_or(not_open)?;
        Ok(Ended {
            scope,
            opener,
            channel,
            slot,
        })
    }
}

impl<S, C> Table<side::Observer, S, C> {
    /// An observer's table for a connection whose first frame is still to
    /// come.
    pub fn observer() -> Self {
        Table::with_side(side::Observer)
    }

    /// A frame the client sent, applied as the server receives it.
    pub fn from_client<'t, 'f>(
        &'t mut self,
        frame: ClientFrame<'f>,
    ) -> Result<FromClient<'t, 'f, S, C>, Fault> {
        self.client_frame(frame)
    }

    /// A frame the server sent, applied as the client receives it.
    pub fn from_server<'t, 'f>(
        &'t mut self,
        frame: ServerFrame<'f>,
    ) -> Result<FromServer<'t, 'f, S, C>, Fault> {
        self.server_frame(frame)
    }
}

/// The channels of a scope that ends, stops left out, with their order.
fn ended<C>(
    scope: u32,
    channels: HashMap<(Role, u32), (u64, C)>,
) -> impl Iterator<Item = (u64, Ended<C>)> {
    channels
        .into_iter()
        .map(move |((opener, channel), (order, slot))| {
            (
                order,
                Ended {
                    scope,
                    opener,
                    channel,
                    slot,
                },
            )
        })
}

#[cfg(test)]
mod tests;

/// The first number from `start` on that `taken` does not claim, wrapping.
fn free_number(start: u32, taken: impl Fn(u32) -> bool) -> u32 {
    let mut n = start;
    while taken(n) {
        n = n.wrapping_add(1);
    }
    n
}
