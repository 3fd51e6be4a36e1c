//! Admission: which connections the server takes on, and how little one
//! costs it before it has authorized (protocol §12, issue 13).
//!
//! A connection that has not authorized is anyone's, so it must be cheap
//! and there must be few of them:
//!
//! ```text
//! accept ─▶ this address holds max_connections_per_address ─▶ closed at once (TCP)
//!        ─▶ max_unauthorized connections not yet authorized ─▶ 1013 with a reason, or closed
//!        ─▶ this address's handshake_rate spent (if set) ─▶ 1013 with a reason, or closed
//!        ─▶ handshake by handshake_timeout ─▶ authorization by the grace
//!             at most max_authorization_size (+ the HTTP upgrade) read
//!        ─▶ authorized: the tenant holds its max-connections
//!             ─▶ close code 1013 with a reason
//! ```
//!
//! Closed at once means the accepted socket is dropped: nothing of it is
//! read, and its descriptor is free again before the next accept. Until
//! it authorizes, a connection reads through [`Bounded`], which fails the
//! read that would take it past its allowance, so a caller that sends
//! megabytes before its credential costs the server no more than the
//! allowance, and a ping flood before authorization ends there too. Once
//! authorized, the configured message limit is the only bound.
//!
//! A tenant's max-connections is its quota or its fair share: half of
//! `max_connections` at most unless configured otherwise, as the roster
//! says ([`Roster::shares`]). With any credential accepted every caller is
//! the same tenant, and `max_connections` is its limit: the per-tenant
//! limit applies only to tenants of tokens.
//!
//! The [`Gate`] is the admission's part of the server's shared state: the
//! configuration, the counts of what connections hold under their own
//! lock, the handshake buckets, and the roster it asks for a tenant's
//! share. A connection's [`Admitted`] holds the gate, and nothing else of
//! the server.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::handshake_rate::HandshakeRate;
use super::identity::Identity;
use super::tenants::Roster;
use runloop_wire::limits::{Limit, LimitError};

/// How a server admits connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Connections not yet authorized, at once (those being turned away
    /// with 1013 included). One more is closed at once. At least one.
    pub max_unauthorized: usize,
    /// Connections from one IP address, authorized or not. One more is
    /// closed at once. At least one.
    pub max_connections_per_address: usize,
    /// Authorized connections of one token identity. One more is closed
    /// with close code 1013 and a reason. At least one.
    pub max_connections_per_identity: usize,
    /// How long the TCP connection and the WebSocket handshake may take.
    /// At least [`Limit::MIN_AUTHORIZATION_GRACE`].
    pub handshake_timeout: Duration,
    /// The largest message before authorization, bytes (protocol §12).
    /// At least [`Limit::MIN_MESSAGE_SIZE`].
    pub max_authorization_size: usize,
    /// New connections one address may open per second, a token bucket of
    /// as many refilled evenly; one more is turned away. 0: no rate
    /// (the default: behind a load balancer or a NAT every caller shares
    /// one address).
    pub handshake_rate: usize,
}

impl Default for Admission {
    /// 256 connections not yet authorized, 64 per address, 256 per
    /// identity, a 3 s handshake, 64 KiB before authorization and no
    /// handshake rate.
    fn default() -> Self {
        Admission {
            max_unauthorized: 256,
            max_connections_per_address: 64,
            max_connections_per_identity: 256,
            handshake_timeout: Duration::from_secs(3),
            max_authorization_size: 64 << 10,
            handshake_rate: 0,
        }
    }
}

impl Admission {
    /// Whether every limit is at least its minimum; the first that is not
    /// is the error.
    pub fn validate(&self) -> Result<(), LimitError> {
        Limit::MaxUnauthorized.check(self.max_unauthorized as u64)?;
        Limit::MaxConnectionsPerAddress.check(self.max_connections_per_address as u64)?;
        Limit::MaxConnectionsPerIdentity.check(self.max_connections_per_identity as u64)?;
        Limit::HandshakeTimeout.check_duration(self.handshake_timeout)?;
        Limit::MaxAuthorizationSize.check(self.max_authorization_size as u64)
    }

    /// What a connection may read before it authorizes: its largest
    /// authorization, the HTTP upgrade request before it, and one read of
    /// the WebSocket layer's buffer past it.
    fn allowance(&self) -> usize {
        self.max_authorization_size
            .saturating_add(UPGRADE_REQUEST)
            .saturating_add(runloop_wire::limits::READ_BUFFER)
    }
}

/// Room for the HTTP upgrade request: its request line and headers.
const UPGRADE_REQUEST: usize = 16 << 10;

/// Why a connection was closed at once when it was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TurnedAway {
    #[error("its address holds as many connections as one address may")]
    Address,
    #[error("as many connections as may be are not authorized yet")]
    Unauthorized,
    #[error("its address opens new connections faster than its handshake rate")]
    Rate,
}

/// What the connections of the server hold, by address and by identity.
#[derive(Debug, Default)]
struct Held {
    unauthorized: usize,
    addresses: HashMap<IpAddr, usize>,
    identities: HashMap<Identity, usize>,
}

/// The admission of a server: which connections it takes on, and what
/// they hold.
#[derive(Debug)]
pub(crate) struct Gate {
    admission: Admission,
    /// What connections hold, by address and identity.
    held: Mutex<Held>,
    /// New connections per address.
    rate: HandshakeRate,
    /// Whose share of connections an identity holds.
    tenants: Arc<Roster>,
}

impl Gate {
    /// The admission of `admission`, asking `tenants` for their shares.
    pub(crate) fn new(admission: Admission, tenants: Arc<Roster>) -> Gate {
        Gate {
            admission,
            held: Mutex::new(Held::default()),
            rate: HandshakeRate::new(admission.handshake_rate),
            tenants,
        }
    }

    /// Takes the places of a connection from `address` (`None` for one
    /// that came some other way than the listener), or says why not.
    pub(crate) fn admit(self: &Arc<Self>, address: Option<IpAddr>) -> Result<Admitted, TurnedAway> {
        let admission = &self.admission;
        let mut held = self.held();
        if let Some(address) = address
            && held.addresses.get(&address).copied().unwrap_or(0)
                >= admission.max_connections_per_address
        {
            return Err(TurnedAway::Address);
        }
        if held.unauthorized >= admission.max_unauthorized {
            return Err(TurnedAway::Unauthorized);
        }
        // Counted last: only a connection the counts would take spends
        // its address's bucket.
        if let Some(address) = address
            && !self.rate.allows(address)
        {
            return Err(TurnedAway::Rate);
        }
        held.unauthorized += 1;
        if let Some(address) = address {
            *held.addresses.entry(address).or_default() += 1;
        }
        drop(held);
        Ok(Admitted {
            gate: Arc::clone(self),
            address,
            unauthorized: true,
            identity: None,
            authorized: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Forgets the handshake buckets that are full again; the server calls
    /// it now and then.
    pub(crate) fn sweep(&self) {
        self.rate.sweep();
    }

    /// What the connections hold, locked.
    fn held(&self) -> MutexGuard<'_, Held> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A connection's places: its address's (while it lives), a place among
/// the connections not yet authorized (until it authorizes), and its
/// identity's (once authorized). Dropping it gives them back.
pub(crate) struct Admitted {
    gate: Arc<Gate>,
    address: Option<IpAddr>,
    unauthorized: bool,
    identity: Option<Identity>,
    /// Opens the connection's [`Bounded`] reads once it has authorized.
    authorized: Arc<AtomicBool>,
}

impl Admitted {
    /// The address it came from, if it came through the listener.
    pub(crate) fn address(&self) -> Option<IpAddr> {
        self.address
    }

    /// `io`, read through the allowance of a connection not yet authorized.
    pub(crate) fn bounded<S>(&self, io: S) -> Bounded<S> {
        Bounded {
            io,
            left: self.gate.admission.allowance(),
            authorized: Arc::clone(&self.authorized),
        }
    }

    /// The connection authorized as `identity`: its place among those not
    /// yet authorized is free, its reads are no longer bounded here, and
    /// it takes a place of its tenant — unless the tenant holds as many
    /// as it may, when its limit is the error.
    pub(crate) fn authorized(&mut self, identity: &Identity) -> Result<(), usize> {
        let limit = self
            .gate
            .tenants
            .shares(identity)
            .map(|shares| shares.max_connections);
        let mut held = self.gate.held();
        if self.unauthorized {
            held.unauthorized -= 1;
            self.unauthorized = false;
        }
        if let Some(limit) = limit {
            let count = held.identities.entry(identity.clone()).or_default();
            if *count >= limit {
                if *count == 0 {
                    held.identities.remove(identity);
                }
                return Err(limit);
            }
            *count += 1;
            self.identity = Some(identity.clone());
        }
        drop(held);
        self.authorized.store(true, Ordering::Release);
        Ok(())
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut held = self.gate.held();
        if self.unauthorized {
            held.unauthorized -= 1;
        }
        if let Some(address) = self.address {
            release(&mut held.addresses, &address);
        }
        if let Some(identity) = &self.identity {
            release(&mut held.identities, identity);
        }
    }
}

/// Gives one place of `key` back, forgetting it at zero so that the map
/// holds only what is held.
pub(crate) fn release<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: &K) {
    if let Some(count) = map.get_mut(key) {
        *count -= 1;
        if *count == 0 {
            map.remove(key);
        }
    }
}

/// A connection's byte stream, whose reads fail once they would take it
/// past its allowance before it has authorized.
pub(crate) struct Bounded<S> {
    io: S,
    left: usize,
    authorized: Arc<AtomicBool>,
}

/// The error of a read past the allowance.
#[derive(Debug, thiserror::Error)]
#[error("more was sent before authorization than the server reads")]
pub(crate) struct OverAllowance;

impl OverAllowance {
    /// Whether `error` is this one.
    pub(crate) fn is(error: &io::Error) -> bool {
        error
            .get_ref()
            .is_some_and(|inner| inner.is::<OverAllowance>())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Bounded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.authorized.load(Ordering::Acquire) {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        if self.left == 0 {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                OverAllowance,
            )));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        let count = buf.filled().len() - before;
        // What was read is the caller's to use only within the allowance;
        // the next read past it fails.
        self.left = self.left.saturating_sub(count);
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Bounded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::identity::Credentials;
    use crate::tenants::tests::roster;

    /// A gate of `admission` for callers of `credentials`, whose tenants
    /// hold two connections each.
    fn gate(admission: Admission, credentials: &Credentials) -> Arc<Gate> {
        Arc::new(Gate::new(admission, Arc::new(roster(credentials))))
    }

    fn address(n: u8) -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)))
    }

    #[test]
    fn an_address_holds_its_connections_up_to_its_limit_and_gets_them_back() {
        let admission = Admission {
            max_connections_per_address: 2,
            ..Admission::default()
        };
        let gate = gate(admission, &Credentials::Any);
        let first = gate.admit(address(1)).expect("the first");
        let second = gate.admit(address(1)).expect("the second");
        assert_eq!(gate.admit(address(1)).err(), Some(TurnedAway::Address));
        // Another address, and a connection of none, are not counted with it.
        let other = gate.admit(address(2)).expect("another address");
        let piped = gate.admit(None).expect("no address");
        drop(first);
        let again = gate.admit(address(1)).expect("its place is back");
        drop((second, other, piped, again));
        let held = gate.held();
        assert_eq!((held.unauthorized, held.addresses.len()), (0, 0));
    }

    #[test]
    fn connections_not_yet_authorized_are_bounded_together() {
        let admission = Admission {
            max_unauthorized: 2,
            ..Admission::default()
        };
        let gate = gate(admission, &Credentials::Any);
        let anyone = gate.tenants.accept("").expect("any credential");
        let mut first = gate.admit(address(1)).expect("the first");
        let _second = gate.admit(None).expect("the second");
        assert_eq!(gate.admit(address(3)).err(), Some(TurnedAway::Unauthorized));
        // Authorized, it gives its place among them back.
        first.authorized(&anyone).expect("not counted per identity");
        let _third = gate.admit(address(3)).expect("a place is free");
        assert_eq!(gate.admit(address(4)).err(), Some(TurnedAway::Unauthorized));
    }

    #[test]
    fn only_a_connection_the_counts_take_spends_its_addresss_rate() {
        let admission = Admission {
            max_connections_per_address: 1,
            handshake_rate: 2,
            ..Admission::default()
        };
        let gate = gate(admission, &Credentials::Any);
        let first = gate.admit(address(1)).expect("the first");
        // Over its address's count: turned away for that, its bucket kept.
        assert_eq!(gate.admit(address(1)).err(), Some(TurnedAway::Address));
        drop(first);
        let second = gate.admit(address(1)).expect("its bucket's second");
        drop(second);
    }

    #[test]
    fn a_tenant_holds_its_connections_up_to_its_share() {
        let gate = gate(
            Admission::default(),
            &Credentials::Tokens(vec!["a".into(), "b".into()]),
        );
        let accept = |token| gate.tenants.accept(token).expect("a token");
        let (alice, bob) = (accept("a"), accept("b"));
        let authorized = |identity: &Identity| {
            let mut admitted = gate.admit(address(1)).expect("admitted");
            admitted.authorized(identity).map(|()| admitted)
        };
        let first = authorized(&alice).expect("alice's first");
        let second = authorized(&alice).expect("alice's second");
        assert_eq!(authorized(&alice).err(), Some(2), "alice's share is two");
        let bobs = authorized(&bob).expect("bob's own share");
        drop(first);
        let again = authorized(&alice).expect("alice's place is back");
        drop((second, bobs, again));
        assert!(gate.held().identities.is_empty());
        // With any credential, identities are not counted.
        let any = self::gate(Admission::default(), &Credentials::Any);
        let anyone = any.tenants.accept("").expect("any");
        let held: Vec<Admitted> = (0..5)
            .map(|_| {
                let mut admitted = any.admit(None).expect("admitted");
                admitted.authorized(&anyone).expect("not counted");
                admitted
            })
            .collect();
        assert!(any.held().identities.is_empty());
        drop(held);
    }

    #[tokio::test]
    async fn reads_past_the_allowance_fail_until_authorized() {
        let (mut caller, server) = tokio::io::duplex(1 << 20);
        let authorized = Arc::new(AtomicBool::new(false));
        let mut bounded = Bounded {
            io: server,
            left: 100,
            authorized: Arc::clone(&authorized),
        };
        caller.write_all(&[7; 300]).await.expect("written");
        let mut buf = [0; 64];
        let mut read = 0;
        let error = loop {
            match bounded.read(&mut buf).await {
                Ok(n) => read += n,
                Err(error) => break error,
            }
        };
        assert!(OverAllowance::is(&error), "{error}");
        assert!((100..=128).contains(&read), "{read}");
        // Authorized, it reads on.
        authorized.store(true, Ordering::Release);
        assert!(bounded.read(&mut buf).await.expect("reads") > 0);
    }
}
