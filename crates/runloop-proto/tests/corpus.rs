//! Replays the committed fuzz corpora through the fuzz targets' checks.
//!
//! The fuzz targets need nightly and libFuzzer; their corpora should still
//! be exercised on every `cargo test`. The checks are compiled in from the
//! fuzz crate's own source, so a corpus file here meets exactly the
//! assertions it met while fuzzing.

use std::fs;
use std::path::{Path, PathBuf};

#[path = "../../../fuzz/src/lib.rs"]
mod checks;

/// `fuzz/corpus/<target>` at the repository root.
fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// Runs every file of a target's corpus through `check`; requires a
/// non-empty corpus in which some inputs get past decoding.
fn replay(target: &str, check: fn(&[u8]) -> bool) {
    let dir = corpus(target);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{target}: the corpus is empty");
    let mut decoded = 0;
    for file in &files {
        let data = fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let result = std::panic::catch_unwind(|| check(&data));
        match result {
            Ok(true) => decoded += 1,
            Ok(false) => {}
            Err(_) => panic!("{target}: {} fails its check", file.display()),
        }
    }
    assert!(
        decoded > 0,
        "{target}: none of {} inputs got past decoding",
        files.len()
    );
}

#[test]
fn frame_header() {
    replay("frame_header", checks::frame_header);
}

#[test]
fn authorization() {
    replay("authorization", checks::authorization);
}

#[test]
fn agents_run_request() {
    replay("agents_run_request", checks::agents_run_request);
}

#[test]
fn channel_request() {
    replay("channel_request", checks::channel_request);
}

#[test]
fn run_loop_frame() {
    replay("run_loop_frame", checks::run_loop_frame);
}

#[test]
fn relay() {
    replay("relay", checks::relay);
}

#[test]
fn path_send() {
    replay("path_send", checks::path_send);
}
