//! `runloop completions SHELL`: the shell's completion script for the
//! command, on stdout.
//!
//! The script is generated from the same argument types that parse the
//! command line, so it completes exactly the subcommands and flags this
//! binary has; a new flag needs nothing here. It is printed rather than
//! installed because every shell keeps completions somewhere else:
//!
//! ```text
//! runloop completions bash > ~/.local/share/bash-completion/completions/runloop
//! runloop completions zsh  > ~/.zfunc/_runloop        (with fpath+=~/.zfunc)
//! runloop completions fish > ~/.config/fish/completions/runloop.fish
//! runloop completions powershell >> $PROFILE
//! ```

use std::io::Write;

use clap_complete::{Generator, Shell};

use crate::exit::{Exit, Failure};

/// Arguments of `runloop completions`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell to complete for: bash, zsh, fish or powershell.
    #[arg(value_enum)]
    pub shell: Target,
}

/// The shells a script is made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// GNU Bash.
    Bash,
    /// Z shell.
    Zsh,
    /// fish.
    Fish,
    /// PowerShell.
    Powershell,
}

impl From<Target> for Shell {
    fn from(target: Target) -> Shell {
        match target {
            Target::Bash => Shell::Bash,
            Target::Zsh => Shell::Zsh,
            Target::Fish => Shell::Fish,
            Target::Powershell => Shell::PowerShell,
        }
    }
}

impl Args {
    /// Prints the script for `command` (the whole `runloop` command, as
    /// [`crate::cli::Cli`] builds it) to `out`.
    pub fn execute(&self, command: clap::Command, out: &mut impl Write) -> Result<Exit, Failure> {
        let mut command = command;
        command.set_bin_name("runloop");
        command.build();
        // The fallible form: a reader that goes away is an error like any
        // other write's, not a panic.
        Shell::from(self.shell).try_generate(&command, out)?;
        out.flush()?;
        Ok(Exit::Success)
    }
}
