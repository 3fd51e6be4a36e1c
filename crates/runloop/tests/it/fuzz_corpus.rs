//! The connection fuzz targets' committed corpus, replayed through the same
//! harnesses on stable `cargo test`: every seed (and every crash found and
//! fixed, kept as a seed) must play clean, against a whole server connection
//! and against the connection table in memory. See `fuzz-server/src/lib.rs`
//! for what the harnesses check.

#[path = "../../../../fuzz-server/src/lib.rs"]
mod harness;

/// The committed seeds, by name.
fn seeds() -> Vec<std::path::PathBuf> {
    let corpus = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz-server/corpus/connection"
    );
    let mut seeds: Vec<_> = std::fs::read_dir(corpus)
        .expect("the corpus directory")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("seed-"))
        })
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 10, "the seeds are there: {seeds:?}");
    seeds
}

/// Plays every seed with `play`; the endings the loops reached.
fn play_all(play: impl Fn(&[u8]) -> harness::Played) -> Vec<&'static str> {
    let mut outcomes = std::collections::BTreeSet::new();
    for seed in seeds() {
        let input = std::fs::read(&seed).expect("a seed");
        let played = play(&input);
        println!("{}: {played:?}", seed.display());
        outcomes.extend(played.outcomes);
    }
    outcomes.into_iter().collect()
}

#[test]
fn the_committed_connection_corpus_plays_clean() {
    let outcomes = play_all(harness::play);
    // The seeds reach every ending a loop can have.
    assert_eq!(
        outcomes,
        ["finished", "no_loop", "not_served", "unfinished"]
    );
}

#[test]
fn the_committed_connection_corpus_plays_clean_against_the_table() {
    let outcomes = play_all(harness::table::play);
    assert_eq!(
        outcomes,
        ["finished", "no_loop", "not_served", "unfinished"]
    );
}
