//! Rates per address: a token bucket per IP address, for how fast one
//! address may open new connections (the handshake rate, issue 26) and
//! how fast its credentials may fail (protocol §12 "Fair shares").
//!
//! The counts of admission bound what an address *holds* at once; a caller
//! that opens and drops connections as fast as it can holds few of them,
//! yet makes the server do a TLS and WebSocket handshake for each. With a
//! rate ([`Admission::handshake_rate`](crate::Admission::handshake_rate)),
//! each address has a bucket of that many handshakes, refilled evenly
//! each second; a connection that finds its bucket empty is turned away
//! (told why with close code 1013 where a refusal place is free, else
//! closed at once). Off by default: behind a load balancer or a NAT every
//! caller comes from the same address, and a rate the operator did not
//! choose would turn them away together.
//!
//! A credential check costs a hash and a pass over every token, and a
//! stranger who guesses tokens wants as many as it can get; so failed
//! checks have a bucket per address too
//! ([`ServerConfig::credential_failure_rate`](crate::ServerConfig::credential_failure_rate)).
//! A check takes its turn first ([`AddressRate::reserve`]): with the
//! bucket empty it waits until a token would be there (the bucket goes
//! into debt, so waiting checks queue in order), and a credential that is
//! accepted gives its token back ([`AddressRate::refund`]): only failures
//! spend the rate. The debt is bounded ([`MAX_WAIT`]), and so is how
//! many checks wait at once: each holds a connection not yet authorized,
//! of which an address holds few.
//!
//! The buckets are bounded in memory: at most [`MAX_ADDRESSES`] are kept
//! (a full bucket is no different from none, so those are forgotten
//! first, and by [`AddressRate::sweep`]); past that, the other addresses
//! share one bucket.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Addresses whose buckets are kept at once; the rest share one.
pub(crate) const MAX_ADDRESSES: usize = 4096;

/// The longest wait of a reservation ([`AddressRate::reserve`]): the debt
/// of a bucket goes no deeper.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(10);

/// One address's bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Handshakes it may start now.
    tokens: f64,
    /// When `tokens` was last brought up to date.
    at: Instant,
}

/// The buckets of the addresses that spent some of a rate lately.
#[derive(Debug)]
pub(crate) struct AddressRate {
    /// Tokens per second per address, and the bucket's size; 0: off.
    per_second: usize,
    /// `None`: the addresses past [`MAX_ADDRESSES`].
    buckets: Mutex<HashMap<Option<IpAddr>, Bucket>>,
}

impl AddressRate {
    /// `per_second` tokens per address (0: any number).
    pub(crate) fn new(per_second: usize) -> AddressRate {
        AddressRate {
            per_second,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `address` may start one more handshake now; if so, it is
    /// counted.
    pub(crate) fn allows(&self, address: IpAddr) -> bool {
        if self.per_second == 0 {
            return true;
        }
        self.with_bucket(address, |bucket| {
            if bucket.tokens >= 1.0 {
                bucket.tokens -= 1.0;
                true
            } else {
                false
            }
        })
    }

    /// Takes a token of `address`'s bucket, into debt if need be (down to
    /// [`MAX_WAIT`] of it): how long to wait before the token is there.
    pub(crate) fn reserve(&self, address: IpAddr) -> Duration {
        if self.per_second == 0 {
            return Duration::ZERO;
        }
        let rate = self.per_second as f64;
        self.with_bucket(address, |bucket| {
            bucket.tokens = (bucket.tokens - 1.0).max(-rate * MAX_WAIT.as_secs_f64());
            if bucket.tokens >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-bucket.tokens / rate)
            }
        })
    }

    /// Gives back the token a reservation of `address` took, up to a full
    /// bucket.
    pub(crate) fn refund(&self, address: IpAddr) {
        if self.per_second == 0 {
            return;
        }
        let rate = self.per_second as f64;
        self.with_bucket(address, |bucket| {
            bucket.tokens = (bucket.tokens + 1.0).min(rate);
        });
    }

    /// Runs `spend` on `address`'s bucket, brought up to date (made full
    /// the first time; shared past [`MAX_ADDRESSES`]).
    fn with_bucket<T>(&self, address: IpAddr, spend: impl FnOnce(&mut Bucket) -> T) -> T {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let mut key = Some(address);
        if buckets.len() >= MAX_ADDRESSES && !buckets.contains_key(&key) {
            buckets.retain(|_, bucket| !self.full(bucket, now));
            if buckets.len() >= MAX_ADDRESSES {
                key = None;
            }
        }
        let bucket = buckets.entry(key).or_insert(Bucket {
            tokens: self.per_second as f64,
            at: now,
        });
        self.refill(bucket, now);
        spend(bucket)
    }

    /// Forgets the buckets that are full again. The server calls it now
    /// and then, so that addresses gone quiet cost nothing.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        buckets.retain(|_, bucket| !self.full(bucket, now));
    }

    /// Brings `bucket` up to `now`.
    fn refill(&self, bucket: &mut Bucket, now: Instant) {
        let rate = self.per_second as f64;
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(rate);
        bucket.at = now;
    }

    /// Whether `bucket` would be full at `now`.
    fn full(&self, bucket: &Bucket, now: Instant) -> bool {
        let mut bucket = *bucket;
        self.refill(&mut bucket, now);
        bucket.tokens >= self.per_second as f64
    }

    #[cfg(test)]
    fn kept(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn address(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))
    }

    #[test]
    fn an_address_starts_its_bucket_then_waits_for_it_to_refill() {
        let rate = AddressRate::new(5);
        let one = address(1);
        assert_eq!((0..5).filter(|_| rate.allows(one)).count(), 5);
        assert!(!rate.allows(one), "the sixth at once");
        // Another address has a bucket of its own.
        assert!(rate.allows(address(2)));
        // A fifth of a second brings one back.
        std::thread::sleep(std::time::Duration::from_millis(250));
        assert!(rate.allows(one));
        assert!(!rate.allows(one));
        // Off: any number.
        let off = AddressRate::new(0);
        assert!((0..1000).all(|_| off.allows(one)));
        assert_eq!(off.kept(), 0);
    }

    #[test]
    fn the_buckets_kept_are_bounded_and_full_ones_forgotten() {
        let rate = AddressRate::new(1);
        for n in 0..MAX_ADDRESSES as u32 + 100 {
            assert!(rate.allows(address(n)) || n as usize >= MAX_ADDRESSES);
        }
        assert!(rate.kept() <= MAX_ADDRESSES + 1, "{}", rate.kept());
        // The addresses past the bound share one bucket, now empty.
        assert!(!rate.allows(address(MAX_ADDRESSES as u32 + 500)));
        std::thread::sleep(std::time::Duration::from_millis(1100));
        rate.sweep();
        assert_eq!(rate.kept(), 0, "every bucket is full again");
    }

    #[test]
    fn failures_reserve_their_turn_and_an_accepted_credential_gives_it_back() {
        let rate = AddressRate::new(4);
        let one = address(1);
        // A full bucket: four checks at once, the fifth waits a quarter
        // of a second, the sixth half of one.
        for _ in 0..4 {
            assert_eq!(rate.reserve(one), Duration::ZERO);
        }
        let fifth = rate.reserve(one);
        assert!(fifth > Duration::from_millis(200) && fifth <= Duration::from_millis(250));
        let sixth = rate.reserve(one);
        assert!(sixth > Duration::from_millis(450) && sixth <= Duration::from_millis(500));
        // Accepted credentials give their turns back.
        rate.refund(one);
        rate.refund(one);
        assert!(rate.reserve(one) <= Duration::from_millis(250));
        // The debt is bounded.
        let waits: Vec<Duration> = (0..1000).map(|_| rate.reserve(one)).collect();
        assert!(
            waits.iter().all(|wait| *wait <= MAX_WAIT),
            "{:?}",
            waits.last()
        );
        // Another address is not slowed; off, nothing is.
        assert_eq!(rate.reserve(address(2)), Duration::ZERO);
        assert_eq!(AddressRate::new(0).reserve(one), Duration::ZERO);
    }
}
