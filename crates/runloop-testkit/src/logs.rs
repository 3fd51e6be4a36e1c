//! An in-memory writer of log lines (or any output): what a test hands the
//! code under test as its writer, and reads back whole while the code
//! still holds its clone.
//!
//! One type for every suite that reads what was written: a `tracing`
//! subscriber's lines ([`Logs::global`]), the CLI's notes and `--verbose`
//! view, a child's captured output.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use tracing_subscriber::fmt::MakeWriter;

/// Bytes written so far, shared by every clone.
#[derive(Debug, Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Captures every event of this test binary at `level` and above, from
    /// now on. The subscriber is global, so this is called once per binary
    /// (a thread-local one misses events whose call sites other threads'
    /// tests cached first).
    pub fn global(level: tracing::Level) -> Logs {
        let logs = Logs::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_ansi(false)
            .with_max_level(level)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        logs
    }

    /// Everything written so far, as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }

    /// Everything written so far.
    pub fn bytes(&self) -> Vec<u8> {
        self.held().clone()
    }

    /// The buffer; a writer that panicked mid-write left whole lines.
    fn held(&self) -> MutexGuard<'_, Vec<u8>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.held().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn every_clone_writes_to_one_buffer() {
        let logs = Logs::default();
        let mut writer = logs.clone();
        writer.write_all(b"one\n").expect("written");
        logs.make_writer().write_all(b"two\n").expect("written");
        assert_eq!(logs.text(), "one\ntwo\n");
        assert_eq!(logs.bytes(), b"one\ntwo\n");
    }
}
