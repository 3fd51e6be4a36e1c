//! The handshake rate: how fast one address may open new connections, a
//! token bucket per address (issue 26).
//!
//! The counts of admission bound what an address *holds* at once; a caller
//! that opens and drops connections as fast as it can holds few of them,
//! yet makes the server do a TLS and WebSocket handshake for each. With a
//! rate ([`Admission::handshake_rate`](crate::Admission::handshake_rate)),
//! each address has a bucket of that many handshakes, refilled evenly
//! each second; a connection that finds its bucket empty is turned away
//! (told why with close code 1013 where a refusal place is free, else
//! closed at once).
//!
//! Off by default: behind a load balancer or a NAT every caller comes from
//! the same address, and a rate the operator did not choose would turn
//! them away together. The buckets are bounded in memory: at most
//! [`MAX_ADDRESSES`] are kept (a full bucket is no different from none,
//! so those are forgotten first, and by [`HandshakeRate::sweep`]); past
//! that, the other addresses share one bucket.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

/// Addresses whose buckets are kept at once; the rest share one.
pub(crate) const MAX_ADDRESSES: usize = 4096;

/// One address's bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Handshakes it may start now.
    tokens: f64,
    /// When `tokens` was last brought up to date.
    at: Instant,
}

/// The buckets of the addresses that opened connections lately.
#[derive(Debug)]
pub(crate) struct HandshakeRate {
    /// Handshakes per second per address, and the bucket's size; 0: off.
    per_second: usize,
    /// `None`: the addresses past [`MAX_ADDRESSES`].
    buckets: Mutex<HashMap<Option<IpAddr>, Bucket>>,
}

impl HandshakeRate {
    /// `per_second` new connections per address (0: any number).
    pub(crate) fn new(per_second: usize) -> HandshakeRate {
        HandshakeRate {
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
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
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
        let rate = HandshakeRate::new(5);
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
        let off = HandshakeRate::new(0);
        assert!((0..1000).all(|_| off.allows(one)));
        assert_eq!(off.kept(), 0);
    }

    #[test]
    fn the_buckets_kept_are_bounded_and_full_ones_forgotten() {
        let rate = HandshakeRate::new(1);
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
}
