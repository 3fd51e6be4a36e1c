//! Admission: which connections the server takes on, and how little one
//! costs it before it has authorized (protocol §12, issue 13).
//!
//! A connection that has not authorized is anyone's, so it must be cheap
//! and there must be few of them:
//!
//! ```text
//! accept ─▶ this address holds max_connections_per_address ─▶ closed at once (TCP)
//!        ─▶ this address holds max_unauthorized_per_address not yet
//!             authorized ─▶ 1013 with a reason, or closed
//!        ─▶ max_unauthorized connections not yet authorized ─▶ 1013 with a reason, or closed
//!        ─▶ this address's handshake_rate spent (if set) ─▶ 1013 with a reason, or closed
//!        ─▶ handshake by handshake_timeout ─▶ authorization by the grace
//!             at most max_authorization_size (+ the HTTP upgrade) read
//!             the credential checked in its address's turn
//!               (credential_failure_rate failures a second)
//!        ─▶ authorized: the tenant holds its max-connections
//!             ─▶ close code 1013 with a reason
//! ```
//!
//! Connections not yet authorized — the TCP connection, the TLS handshake
//! and the upgrade included — are held per address as well as
//! server-wide (protocol §12 "Authorization deadline"): strangers on a few
//! addresses hold a few places each, and the rest stay for everyone else.
//! Those turned away for the server's sake, or for their address's, are
//! told why (close code 1013 and a reason) while a refusal place is free;
//! an address holds at most [`REFUSALS_PER_ADDRESS`] of those, so a flood
//! cannot take the words away from the callers it crowds out.
//!
//! A failed credential costs a check, and a stranger guessing tokens
//! wants as many as it can get: the failures of one address are held to a
//! rate ([`AddressRate::reserve`]), past which its next checks wait their
//! turn, while an accepted credential gives its turn back.
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

use tokio::io::{AsyncRead, ReadBuf};

use super::address_rate::AddressRate;
use super::identity::Identity;
use super::tenants::{Revoked, Roster};
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

/// Refusal places (a caller being told why it was turned away) one
/// address holds at once; past that its connections are closed at once.
pub(crate) const REFUSALS_PER_ADDRESS: usize = 2;

/// Why a connection was closed at once when it was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TurnedAway {
    #[error("its address holds as many connections as one address may")]
    Address,
    #[error("its address holds as many connections not yet authorized as one address may")]
    UnauthorizedAddress,
    #[error("as many connections as may be are not authorized yet")]
    Unauthorized,
    #[error("its address opens new connections faster than its handshake rate")]
    Rate,
}

/// Why an authorized connection was not taken on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NotTaken {
    /// Its tenant holds as many connections as it may: this many.
    Limit(usize),
    /// Its token was revoked between its check and now.
    Revoked(Revoked),
}

/// The walls before authorization that are per address, beside
/// [`Admission`]'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PerAddress {
    /// Connections of one address not yet authorized, at once.
    pub(crate) max_unauthorized: usize,
    /// Failed credential checks of one address per second.
    pub(crate) credential_failure_rate: usize,
}

/// What the connections of the server hold, by address and by identity.
#[derive(Debug, Default)]
struct Held {
    unauthorized: usize,
    addresses: HashMap<IpAddr, usize>,
    unauthorized_addresses: HashMap<IpAddr, usize>,
    identities: HashMap<Identity, usize>,
    /// Refusal places, by address.
    refusing: HashMap<IpAddr, usize>,
}

/// The admission of a server: which connections it takes on, and what
/// they hold.
#[derive(Debug)]
pub(crate) struct Gate {
    admission: Admission,
    per_address: PerAddress,
    /// What connections hold, by address and identity.
    held: Mutex<Held>,
    /// New connections per address.
    rate: AddressRate,
    /// Failed credential checks per address.
    failures: AddressRate,
    /// Whose share of connections an identity holds.
    tenants: Arc<Roster>,
}

impl Gate {
    /// The admission of `admission` and `per_address`, asking `tenants`
    /// for their shares.
    pub(crate) fn new(admission: Admission, per_address: PerAddress, tenants: Arc<Roster>) -> Gate {
        Gate {
            admission,
            per_address,
            held: Mutex::new(Held::default()),
            rate: AddressRate::new(admission.handshake_rate),
            failures: AddressRate::new(per_address.credential_failure_rate),
            tenants,
        }
    }

    /// Takes the places of a connection from `address` (`None` for one
    /// that came some other way than the listener), or says why not. Its
    /// address's limits are looked at first: a flood from one address is
    /// turned away for its own sake, not for the server's.
    pub(crate) fn admit(self: &Arc<Self>, address: Option<IpAddr>) -> Result<Admitted, TurnedAway> {
        let admission = &self.admission;
        let mut held = self.held();
        if let Some(address) = address {
            if held.addresses.get(&address).copied().unwrap_or(0)
                >= admission.max_connections_per_address
            {
                return Err(TurnedAway::Address);
            }
            if held
                .unauthorized_addresses
                .get(&address)
                .copied()
                .unwrap_or(0)
                >= self.per_address.max_unauthorized
            {
                return Err(TurnedAway::UnauthorizedAddress);
            }
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
            *held.unauthorized_addresses.entry(address).or_default() += 1;
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

    /// A place for telling a caller from `address` why it was turned away,
    /// unless its address holds [`REFUSALS_PER_ADDRESS`] already; held
    /// until dropped.
    pub(crate) fn refusing(self: &Arc<Self>, address: IpAddr) -> Option<Refusing> {
        let mut held = self.held();
        let count = held.refusing.entry(address).or_default();
        if *count >= REFUSALS_PER_ADDRESS {
            return None;
        }
        *count += 1;
        Some(Refusing {
            gate: Arc::clone(self),
            address,
        })
    }

    /// `io` of a caller turned away at accept, being told why: read
    /// through the allowance of a connection not yet authorized, which it
    /// never will be, so that what it sends meanwhile is not read past it.
    pub(crate) fn turned_away<S>(&self, io: S) -> Bounded<S> {
        Bounded {
            io,
            left: self.admission.allowance(),
            authorized: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Waits for `address`'s turn to have a credential checked (none for
    /// a connection of no address); says whether it had to wait. The
    /// turn is spent unless [`credential_accepted`](Self::credential_accepted)
    /// gives it back.
    pub(crate) async fn credential_turn(&self, address: Option<IpAddr>) -> bool {
        let Some(address) = address else {
            return false;
        };
        let wait = self.failures.reserve(address);
        if wait.is_zero() {
            return false;
        }
        tokio::time::sleep(wait).await;
        true
    }

    /// The credential checked in `address`'s turn was accepted: the turn
    /// goes back, since only failures spend the rate.
    pub(crate) fn credential_accepted(&self, address: Option<IpAddr>) {
        if let Some(address) = address {
            self.failures.refund(address);
        }
    }

    /// Forgets the address buckets that are full again; the server calls
    /// it now and then.
    pub(crate) fn sweep(&self) {
        self.rate.sweep();
        self.failures.sweep();
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
    /// as it may, or its token was revoked in the meantime: that is the
    /// error.
    pub(crate) fn authorized(&mut self, identity: &Identity) -> Result<(), NotTaken> {
        let shares = self.gate.tenants.shares(identity);
        let mut held = self.gate.held();
        if self.unauthorized {
            held.unauthorized -= 1;
            self.unauthorized = false;
            if let Some(address) = self.address {
                release(&mut held.unauthorized_addresses, &address);
            }
        }
        let limit = shares
            .map_err(NotTaken::Revoked)?
            .map(|s| s.max_connections);
        if let Some(limit) = limit {
            let count = held.identities.entry(identity.clone()).or_default();
            if *count >= limit {
                if *count == 0 {
                    held.identities.remove(identity);
                }
                return Err(NotTaken::Limit(limit));
            }
            *count += 1;
            self.identity = Some(identity.clone());
        }
        drop(held);
        self.authorized.store(true, Ordering::Release);
        Ok(())
    }
}

/// A refusal place of an address ([`Gate::refusing`]); dropping it gives
/// it back.
pub(crate) struct Refusing {
    gate: Arc<Gate>,
    address: IpAddr,
}

impl Drop for Refusing {
    fn drop(&mut self) {
        release(&mut self.gate.held().refusing, &self.address);
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut held = self.gate.held();
        if self.unauthorized {
            held.unauthorized -= 1;
            if let Some(address) = self.address {
                release(&mut held.unauthorized_addresses, &address);
            }
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

super::writes_through::writes_through!(Bounded, io);

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
        let per_address = PerAddress {
            max_unauthorized: 4,
            credential_failure_rate: 10,
        };
        Arc::new(Gate::new(
            admission,
            per_address,
            Arc::new(roster(credentials)),
        ))
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
    fn an_address_holds_few_connections_not_yet_authorized_and_others_get_in() {
        let admission = Admission {
            max_unauthorized: 6,
            ..Admission::default()
        };
        let gate = gate(admission, &Credentials::Any);
        let anyone = gate.tenants.accept("").expect("any credential");
        // A flood from one address holds its four places, not the server's six.
        let mut flood: Vec<Admitted> = (0..4)
            .map(|_| gate.admit(address(1)).expect("the flood's own"))
            .collect();
        assert_eq!(
            gate.admit(address(1)).err(),
            Some(TurnedAway::UnauthorizedAddress)
        );
        let caller = gate.admit(address(2)).expect("another address gets in");
        // Authorized, a connection gives its address's place back.
        flood[0]
            .authorized(&anyone)
            .expect("not counted per identity");
        let again = gate.admit(address(1)).expect("its place is back");
        drop((flood, caller, again));
        let held = gate.held();
        assert!(held.unauthorized_addresses.is_empty() && held.addresses.is_empty());
        assert_eq!(held.unauthorized, 0);
    }

    #[test]
    fn an_address_holds_few_refusal_places() {
        let gate = gate(Admission::default(), &Credentials::Any);
        let one = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let places: Vec<Refusing> = (0..REFUSALS_PER_ADDRESS)
            .map(|_| gate.refusing(one).expect("a place"))
            .collect();
        assert!(gate.refusing(one).is_none());
        let other = gate
            .refusing(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)))
            .expect("another address's");
        drop((places, other));
        assert!(gate.held().refusing.is_empty());
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
        assert_eq!(
            authorized(&alice).err(),
            Some(NotTaken::Limit(2)),
            "alice's share is two"
        );
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
