//! `runloop man`: the manual pages, in roff, made from the argument types.
//!
//! A subcommand rather than a build step, so the pages always describe the
//! binary that prints them, an installed binary (`cargo install` copies no
//! man pages) can still produce them, and a build needs no extra work. The
//! pages are `runloop(1)` and one per subcommand, `runloop-run(1)` and so
//! on, as git and cargo name theirs.
//!
//! ```text
//! runloop man | man -l -                  read runloop(1) now
//! runloop man run | man -l -              read runloop-run(1)
//! runloop man --dir ~/.local/share/man/man1   install every page
//! ```

use std::io::Write;
use std::path::PathBuf;

use clap_mangen::Man;

use crate::exit::{Exit, Failure};

/// Arguments of `runloop man`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The subcommand whose page to print (`run` prints runloop-run(1));
    /// without it, runloop(1).
    #[arg(value_name = "SUBCOMMAND", conflicts_with = "dir")]
    pub subcommand: Option<String>,
    /// Write every page (runloop.1, runloop-run.1, …) into DIR instead.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

impl Args {
    /// Prints the page to `out`, or writes every page to `--dir`; `command`
    /// is the whole `runloop` command, as [`crate::cli::Cli`] builds it.
    pub fn execute(&self, command: clap::Command, out: &mut impl Write) -> Result<Exit, Failure> {
        if let Some(dir) = &self.dir {
            clap_mangen::generate_to(command, dir).map_err(|source| Failure::Write {
                name: dir.display().to_string(),
                source,
            })?;
            return Ok(Exit::Success);
        }
        let page = match &self.subcommand {
            None => command,
            Some(name) => {
                let mut command = command;
                // Subcommands carry their parent's name only once built.
                command.build();
                command
                    .get_subcommands()
                    .find(|sub| sub.get_name() == name && !sub.is_hide_set())
                    .cloned()
                    .ok_or_else(|| {
                        Failure::Argument(format!(
                            "runloop has no subcommand {name:?} (see runloop --help)"
                        ))
                    })?
            }
        };
        Man::new(page).render(out)?;
        out.flush()?;
        Ok(Exit::Success)
    }
}
