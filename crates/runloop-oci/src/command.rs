//! External commands: the tools a container host is built from (runc, ip,
//! mkfs.ext4, mount, losetup), each run to its end with what it said on
//! stderr kept for the error.
//!
//! These are the tools operators already know and can run by hand to see
//! what the runtime sees; their errors are passed on verbatim (bounded), so
//! a failure reads the way it would at a shell.

use std::ffi::OsStr;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// The most of a command's stderr kept in an error.
const MAX_STDERR: usize = 2048;

/// A command that could not be run or did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{command}` failed: {why}")]
pub struct CommandError {
    /// The command line.
    pub command: String,
    /// Why: the exit status and stderr, or why it did not start.
    pub why: String,
}

impl CommandError {
    /// Whether the command's stderr says `text` (for "already gone" answers).
    pub fn says(&self, text: &str) -> bool {
        self.why.contains(text)
    }
}

/// Runs `program` with `args` (and `input` on stdin) to its end; its stdout
/// on success.
pub async fn run<I, S>(
    program: &OsStr,
    args: I,
    input: Option<&str>,
) -> Result<String, CommandError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut command = Command::new(program);
    command.args(args);
    let line = describe(&command);
    let failed = |why: String| CommandError {
        command: line.clone(),
        why,
    };
    command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|error| failed(format!("cannot start it: {error}")))?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(input.as_bytes())
            .await
            .map_err(|error| failed(format!("cannot write its input: {error}")))?;
    }
    let output = child
        .wait_with_output()
        .await
        .map_err(|error| failed(format!("cannot wait for it: {error}")))?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stderr = stderr.trim();
    let mut cut = stderr.len().min(MAX_STDERR);
    while !stderr.is_char_boundary(cut) {
        cut -= 1;
    }
    Err(failed(format!("{}: {}", output.status, &stderr[..cut])))
}

fn describe(command: &Command) -> String {
    let command = command.as_std();
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|part| part.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}
