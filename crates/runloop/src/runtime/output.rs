//! Agent program output: a child's stdout or stderr, logged line by line
//! (target `runloop::agent_program`), shared by the runtimes that start
//! processes.
//!
//! A line is bounded ([`MAX_LINE`]): a program that writes without
//! newlines is logged in pieces instead of growing a buffer, and bytes
//! that are not UTF-8 are replaced rather than dropped.

use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tracing::{debug, info};

/// The longest stdout or stderr line logged as one; longer ones are split.
pub const MAX_LINE: usize = 16 << 10;

/// Logs a pipe line by line until it ends, naming the program and its
/// pid; lines over [`MAX_LINE`] bytes are logged in pieces, bytes that are
/// not UTF-8 are replaced.
pub async fn log_lines(
    pipe: impl AsyncRead + Unpin,
    program: Arc<str>,
    pid: u32,
    stream: &'static str,
) {
    let mut reader = BufReader::new(pipe);
    let mut line = Vec::new();
    let emit = |line: &[u8]| {
        let text = String::from_utf8_lossy(line);
        info!(target: "runloop::agent_program", %program, pid, stream, "{}", text.trim_end_matches(['\n', '\r']));
    };
    loop {
        let buffer = match reader.fill_buf().await {
            Ok([]) => break,
            Ok(buffer) => buffer,
            Err(error) => {
                debug!(pid, stream, %error, "pipe read failed");
                break;
            }
        };
        // `line` is emitted whenever it is full, so there is always room.
        let room = MAX_LINE - line.len();
        let newline = buffer.iter().take(room).position(|&b| b == b'\n');
        let take = newline.map_or(buffer.len().min(room), |end| end + 1);
        line.extend_from_slice(&buffer[..take]);
        reader.consume(take);
        if newline.is_some() || line.len() == MAX_LINE {
            emit(&line);
            line.clear();
        }
    }
    if !line.is_empty() {
        emit(&line);
    }
}
