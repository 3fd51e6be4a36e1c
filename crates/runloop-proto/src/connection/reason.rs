//! Reasons: why a frame is disregarded, why one ends the connection, and
//! why a request is answered with a bare finish.
//!
//! Each is a value rather than a log message, so the server's counter, the
//! client's debug line and the observer's report of a capture name the same
//! reason in the same words.

use crate::authorization::AuthorizationError;
use crate::channel::ChannelRequestError;
use crate::endpoint::EndpointRequestError;
use crate::frame::{FrameType, HeaderError, Role};

/// Why a frame is disregarded (protocol §2): the receiver does nothing with
/// it, answers nothing, and the connection goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Disregarded {
    /// Not a frame of the direction it came from.
    #[error(transparent)]
    Header(#[from] HeaderError),
    /// A request naming a scope that is still open.
    #[error("request for scope {scope}, which is already open: disregarded")]
    ScopeOpen {
        /// The scope.
        scope: u32,
    },
    /// A frame naming a scope that is not open.
    #[error("{} for scope {scope}, which is not open", .frame_type.name())]
    ScopeNotOpen {
        /// What the frame was.
        frame_type: FrameType,
        /// The scope it named.
        scope: u32,
    },
    /// A channel request naming one of its sender's still-open channels.
    #[error(
        "channel request for the {opener}'s channel {channel} of scope {scope}, which is already open: disregarded"
    )]
    ChannelOpen {
        /// Who sent the request.
        opener: Role,
        /// The scope.
        scope: u32,
        /// The channel number.
        channel: u32,
    },
    /// A channel response or finish naming a channel that is not open.
    #[error(
        "{} for the {opener}'s channel {channel} of scope {scope}, which is not open",
        .frame_type.name()
    )]
    ChannelNotOpen {
        /// What the frame was.
        frame_type: FrameType,
        /// Whose numbering the frame's channel is in.
        opener: Role,
        /// The scope.
        scope: u32,
        /// The channel number.
        channel: u32,
    },
    /// A channel response or finish on a stop channel, which nothing
    /// answers (protocol §6).
    #[error(
        "{} for the client's stop channel {channel} of scope {scope}, which nothing answers",
        .frame_type.name()
    )]
    StopAnswered {
        /// What the frame was.
        frame_type: FrameType,
        /// The scope.
        scope: u32,
        /// The stop channel's number.
        channel: u32,
    },
}

/// Why a frame ends the connection (protocol §3): it makes the identity the
/// connection is served under doubtful.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// A frame before the connection's authorization.
    #[error("the {sender}'s {} came before the authorization", .frame_type.name())]
    BeforeAuthorization {
        /// Who sent it.
        sender: Role,
        /// What it was.
        frame_type: FrameType,
    },
    /// The first authorization, with a payload that cannot be accepted.
    #[error("the authorization is rejected")]
    Rejected(#[source] AuthorizationError),
    /// An authorization after the first, from the party that dialled.
    #[error("a second authorization, from the {sender}")]
    SecondAuthorization {
        /// Who sent it.
        sender: Role,
    },
    /// An authorization from the party that accepted the connection.
    #[error("an authorization from the {sender}, which did not dial")]
    AuthorizationFromAcceptor {
        /// Who sent it.
        sender: Role,
    },
}

/// A frame the table did not apply: disregarded, or a violation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    /// Disregarded; the connection goes on.
    #[error(transparent)]
    Disregarded(#[from] Disregarded),
    /// The connection ends.
    #[error(transparent)]
    Violation(#[from] Violation),
}

/// Why a request or a channel request is answered with a bare finish:
/// received, not served (protocol §4, §6, §12).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NotServed {
    /// The connection has as many scopes open as it may.
    #[error("too many open scopes (the limit is {limit})")]
    Scopes {
        /// The limit.
        limit: usize,
    },
    /// The scope has as many channels open as it may.
    #[error("too many open channels in the scope (the limit is {limit})")]
    Channels {
        /// The limit.
        limit: usize,
    },
    /// An endpoint tag this side does not serve.
    #[error("endpoint tag {0} is not served")]
    Endpoint(u8),
    /// A request that does not decode.
    #[error("the request did not decode")]
    Request(#[source] EndpointRequestError),
    /// A client channel tag this side does not serve.
    #[error("channel tag {0} is not served")]
    Channel(u8),
    /// A channel request that does not decode.
    #[error("the channel request did not decode")]
    ChannelRequest(#[source] ChannelRequestError),
    /// A channel the server opened: the client serves none.
    #[error("the client serves no channels")]
    ServerChannel,
}

impl NotServed {
    /// Whether a limit, rather than the request, is why: worth a warning,
    /// since a caller within its limits never sees it.
    pub fn is_limit(&self) -> bool {
        matches!(self, NotServed::Scopes { .. } | NotServed::Channels { .. })
    }
}
