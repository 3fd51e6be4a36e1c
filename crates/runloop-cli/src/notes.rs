//! Notes: the command's own lines on stderr — `run -v`'s frames, the timing
//! line, a loop's ending — written by a thread of their own from a bounded
//! queue.
//!
//! stdout holds the data and stderr the notes, and a reader of stderr may
//! stall (a pipe nobody reads) or go away. Neither may cost the run or its
//! exit code: a loop that finished exits 0 whoever reads its ending. So the
//! notes take the way the logs take ([`crate::process::init_logs`]): the
//! command queues each line and a thread writes it; a full queue drops the
//! line, a failed write is ignored. At the end the command waits a moment
//! for the queue to drain, and no longer: on a terminal every line is out
//! long before, and a stalled pipe keeps what it could not take.

use std::io::{self, Write};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::Duration;

/// Lines queued at most while stderr is slow; more are dropped.
pub const QUEUED: usize = 4096;

/// How long the end waits for the queued lines to be written.
pub const DRAIN: Duration = Duration::from_secs(2);

/// The queue of notes and the thread that writes them.
#[derive(Debug)]
pub struct Notes {
    queue: SyncSender<Vec<u8>>,
    writer: Option<(JoinHandle<()>, Receiver<()>)>,
}

/// A handle that queues lines: cheap to clone, for the client's tasks.
#[derive(Debug, Clone)]
pub struct Note(SyncSender<Vec<u8>>);

impl Note {
    /// Queues `line` (its own line break included); dropped when the queue
    /// is full or the writer gone.
    pub fn line(&self, line: Vec<u8>) {
        match self.0.try_send(line) {
            Ok(()) | Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {}
        }
    }
}

impl Write for Note {
    /// Takes one whole line (or several) per call, as `writeln!` makes.
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.line(bytes.to_vec());
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Notes {
    /// Notes written to `out` (stderr for the command).
    pub fn new(mut out: impl Write + Send + 'static) -> Notes {
        let (queue, lines) = mpsc::sync_channel::<Vec<u8>>(QUEUED);
        let (done, finished) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("runloop-notes".into())
            .spawn(move || {
                for line in lines {
                    // A reader that went away: the rest is lost, as it must be.
                    let _ = out.write_all(&line).and_then(|()| out.flush());
                }
                let _ = done.send(());
            });
        Notes {
            queue,
            writer: thread.ok().map(|thread| (thread, finished)),
        }
    }

    /// A handle that queues lines.
    pub fn note(&self) -> Note {
        Note(self.queue.clone())
    }

    /// Waits up to `wait` for the lines queued so far (by every handle
    /// dropped by now) to be written.
    pub fn finish(self, wait: Duration) {
        let Notes { queue, writer } = self;
        drop(queue);
        if let Some((thread, finished)) = writer
            && finished.recv_timeout(wait).is_ok()
        {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use runloop_testkit::logs::Logs;

    use super::*;

    #[test]
    fn lines_come_out_in_order() {
        let out = Logs::default();
        let notes = Notes::new(out.clone());
        let mut note = notes.note();
        for n in 0..100 {
            writeln!(note, "line {n}").expect("queued");
        }
        drop(note);
        notes.finish(Duration::from_secs(10));
        let text = String::from_utf8(out.bytes()).expect("UTF-8");
        assert_eq!(text.lines().count(), 100);
        assert!(text.ends_with("line 99\n"));
    }

    /// A writer that never returns, like a pipe nobody reads.
    struct Stalled;

    impl Write for Stalled {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            std::thread::sleep(Duration::from_secs(3600));
            Ok(0)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_stderr_costs_lines_never_the_command() {
        let notes = Notes::new(Stalled);
        let note = notes.note();
        let start = Instant::now();
        for _ in 0..QUEUED * 2 {
            note.line(b"more than the queue holds\n".to_vec());
        }
        drop(note);
        notes.finish(Duration::from_millis(100));
        assert!(start.elapsed() < Duration::from_secs(60), "it did not wait");
    }

    /// A writer whose reader went away.
    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_stderr_loses_the_lines_quietly() {
        let notes = Notes::new(Closed);
        notes.note().line(b"lost\n".to_vec());
        notes.finish(Duration::from_secs(10));
    }
}
