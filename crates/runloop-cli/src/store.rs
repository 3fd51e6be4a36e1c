//! `runloop store`: the container store by hand — `store gc` sheds its
//! least recently used images until they fit a bound, as a server with
//! `--store-max-size` does after each new image.
//!
//! Safe beside a server on the same store (the locks are described in
//! [`runloop_oci::gc`]): it waits for the pulls and unpacks under way,
//! and never removes an image a run holds. Exit codes: 0 the images fit
//! the bound (or, with `--dry-run`, would), 1 they do not because runs
//! hold the rest, 2 the store could not be read or changed.

use std::io::Write;
use std::path::PathBuf;
use std::time::SystemTime;

use runloop_oci::HostConfig;
use runloop_oci::gc::{self, Counted};
use runloop_oci::host::HostError;

use crate::exit::{Exit, Failure};
use crate::process::{LogFormat, init_logs_as};

/// Arguments of `runloop store`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do with the store.
    #[command(subcommand)]
    pub command: StoreCommand,
}

/// The subcommands of `runloop store`.
#[derive(Debug, clap::Subcommand)]
pub enum StoreCommand {
    /// Remove the least recently used images no run holds until the
    /// store's images (pulled blobs and unpacked roots) fit --max-size.
    /// Exit 0: they fit; 1: they do not, because runs hold the rest.
    Gc(GcArgs),
}

/// Arguments of `runloop store gc`.
#[derive(Debug, clap::Args)]
pub struct GcArgs {
    /// The store [default: /var/lib/runloop for root, as `serve --store`].
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// The bound, bytes (K/M/G suffixes); 0 removes every image no run
    /// holds.
    #[arg(long, value_name = "SIZE", default_value = "0", value_parser = crate::size::bytes)]
    pub max_size: u64,
    /// Print what would be removed, and remove nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl Args {
    /// Runs the subcommand, printing a line per image to `out`.
    pub fn execute(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        match &self.command {
            StoreCommand::Gc(args) => args.execute(out),
        }
    }
}

impl GcArgs {
    fn execute(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        let store = self.store.clone().unwrap_or_else(HostConfig::default_store);
        if !store.join("images").is_dir() {
            return Err(Failure::Argument(format!(
                "{} is not a container store (it has no images/ directory)",
                store.display()
            )));
        }
        // The collection's own warning (held images keep the store over
        // its bound) goes to stderr, as a server's log would have it.
        let _logs = init_logs_as("warn", LogFormat::Text);
        let collection = gc::collect(&store, self.max_size, self.dry_run)
            .map_err(|error| Failure::Containers(HostError::Store(error.into())))?;
        let verb = if self.dry_run {
            "would remove"
        } else {
            "removed"
        };
        let (count, bytes) = collection.orphans;
        if count > 0 {
            writeln!(out, "{verb} {count} blob(s) no image names: {bytes} bytes")?;
        }
        for image in &collection.removed {
            writeln!(out, "{verb} {}", line(image))?;
        }
        for image in &collection.held {
            writeln!(out, "kept {}: held by a run", line(image))?;
        }
        let after = if self.dry_run { "would take" } else { "take" };
        writeln!(
            out,
            "the store's images {after} {} bytes (they took {}); the bound is {}",
            collection.after, collection.before, collection.max
        )?;
        if collection.within() {
            return Ok(Exit::Success);
        }
        writeln!(
            out,
            "over the bound: {} image(s) left are held by runs",
            collection.held.len()
        )?;
        Ok(Exit::Unfinished)
    }
}

/// An image as a line says it: digest, bytes, last use.
fn line(image: &Counted) -> String {
    let ago = SystemTime::now()
        .duration_since(image.used)
        .map_or(0, |ago| ago.as_secs());
    format!(
        "{} {} bytes, last used {ago} s ago",
        image.digest, image.bytes
    )
}
