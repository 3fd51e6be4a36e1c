//! A start's steps: what each step of a container's start took, in the
//! order they ran, said once in the server's debug log when the start is
//! over.
//!
//! Why: a start is a chain of small steps (a cgroup, a disk, mounts, a
//! network namespace, runc, the agent's own start, the readiness probe),
//! and what a caller feels is their sum. A figure per step, from the
//! server's own clock, is what says which step to cut; it costs a clock
//! read per step, so it is always on, and `RUST_LOG=runloop_oci=debug` (or
//! `runloop_runtime=debug`) shows it:
//!
//! ```text
//! start steps: dir 0.1 ms, disk 4.2 ms, overlay 0.3 ms, netns 0.6 ms, bundle 0.4 ms, runc 31.0 ms, ready 2.1 ms, link 0.2 ms; total 38.9 ms
//! ```
//!
//! Steps that run side by side are marked where the start waits for them
//! (`disk+netns`), so the figures always add up to the total.

use std::fmt;
use std::time::{Duration, Instant};

/// The steps of one start, timed.
#[derive(Debug, Clone)]
pub struct Steps {
    began: Instant,
    last: Instant,
    steps: Vec<(&'static str, Duration)>,
}

impl Steps {
    /// A start that begins now.
    pub fn start() -> Steps {
        let now = Instant::now();
        Steps {
            began: now,
            last: now,
            steps: Vec::with_capacity(12),
        }
    }

    /// The step `name` ended now: it took the time since the last mark.
    pub fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.steps.push((name, now - self.last));
        self.last = now;
    }

    /// The time from the start to the last mark.
    pub fn total(&self) -> Duration {
        self.last - self.began
    }

    /// The steps marked so far, in order.
    pub fn steps(&self) -> &[(&'static str, Duration)] {
        &self.steps
    }
}

impl fmt::Display for Steps {
    /// `name 1.2 ms, …; total 3.4 ms`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (at, (name, took)) in self.steps.iter().enumerate() {
            if at > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{name} {:.1} ms", took.as_secs_f64() * 1e3)?;
        }
        write!(f, "; total {:.1} ms", self.total().as_secs_f64() * 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_add_up_to_the_total_and_read_in_order() {
        let mut steps = Steps::start();
        steps.mark("first");
        std::thread::sleep(Duration::from_millis(2));
        steps.mark("second");
        let sum: Duration = steps.steps().iter().map(|(_, took)| *took).sum();
        assert_eq!(sum, steps.total());
        assert_eq!(
            steps
                .steps()
                .iter()
                .map(|(name, _)| *name)
                .collect::<Vec<_>>(),
            ["first", "second"]
        );
        let said = steps.to_string();
        assert!(said.starts_with("first 0.0 ms, second "), "{said}");
        assert!(said.contains("; total "), "{said}");
    }
}
