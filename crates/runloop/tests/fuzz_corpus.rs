//! The connection fuzz target's committed corpus, replayed through the same
//! harness on stable `cargo test`: every seed (and every crash found and
//! fixed, kept as a seed) must play clean. See `fuzz-server/src/lib.rs` for
//! what the harness checks.

#[path = "../../../fuzz-server/src/lib.rs"]
mod harness;

#[test]
fn the_committed_connection_corpus_plays_clean() {
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
    let mut outcomes = std::collections::BTreeSet::new();
    for seed in seeds {
        let input = std::fs::read(&seed).expect("a seed");
        let played = harness::run(&input);
        println!("{}: {played:?}", seed.display());
        outcomes.extend(played.outcomes);
    }
    // The seeds reach every ending a loop can have.
    assert_eq!(
        outcomes.into_iter().collect::<Vec<_>>(),
        ["finished", "no_loop", "not_served", "unfinished"]
    );
}
