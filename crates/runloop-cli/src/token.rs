//! Credentials from where other users cannot read them: a file, or the
//! environment.
//!
//! A command line is public on Linux: every local user reads it in
//! `/proc/PID/cmdline` (and `ps` shows it) for as long as the process runs.
//! A credential passed as `--token` is therefore warned about, and the help
//! steers to `--token-file FILE` (readable by its owner alone) or
//! `RUNLOOP_TOKEN` (`/proc/PID/environ` is readable by the process's user
//! and root only).

use std::path::Path;

use runloop::small_file;

use crate::exit::Failure;

/// The environment variable a credential is read from.
pub const ENV: &str = "RUNLOOP_TOKEN";

/// The largest token file read: ten thousand tokens of a hundred bytes.
pub const MAX_TOKEN_FILE: u64 = 1 << 20;

/// The warning printed when a credential is on the command line.
pub const COMMAND_LINE_WARNING: &str = "--token is visible to every local user in /proc/PID/cmdline \
     and ps; pass the credential with --token-file FILE or the RUNLOOP_TOKEN environment variable";

/// The tokens of `file`: one per line, surrounding whitespace and blank
/// lines ignored. Only a regular file is read, and at most
/// [`MAX_TOKEN_FILE`] bytes of it ([`small_file`]).
pub fn read_file(file: &Path) -> Result<Vec<String>, Failure> {
    let text = small_file::read(file, MAX_TOKEN_FILE).map_err(|error| {
        Failure::Argument(format!(
            "cannot read the token file {}: {error}",
            file.display()
        ))
    })?;
    let tokens: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect();
    if tokens.is_empty() {
        return Err(Failure::Argument(format!(
            "the token file {} holds no token",
            file.display()
        )));
    }
    Ok(tokens)
}

/// The one credential a client sends: `--token`, else the single token
/// of `--token-file`, else `RUNLOOP_TOKEN`, else empty.
pub fn client(token: Option<&str>, file: Option<&Path>) -> Result<String, Failure> {
    if let Some(token) = token {
        return Ok(token.to_owned());
    }
    if let Some(file) = file {
        let mut tokens = read_file(file)?;
        return match tokens.len() {
            1 => Ok(tokens.remove(0)),
            n => Err(Failure::Argument(format!(
                "the token file {} holds {n} tokens; a client sends one",
                file.display()
            ))),
        };
    }
    Ok(std::env::var(ENV).unwrap_or_default())
}

/// Prints the command-line warning on stderr (for commands without logs).
pub fn warn_command_line() {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr().lock(),
        "runloop: warning: {COMMAND_LINE_WARNING}"
    );
}
