//! `runloop schema`: the JSON Schema of what a run-loop response carries.
//!
//! The schema is generated from the very types that decode the wire, so it
//! cannot drift from them. It is one JSON Schema (draft 2020-12) document
//! whose root is the chunk vocabulary, [`AgenticLoopChunk`]: the document
//! validates a chunk as it stands. Every type the chunk uses is under
//! `$defs`, and so is `Error`, the schema of the error value ([`ErrorValue`],
//! any JSON value), addressed as `#/$defs/Error`. One document with one `$defs` keeps
//! every `$ref` resolvable, which two schemas nested in a wrapper object
//! would not.

use std::io::Write;

use runloop_proto::ErrorValue;
use runloop_proto::run_loop::AgenticLoopChunk;
use schemars::generate::SchemaSettings;
use serde_json::Value;

use crate::exit::{Exit, Failure};

/// Arguments of `runloop schema` (none).
#[derive(Debug, clap::Args)]
pub struct Args {}

impl Args {
    /// Prints the schema document, pretty, to `out`.
    pub fn execute(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        serde_json::to_writer_pretty(&mut *out, &document()).map_err(std::io::Error::from)?;
        writeln!(out)?;
        out.flush()?;
        Ok(Exit::Success)
    }
}

/// The schema document.
pub fn document() -> Value {
    let mut generator = SchemaSettings::draft2020_12().into_generator();
    // Asking for the error value's schema first files it under `$defs`,
    // where the root schema's definitions then include it; the reference
    // returned here is not needed.
    generator.subschema_for::<ErrorValue>();
    generator.root_schema_for::<AgenticLoopChunk>().to_value()
}
