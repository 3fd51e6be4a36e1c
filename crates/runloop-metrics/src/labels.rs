//! The closed sets of label values the counters are split by: one enum a
//! label, one variant a value, each exposed from the first scrape at zero
//! ([`Counts`](crate::Counts)). The server's first, then the proxy's; a
//! loop's outcome is both's.

use crate::label;

label! {
    /// Why a connection was closed at authorization (protocol §3).
    pub enum AuthorizationRefusal("reason") {
        /// A credential the server does not accept.
        Credential = "credential",
        /// A first frame that is not an acceptable authorization frame.
        Malformed = "malformed",
        /// No authorization within the grace period.
        Timeout = "timeout",
        /// More sent before the authorization than the bound allows.
        TooLarge = "too_large",
        /// More control frames (pings, pongs) than the budget allows.
        Flood = "flood",
        /// The credential's token was revoked by a reload while it was
        /// being checked.
        Revoked = "revoked",
    }
}

label! {
    /// Why the server closed an authorized connection for a wall of its
    /// own (protocol §12), not for the caller's words.
    pub enum ConnectionClosed("reason") {
        /// A half-sent message did not fit its tenant's memory budget or
        /// the server's.
        HalfSentMemory = "half_sent_memory",
        /// A half-sent message made no progress for `--message-idle-timeout`.
        MessageIdle = "message_idle",
        /// Its token or tenant was revoked by a reload, and
        /// `--revoked-grace` is over.
        Revoked = "revoked",
    }
}

label! {
    /// Why a connection was turned away as it was accepted, before its
    /// handshake.
    pub enum ClosedAtAccept("reason") {
        /// Its address held `--max-connections-per-address`.
        Address = "address",
        /// Its address held `--max-unauthorized-per-address` connections
        /// not yet authorized.
        UnauthorizedAddress = "unauthorized_address",
        /// `--max-unauthorized` connections were authorizing.
        Unauthorized = "unauthorized",
        /// Its address had spent its `--handshake-rate`.
        Rate = "rate",
    }
}

label! {
    /// Why a TLS connection did not get as far as its WebSocket handshake.
    pub enum TlsFailure("reason") {
        /// The caller spoke plain HTTP to the TLS port.
        Plaintext = "plaintext",
        /// The caller spoke neither TLS nor HTTP.
        NotTls = "not_tls",
        /// The handshake itself failed (no common version, a bad record…).
        Handshake = "handshake",
        /// No handshake within the handshake timeout.
        Timeout = "timeout",
        /// As many handshakes under way as connections allowed.
        Busy = "busy",
    }
}

label! {
    /// Why a run was refused: answered with an error instead of an id
    /// (protocol §5).
    pub enum RunRefusal("reason") {
        /// The request decoded but is not valid.
        Request = "request",
        /// An image or a mount this server will not run.
        Policy = "policy",
        /// Over a limit of runs: the runs at once (server-wide or per
        /// identity), a run's largest memory or disk, the memory budget.
        Budget = "budget",
        /// Its disk does not fit the free space of the filesystem that
        /// holds runs' disks, less what the runs admitted may still write.
        Disk = "disk",
        /// The connection's token or tenant was revoked by a reload.
        Revoked = "revoked",
        /// The container did not start.
        Runtime = "runtime",
        /// The agent's registration failed (the proxy or the agent program refused it, or the proxy could not be reached).
        Registration = "registration",
        /// The run was stopped, or its connection or the server ended, before its id.
        Abandoned = "abandoned",
        /// The server could not make an id.
        Server = "server",
    }
}

label! {
    /// Why a run that started (sent its id) ended.
    pub enum RunEnd("reason") {
        /// The caller stopped it.
        Stop = "stop",
        /// The container ended by itself.
        Container = "container",
        /// The caller's connection ended.
        Disconnect = "disconnect",
        /// The server shut down (or its drain deadline passed).
        Shutdown = "shutdown",
        /// Its connection's token or tenant was revoked by a reload, and
        /// the revocation grace is over.
        Revoked = "revoked",
    }
}

label! {
    /// How a run-loop channel ended, as the server sent it (protocol §7).
    pub enum LoopOutcome("outcome") {
        /// Chunks, then the finish.
        Finished = "finished",
        /// Chunks, the last a fatal notification, then the finish.
        Fatal = "fatal",
        /// Chunks, then an error: a partial result.
        Unfinished = "unfinished",
        /// An error and no chunk: no loop ran.
        NoLoop = "no_loop",
        /// The finish alone: not served.
        NotServed = "not_served",
    }
}

label! {
    /// What went wrong on a proxy's `/agent/run` path (protocol §12).
    pub enum ProxyFault("kind") {
        /// The path could not be opened.
        Unreachable = "unreachable",
        /// The run-loop request could not be sent on it.
        Send = "send",
        /// It ended without a clean close.
        AbruptEnd = "abrupt_end",
        /// The proxy sent an empty message or an unknown tag.
        Sequence = "sequence",
    }
}

label! {
    /// How a reload of the TLS certificate went.
    pub enum Reload("result") {
        /// The new files are served.
        Loaded = "loaded",
        /// They did not load; the old certificate is still served.
        Failed = "failed",
    }
}

impl LoopOutcome {
    /// How a loop ended, from what was sent on its channel: how many
    /// chunks, whether an error came last, and its last chunk's JSON (read
    /// only when the loop finished, to tell a fatal ending).
    pub fn of(chunks: u64, erred: bool, last: Option<&[u8]>) -> LoopOutcome {
        match (chunks, erred) {
            (0, true) => LoopOutcome::NoLoop,
            (0, false) => LoopOutcome::NotServed,
            (_, true) => LoopOutcome::Unfinished,
            (_, false) if last.is_some_and(super::is_fatal) => LoopOutcome::Fatal,
            (_, false) => LoopOutcome::Finished,
        }
    }
}

label! {
    /// How an `/agent/register` ask ended (protocol §10).
    pub enum Registration("result") {
        /// The agent program registered.
        Registered = "registered",
        /// The proxy refused it: a malformed ask, or a second registration.
        Refused = "refused",
        /// The agent program refused it or could not be reached.
        Failed = "failed",
    }
}

label! {
    /// Why the proxy refused an `/agent/run` ask without calling the agent
    /// program (protocol §10).
    pub enum ProxyLoop("reason") {
        /// The ask is not a run-loop request.
        Malformed = "malformed",
        /// No agent is registered, or a loop is already running.
        Busy = "busy",
    }
}

label! {
    /// What went wrong with the agent program during a loop (protocol §10).
    pub enum AgentFault("kind") {
        /// It did not answer `/run` with a `2xx` event stream: it could not
        /// be reached, or answered an error status or another content type.
        NoStream = "no_stream",
        /// Its event stream broke (or an event was over the size limit).
        StreamBroke = "stream_broke",
        /// Its body ended only with its connection (not delimited).
        Undelimited = "undelimited",
    }
}
