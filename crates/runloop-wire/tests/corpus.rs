//! Replays the committed corpus of the fuzz target `ws_frames` through its
//! check, on stable: the frame layer against tungstenite, as it was fuzzed.

use std::fs;
use std::path::{Path, PathBuf};

#[path = "../../../fuzz/src/ws_frames.rs"]
mod ws_frames;

#[test]
fn ws_frames() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/ws_frames");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "the corpus is empty");
    let mut read = 0;
    for file in &files {
        let data = fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        match std::panic::catch_unwind(|| ws_frames::ws_frames(&data)) {
            Ok(true) => read += 1,
            Ok(false) => {}
            Err(_) => panic!("{} fails its check", file.display()),
        }
    }
    assert!(read > 0, "none of {} inputs was read", files.len());
}
