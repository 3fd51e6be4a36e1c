//! The clock every stamp is read on: the system's monotonic clock, in
//! nanoseconds.
//!
//! A chunk is stamped where it is made and read where it arrives, and on
//! the whole chain those are two processes (the agent program and the
//! load client): `CLOCK_MONOTONIC` is one clock for every process of the
//! machine, where an [`Instant`](std::time::Instant) cannot be handed from
//! one process to another.

/// Nanoseconds on the system's monotonic clock.
pub(crate) fn now_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct given, which lives for the
    // call; CLOCK_MONOTONIC exists on every system the bench runs on.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now);
    }
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_goes_forward_in_nanoseconds() {
        let before = now_ns();
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(now_ns() - before >= 5_000_000);
    }
}
