//! `runloop man`: the manual pages, in roff, made from the argument types.
//!
//! A subcommand rather than a build step, so the pages always describe the
//! binary that prints them, an installed binary (`cargo install` copies no
//! man pages) can still produce them, and a build needs no extra work. The
//! pages are `runloop(1)` and one per subcommand, `runloop-run(1)` and so
//! on, as git and cargo name theirs.
//!
//! Two things are ours rather than clap_mangen's defaults: the header names
//! the commit's date as the page's date and `runloop VERSION` as its source
//! (left empty, the date field took the version), and the SYNOPSIS shows
//! each option with its value's name (`[--url URL]`, `[--ca FILE]…`), as
//! `--help` does, instead of the bare flags.
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
    /// Write every page (runloop.1, runloop-run.1, …) into DIR instead,
    /// made first if it is not there.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

impl Args {
    /// Prints the page to `out`, or writes every page to `--dir`; `command`
    /// is the whole `runloop` command, as [`crate::cli::Cli`] builds it.
    pub fn execute(&self, command: clap::Command, out: &mut impl Write) -> Result<Exit, Failure> {
        if let Some(dir) = &self.dir {
            let mut command = command.disable_help_subcommand(true);
            command.build();
            let mut pages = Vec::new();
            every_page(&command, &mut pages);
            // A fresh home has no ~/.local/share/man/man1 yet.
            std::fs::create_dir_all(dir).map_err(|source| Failure::Write {
                name: dir.display().to_string(),
                source,
            })?;
            for page in pages {
                let path = dir.join(format!("{}.1", page_name(&page)));
                let write = |path: &std::path::Path| -> std::io::Result<()> {
                    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
                    render(page.clone(), &mut file)?;
                    file.flush()
                };
                write(&path).map_err(|source| Failure::Write {
                    name: path.display().to_string(),
                    source,
                })?;
            }
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
        render(page, out)?;
        out.flush()?;
        Ok(Exit::Success)
    }
}

/// `command` and its visible subcommands, theirs too, each a page.
fn every_page(command: &clap::Command, pages: &mut Vec<clap::Command>) {
    pages.push(command.clone());
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        every_page(sub, pages);
    }
}

/// The page's name: `runloop`, `runloop-run`, …
fn page_name(page: &clap::Command) -> String {
    page.get_display_name()
        .unwrap_or_else(|| page.get_name())
        .to_owned()
}

/// One page, with our header and SYNOPSIS.
fn render(page: clap::Command, out: &mut impl Write) -> std::io::Result<()> {
    // "0.1.0 (cc69bf4 2026-12-02)": the date is the commit's, when known.
    let version = crate::VERSION;
    let (number, date) = match version.split_once(" (") {
        Some((number, commit)) => (
            number,
            commit
                .trim_end_matches(')')
                .rsplit(' ')
                .next()
                .unwrap_or_default(),
        ),
        None => (version, ""),
    };
    let man = Man::new(page.clone())
        .date(date)
        .source(format!("runloop {number}"))
        .manual("runloop manual");
    let mut roff = Vec::new();
    man.render(&mut roff)?;
    let roff = String::from_utf8_lossy(&roff);
    let mut page_text = String::with_capacity(roff.len());
    let mut skipping = false;
    for line in roff.lines() {
        if line.starts_with(".TH ") {
            // Every field quoted: an empty one is kept in its place.
            page_text.push_str(&format!(
                ".TH {} 1 \"{date}\" \"runloop {number}\" \"runloop manual\"\n",
                page_name(&page)
            ));
            continue;
        }
        if line == ".SH SYNOPSIS" {
            page_text.push_str(line);
            page_text.push('\n');
            page_text.push_str(&synopsis(&page));
            skipping = true;
            continue;
        }
        if skipping && line.starts_with(".SH ") {
            skipping = false;
        }
        if !skipping {
            page_text.push_str(line);
            page_text.push('\n');
        }
    }
    out.write_all(page_text.as_bytes())
}

/// Text for roff: backslashes and dashes escaped, a leading dot or quote
/// kept from being read as a request.
fn roff_text(text: &str) -> String {
    text.replace('\\', "\\e").replace('-', "\\-")
}

/// The SYNOPSIS line of `page`: its name in bold, then each option as
/// `--help` shows it, with its value's name in italics.
fn synopsis(page: &clap::Command) -> String {
    let name = page.get_bin_name().unwrap_or_else(|| page.get_name());
    let mut line = format!("\\fB{}\\fR", roff_text(name));
    let bold = |text: &str| format!("\\fB{}\\fR", roff_text(text));
    let italic = |text: &str| format!("\\fI{}\\fR", roff_text(text));
    for arg in page.get_arguments().filter(|arg| !arg.is_hide_set()) {
        if arg.is_positional() {
            continue;
        }
        let flag = match (arg.get_short(), arg.get_long()) {
            (Some(short), Some(long)) => format!(
                "{}|{}",
                bold(&format!("-{short}")),
                bold(&format!("--{long}"))
            ),
            (Some(short), None) => bold(&format!("-{short}")),
            (None, Some(long)) => bold(&format!("--{long}")),
            (None, None) => continue,
        };
        let takes_value = arg.get_num_args().is_some_and(|n| n.takes_values());
        let value = if takes_value {
            format!(" {}", italic(&value_names(arg)))
        } else {
            String::new()
        };
        let repeated = matches!(
            arg.get_action(),
            clap::ArgAction::Append | clap::ArgAction::Count
        );
        let more = if repeated { "…" } else { "" };
        if arg.is_required_set() {
            line.push_str(&format!(" {flag}{value}{more}"));
        } else {
            line.push_str(&format!(" [{flag}{value}]{more}"));
        }
    }
    for arg in page.get_positionals().filter(|arg| !arg.is_hide_set()) {
        let value = italic(&value_names(arg));
        if arg.is_required_set() {
            line.push_str(&format!(" {value}"));
        } else {
            line.push_str(&format!(" [{value}]"));
        }
    }
    if page.has_subcommands() {
        line.push_str(&format!(" {}", italic("COMMAND")));
    }
    line.push('\n');
    line
}

/// The names of what `arg` takes, as the synopsis shows them: its value
/// names, or its id in capitals when it has none.
fn value_names(arg: &clap::Arg) -> String {
    match arg.get_value_names() {
        Some(names) => names
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        None => arg.get_id().as_str().to_uppercase(),
    }
}
