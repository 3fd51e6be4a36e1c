//! The ping budget of a caller's connection: how many control frames
//! (pings and pongs) it may send, and how fast.
//!
//! Every ping costs the server an answer, written whether or not the
//! caller reads it. The WebSocket layer keeps only the latest answer when
//! the caller does not read (its write buffer is bounded, see
//! [`Limits::websocket`](runloop_wire::limits::Limits::websocket)), so memory
//! holds; but a caller that floods pings still costs a frame's work each,
//! and a caller has no use for more than a few: the protocol gives control
//! frames no meaning (§1), and a keep-alive needs one every several
//! seconds. So a connection has a bucket of [`BURST`] control frames,
//! refilled at [`PER_SECOND`]; a frame past an empty bucket ends the
//! connection, before or after its authorization.

use std::time::Instant;

/// Control frames a caller may send at once.
pub(crate) const BURST: u32 = 64;

/// Control frames a caller may send per second, over time.
pub(crate) const PER_SECOND: u32 = 8;

/// The control frames a connection may still send.
#[derive(Debug)]
pub(crate) struct Pings {
    left: f64,
    at: Instant,
}

/// A connection sent control frames faster than its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the caller sent control frames faster than {PER_SECOND} a second (after a burst of {BURST})"
)]
pub(crate) struct Flood;

impl Pings {
    /// A full bucket, `now`.
    pub(crate) fn new(now: Instant) -> Pings {
        Pings {
            left: f64::from(BURST),
            at: now,
        }
    }

    /// Counts one control frame received `now`; `Err` when it is one too
    /// many.
    pub(crate) fn received(&mut self, now: Instant) -> Result<(), Flood> {
        let refill = now.duration_since(self.at).as_secs_f64() * f64::from(PER_SECOND);
        self.left = (self.left + refill).min(f64::from(BURST));
        self.at = now;
        if self.left < 1.0 {
            return Err(Flood);
        }
        self.left -= 1.0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_burst_passes_a_flood_does_not() {
        let now = Instant::now();
        let mut pings = Pings::new(now);
        for n in 0..BURST {
            assert_eq!(pings.received(now), Ok(()), "ping {n} of the burst");
        }
        assert_eq!(pings.received(now), Err(Flood));
    }

    #[test]
    fn the_budget_refills_over_time() {
        let mut now = Instant::now();
        let mut pings = Pings::new(now);
        for _ in 0..BURST {
            pings.received(now).expect("the burst");
        }
        now += Duration::from_secs(1);
        for n in 0..PER_SECOND {
            assert_eq!(pings.received(now), Ok(()), "ping {n} after a second");
        }
        assert_eq!(pings.received(now), Err(Flood));
        // A keep-alive every few seconds never runs out.
        for _ in 0..1000 {
            now += Duration::from_secs(2);
            pings.received(now).expect("a keep-alive");
        }
    }

    #[test]
    fn the_error_says_what_the_budget_is() {
        assert_eq!(
            Flood.to_string(),
            "the caller sent control frames faster than 8 a second (after a burst of 64)"
        );
    }
}
