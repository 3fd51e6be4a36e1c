//! Limits of a framed connection and of the server that serves them, with
//! the minimum below which each would make the server useless.
//!
//! Every limit bounds a resource, so a smaller value is a tighter bound;
//! but some values leave nothing to serve: a message limit that an
//! authorization frame does not fit refuses every caller, a scope limit of
//! zero serves no run, a queue of zero responses never relays a chunk. Such
//! a value is refused when the server is built ([`Limits::validate`],
//! `ServerConfig::validate`), with an error that names the limit, its value
//! and its minimum, instead of a server that starts and then turns
//! everyone away.
//!
//! The minimums are the least that lets the protocol work for an ordinary
//! caller, not recommendations:
//!
//! ```text
//! max_message_size              4096 bytes  an authorization frame with a bearer token or a
//!                                           JWT (usually under 2 KiB), a run request with
//!                                           its image reference and a small agent value,
//!                                           a prompt of a few KiB
//! max_scopes                    1           one run at a time
//! max_channels                  1           one loop at a time (a stop needs no place)
//! max_queued_responses          1           a chunk can be relayed at all
//! max_queued_bytes              4096 bytes  a chunk can be relayed at all (a larger one
//!                                           still goes, alone)
//! max_connection_queued_bytes   4096 bytes  the same, for the connection's loops together
//! max_connections               1           one caller at a time
//! authorization_grace           1 s         a caller across a slow network has a few
//!                                           round trips for the WebSocket handshake and
//!                                           its authorization
//! handshake_timeout             1 s         the same, for the handshake alone
//! max_authorization_size        4096 bytes  an authorization frame with its credential
//! message_idle_timeout          1 s         a message crossing a slow network
//! max_unauthorized_per_address  1           one caller authorizing at a time from each address
//! credential_failure_rate       1           a mistyped token can be tried again
//! tenant_cpu_weight             1           some share of the CPU for each tenant's runs
//! max_unauthorized              1           one caller authorizing at a time
//! max_connections_per_address   1           one caller from each address
//! max_connections_per_identity  1           one connection for each token
//! max_runs                      1           one run at a time, server-wide
//! max_runs_per_identity         1           one run at a time for each token
//! max_loops_per_identity        1           one loop at a time for each token
//! max_run_memory                16 MiB      an agent program with its proxy beside it
//! memory_budget                 16 MiB      the same, for all runs together
//! disk_budget                   16 MiB      an agent's image and scratch files, for all
//!                                           runs together
//! ```

use std::fmt;
use std::time::Duration;

use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

/// How much one connection may hold. All of them are configurable; each
/// has a minimum (see [`Limit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest WebSocket message (one frame), bytes. A larger message ends
    /// the connection with close code 1009: it is a resource bound, and the
    /// WebSocket layer cannot skip a message it has refused to buffer.
    pub max_message_size: usize,
    /// Open scopes per connection. A request past the limit gets a bare
    /// finish ("received, not served").
    pub max_scopes: usize,
    /// Open client channels per scope. A channel request past the limit
    /// gets a bare channel finish.
    pub max_channels: usize,
    /// Channel responses one channel may have queued for the socket before
    /// its producer waits.
    pub max_queued_responses: usize,
    /// Bytes of channel responses one channel may have queued for the
    /// socket before its producer waits (a response larger than this still
    /// goes, alone). The server's bound; a client does not queue responses
    /// for sending.
    pub max_queued_bytes: usize,
    /// Bytes of channel responses all channels of one connection together
    /// may have queued for the socket before their producers wait. The
    /// server's bound.
    pub max_connection_queued_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_size: 16 << 20,
            max_scopes: 256,
            max_channels: 64,
            max_queued_responses: 256,
            max_queued_bytes: 256 << 10,
            max_connection_queued_bytes: 16 << 20,
        }
    }
}

/// How much tungstenite reads from the socket at once. Its default
/// (128 KiB) is zero-filled before every read, which for a stream of small
/// chunks costs more than the read itself; a larger message simply takes
/// several reads.
pub const READ_BUFFER: usize = 16 << 10;

/// The most a WebSocket frame adds to its payload: a 14-byte header, and
/// room for a ping's answer.
const FRAME_OVERHEAD: usize = 14 + 131;

impl Limits {
    /// The WebSocket configuration these limits imply. What waits to be
    /// written is bounded too: a message that goes out is written whole,
    /// so the bound is one message past the write buffer; past it,
    /// tungstenite keeps only the latest answer to a ping, so a peer that
    /// pings and never reads grows nothing.
    pub fn websocket(&self) -> WebSocketConfig {
        let config = WebSocketConfig::default();
        let max_write_buffer = config
            .write_buffer_size
            .saturating_add(self.max_message_size)
            .saturating_add(FRAME_OVERHEAD);
        config
            .read_buffer_size(READ_BUFFER)
            .max_message_size(Some(self.max_message_size))
            .max_frame_size(Some(self.max_message_size))
            .max_write_buffer_size(max_write_buffer)
    }

    /// Whether every limit is at least its minimum; the first that is not
    /// is the error.
    pub fn validate(&self) -> Result<(), LimitError> {
        Limit::MaxMessageSize.check(self.max_message_size as u64)?;
        Limit::MaxScopes.check(self.max_scopes as u64)?;
        Limit::MaxChannels.check(self.max_channels as u64)?;
        Limit::MaxQueuedResponses.check(self.max_queued_responses as u64)?;
        Limit::MaxQueuedBytes.check(self.max_queued_bytes as u64)?;
        Limit::MaxConnectionQueuedBytes.check(self.max_connection_queued_bytes as u64)
    }
}

/// Declares [`Limit`] from one row per limit: its variant, the name of its
/// configuration field, the kind of its minimum and what a smaller value
/// would leave unserved. Its name, minimum, check and words are made from
/// the row, so a new limit is one row here (and its field).
macro_rules! limits {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, $kind:ident, $why:literal; )+) => {
        /// One configurable limit, named as its configuration field is.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Limit {
            $( $(#[$doc])* $variant, )+
        }

        impl Limit {
            /// Every limit, in the order they are declared.
            pub const ALL: &'static [Limit] = &[$(Limit::$variant,)+];

            /// The configuration field's name.
            pub fn name(self) -> &'static str {
                match self {
                    $( Limit::$variant => $name, )+
                }
            }

            /// What a smaller value would leave unserved.
            pub fn why(self) -> &'static str {
                match self {
                    $( Limit::$variant => $why, )+
                }
            }

            /// The kind of its minimum.
            fn kind(self) -> Minimum {
                match self {
                    $( Limit::$variant => Minimum::$kind, )+
                }
            }
        }
    };
}

/// The kinds of minimum a limit has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Minimum {
    /// [`Limit::MIN_COUNT`].
    Count,
    /// [`Limit::MIN_MESSAGE_SIZE`] bytes.
    Message,
    /// [`Limit::MIN_RUN_MEMORY`] bytes.
    Memory,
    /// [`Limit::MIN_AUTHORIZATION_GRACE`].
    Duration,
}

limits! {
    /// [`Limits::max_message_size`].
    MaxMessageSize = "max_message_size", Message,
        "a message must hold an authorization with its credential, a run request and a prompt";
    /// [`Limits::max_scopes`].
    MaxScopes = "max_scopes", Count, "no run could be served";
    /// [`Limits::max_channels`].
    MaxChannels = "max_channels", Count, "no loop could be served";
    /// [`Limits::max_queued_responses`].
    MaxQueuedResponses = "max_queued_responses", Count, "no response could be relayed";
    /// [`Limits::max_queued_bytes`].
    MaxQueuedBytes = "max_queued_bytes", Message,
        "responses would be relayed a few bytes at a time";
    /// [`Limits::max_connection_queued_bytes`].
    MaxConnectionQueuedBytes = "max_connection_queued_bytes", Message,
        "responses would be relayed a few bytes at a time";
    /// The server's `max_connections`.
    MaxConnections = "max_connections", Count, "every caller would be turned away";
    /// The server's `authorization_grace`.
    AuthorizationGrace = "authorization_grace", Duration,
        "a caller needs a few round trips to complete the WebSocket handshake and authorize";
    /// The server's `max_runs`.
    MaxRuns = "max_runs", Count, "no run could be served";
    /// The server's `max_runs_per_identity`.
    MaxRunsPerIdentity = "max_runs_per_identity", Count, "no run could be served";
    /// The server's `max_loops_per_identity`.
    MaxLoopsPerIdentity = "max_loops_per_identity", Count, "no loop could be served";
    /// The server's `max_run_memory`.
    MaxRunMemory = "max_run_memory", Memory, "an agent program with its proxy needs a few MiB";
    /// The server's `memory_budget`.
    MemoryBudget = "memory_budget", Memory, "an agent program with its proxy needs a few MiB";
    /// The server's `disk_budget`.
    DiskBudget = "disk_budget", Memory, "an agent's image and its scratch files need a few MiB";
    /// The server's `max_unauthorized`.
    MaxUnauthorized = "max_unauthorized", Count, "every caller would be turned away";
    /// The server's `max_connections_per_address`.
    MaxConnectionsPerAddress = "max_connections_per_address", Count,
        "every caller would be turned away";
    /// The server's `max_connections_per_identity`.
    MaxConnectionsPerIdentity = "max_connections_per_identity", Count,
        "every token holder would be turned away";
    /// The server's `handshake_timeout`.
    HandshakeTimeout = "handshake_timeout", Duration,
        "a caller needs a few round trips to complete the WebSocket handshake";
    /// The server's `max_authorization_size`.
    MaxAuthorizationSize = "max_authorization_size", Message,
        "an authorization frame must hold a credential such as a bearer token or a JWT";
    /// The server's `message_idle_timeout`.
    MessageIdleTimeout = "message_idle_timeout", Duration,
        "a message crossing a slow network makes progress every few round trips";
    /// The server's `max_unauthorized_per_address`.
    MaxUnauthorizedPerAddress = "max_unauthorized_per_address", Count,
        "every caller would be turned away";
    /// The server's `credential_failure_rate`.
    CredentialFailureRate = "credential_failure_rate", Count,
        "a caller who mistyped a token could never try again";
    /// The server's `tenant_cpu_weight`.
    TenantCpuWeight = "tenant_cpu_weight", Count, "a weight of zero is no share of the CPU";
}

impl Limit {
    /// The least [`Limits::max_message_size`] that serves an ordinary caller.
    pub const MIN_MESSAGE_SIZE: usize = 4096;
    /// The least count of scopes, channels, queued responses or connections.
    pub const MIN_COUNT: usize = 1;
    /// The least authorization grace.
    pub const MIN_AUTHORIZATION_GRACE: Duration = Duration::from_secs(1);
    /// The least `memory` a run may be allowed, alone or with every other.
    pub const MIN_RUN_MEMORY: u64 = 16 << 20;

    /// The minimum, as a person reads it.
    pub fn minimum(self) -> String {
        match self.kind() {
            Minimum::Message => format!("{} bytes", Limit::MIN_MESSAGE_SIZE),
            Minimum::Duration => format!("{:?}", Limit::MIN_AUTHORIZATION_GRACE),
            Minimum::Memory => format!("{} bytes", Limit::MIN_RUN_MEMORY),
            Minimum::Count => Limit::MIN_COUNT.to_string(),
        }
    }

    /// `Ok` when `value` (a size or a count) is at least the minimum.
    pub fn check(self, value: u64) -> Result<(), LimitError> {
        let (minimum, unit) = match self.kind() {
            Minimum::Message => (Limit::MIN_MESSAGE_SIZE as u64, " bytes"),
            Minimum::Memory => (Limit::MIN_RUN_MEMORY, " bytes"),
            Minimum::Count | Minimum::Duration => (Limit::MIN_COUNT as u64, ""),
        };
        if value >= minimum {
            return Ok(());
        }
        Err(LimitError {
            limit: self,
            value: format!("{value}{unit}"),
        })
    }

    /// `Ok` when the authorization grace `value` is at least the minimum.
    pub fn check_grace(value: Duration) -> Result<(), LimitError> {
        Limit::AuthorizationGrace.check_duration(value)
    }

    /// `Ok` when `value` (a grace or a timeout) is at least the minimum.
    pub fn check_duration(self, value: Duration) -> Result<(), LimitError> {
        if value >= Limit::MIN_AUTHORIZATION_GRACE {
            return Ok(());
        }
        Err(LimitError {
            limit: self,
            value: format!("{value:?}"),
        })
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A limit below its minimum: the configuration would serve nobody.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitError {
    /// Which limit.
    pub limit: Limit,
    /// Its value, as a person reads it (`8 bytes`, `0`, `50ms`).
    pub value: String,
}

impl LimitError {
    /// The error, with the limit called `name` (say, the command-line
    /// option that set it) instead of its field's name.
    pub fn named(&self, name: &str) -> String {
        format!(
            "{name} is {}, below its minimum of {}: {}",
            self.value,
            self.limit.minimum(),
            self.limit.why()
        )
    }
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.named(self.limit.name()))
    }
}

impl std::error::Error for LimitError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid() {
        assert_eq!(Limits::default().validate(), Ok(()));
    }

    /// The field of `limits` that `limit` names.
    fn field(limits: &mut Limits, limit: Limit) -> &mut usize {
        match limit {
            Limit::MaxMessageSize => &mut limits.max_message_size,
            Limit::MaxScopes => &mut limits.max_scopes,
            Limit::MaxChannels => &mut limits.max_channels,
            Limit::MaxQueuedResponses => &mut limits.max_queued_responses,
            Limit::MaxQueuedBytes => &mut limits.max_queued_bytes,
            Limit::MaxConnectionQueuedBytes => &mut limits.max_connection_queued_bytes,
            _ => unreachable!("the server's"),
        }
    }

    #[test]
    fn each_limit_is_refused_below_its_minimum_and_accepted_at_it() {
        for limit in [
            Limit::MaxMessageSize,
            Limit::MaxScopes,
            Limit::MaxChannels,
            Limit::MaxQueuedResponses,
            Limit::MaxQueuedBytes,
            Limit::MaxConnectionQueuedBytes,
        ] {
            let minimum = match limit {
                Limit::MaxMessageSize | Limit::MaxQueuedBytes | Limit::MaxConnectionQueuedBytes => {
                    Limit::MIN_MESSAGE_SIZE
                }
                _ => Limit::MIN_COUNT,
            };
            let mut limits = Limits::default();
            *field(&mut limits, limit) = minimum;
            assert_eq!(limits.validate(), Ok(()), "{limit} at its minimum");
            *field(&mut limits, limit) = minimum - 1;
            let error = limits.validate().expect_err("below the minimum");
            assert_eq!(error.limit, limit);
            *field(&mut limits, limit) = 0;
            assert_eq!(limits.validate().map_err(|e| e.limit), Err(limit));
        }
    }

    #[test]
    fn the_error_names_the_limit_its_value_and_its_minimum() {
        let limits = Limits {
            max_message_size: 8,
            ..Limits::default()
        };
        assert_eq!(
            limits.validate().map_err(|e| e.to_string()),
            Err(
                "max_message_size is 8 bytes, below its minimum of 4096 bytes: a message must \
                 hold an authorization with its credential, a run request and a prompt"
                    .to_owned()
            )
        );
        let grace = Limit::check_grace(Duration::from_millis(50)).expect_err("too short");
        assert_eq!(
            grace.to_string(),
            "authorization_grace is 50ms, below its minimum of 1s: a caller needs a few round \
             trips to complete the WebSocket handshake and authorize"
        );
        assert_eq!(Limit::check_grace(Duration::from_secs(1)), Ok(()));
    }
}
