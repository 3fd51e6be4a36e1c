//! `run -v`: the connection's frames, live, as they are sent and received,
//! and a timing line at the end.
//!
//! Each frame is one line on stderr, in the words `decode` uses for a
//! capture ([`crate::frames`]), after the time since the command started
//! and the direction, so that `-v` shows now what `--capture` and `decode`
//! show after the fact. The credential is never shown. At the end, one line
//! sums the run up:
//!
//! ```text
//! +0.004211 > authorization: unbrokered (the credential is not shown)
//! +0.004390 > scope 0: agents::run {"image":{"server":{"name":"demo",…}},…}
//! +0.093771 < scope 0: id "gTrvmR1R4_SVmLPp0p9G9A"
//! +0.094012 > scope 0 channel 0: run-loop {"prompt":"hi"}
//! +0.096270 < scope 0 channel 0: chunk {"type":"assistant_reasoning",…}
//! …
//! timing: id after 93.8 ms, first chunk after 96.3 ms, total 121.0 ms; 21 chunks, 2914 bytes of chunk JSON
//! ```
//!
//! Lines are written from the client's own tasks as frames pass, like the
//! capture's; `-v` is for a person watching, whose terminal keeps up.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runloop_proto::capture::Direction;
use runloop_proto::frame::Role;

use crate::frames::{Frame, describe};

/// What `-v` has seen so far.
#[derive(Debug, Default)]
struct Seen {
    /// When the run's id came.
    id: Option<Duration>,
    /// When the first chunk came.
    first_chunk: Option<Duration>,
    /// Chunks received, and the bytes of their JSON.
    chunks: u64,
    bytes: u64,
}

/// The live view of one connection's frames.
#[derive(Debug)]
pub struct Verbose<W> {
    start: Instant,
    state: Mutex<(W, Seen)>,
}

impl<W: Write + Send + 'static> Verbose<W> {
    /// A view writing to `out`, its times counted from `start`.
    pub fn new(out: W, start: Instant) -> Arc<Self> {
        Arc::new(Verbose {
            start,
            state: Mutex::new((out, Seen::default())),
        })
    }

    /// One frame, sent by `sender`: its line, and the counts.
    pub fn frame(&self, sender: Role, message: &[u8]) {
        let at = self.start.elapsed();
        let direction = match sender {
            Role::Client => Direction::ClientToServer,
            Role::Server => Direction::ServerToClient,
        };
        let frame = describe(direction, message);
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (out, seen) = &mut *state;
        match frame {
            Frame::Id { .. } => {
                seen.id.get_or_insert(at);
            }
            Frame::Chunk { json, .. } => {
                seen.first_chunk.get_or_insert(at);
                seen.chunks += 1;
                seen.bytes += json.len() as u64;
            }
            _ => {}
        }
        // A stderr that cannot be written loses the line; the run goes on.
        let _ = writeln!(
            out,
            "+{}.{:06} {} {frame}",
            at.as_secs(),
            at.subsec_micros(),
            direction.marker()
        );
    }

    /// The timing line, at the end of the run.
    pub fn timing(&self) -> String {
        let total = self.start.elapsed();
        let state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let seen = &state.1;
        let after = |at: Option<Duration>| match at {
            Some(at) => format!("after {}", millis(at)),
            None => "none".to_owned(),
        };
        format!(
            "timing: id {}, first chunk {}, total {}; {} chunks, {} bytes of chunk JSON",
            after(seen.id),
            after(seen.first_chunk),
            millis(total),
            seen.chunks,
            seen.bytes
        )
    }
}

/// A duration in milliseconds, one decimal: `93.8 ms`.
fn millis(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    use runloop_proto::frame::raw as message;
    use runloop_testkit::logs::Logs;

    #[test]
    fn each_frame_is_a_line_and_the_end_sums_up() {
        let out = Logs::default();
        let verbose = Verbose::new(out.clone(), Instant::now());
        verbose.frame(Role::Client, &message(0, 0, 0, b"\x00hunter2"));
        verbose.frame(Role::Server, &message(2, 0, 0, b"\x00{\"id\":\"r\"}"));
        verbose.frame(
            Role::Server,
            &message(5, 0, 0, b"\x00{\"type\":\"user\",\"prompt\":\"a\"}"),
        );
        verbose.frame(Role::Server, &message(5, 0, 0, b"\x00{}"));
        verbose.frame(Role::Server, &message(6, 0, 0, b""));
        let text = String::from_utf8(out.bytes()).expect("UTF-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        let shown: Vec<&str> = lines
            .iter()
            .map(|line| line.split_once(' ').expect("a time first").1)
            .collect();
        assert_eq!(
            shown,
            [
                "> authorization: unbrokered (the credential is not shown)",
                "< scope 0: id \"r\"",
                "< scope 0 channel 0: chunk {\"type\":\"user\",\"prompt\":\"a\"}",
                "< scope 0 channel 0: chunk {}",
                "< scope 0 channel 0: finish",
            ]
        );
        assert!(!text.contains("hunter2"));
        assert!(lines.iter().all(|line| line.starts_with("+0.")), "{text}");
        let timing = verbose.timing();
        assert!(timing.starts_with("timing: id after "), "{timing}");
        assert!(
            timing.ends_with("; 2 chunks, 30 bytes of chunk JSON"),
            "{timing}"
        );

        let idle = Verbose::new(Logs::default(), Instant::now());
        assert!(
            idle.timing()
                .starts_with("timing: id none, first chunk none, total "),
            "{}",
            idle.timing()
        );
    }
}
