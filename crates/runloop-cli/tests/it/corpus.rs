//! The shared corpus (`corpus/` at the repository's root), read by the
//! Rust client through `runloop run`: each capture played by `runloop
//! __replay` over a real socket, and what `run --json` and `run
//! --transcript` print held to the case's expectations. The Python
//! package (python/tests/test_corpus.py) and the TypeScript package
//! (typescript/test/corpus.test.ts) are held to the same files.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use runloop_testkit::command::{run, runloop, url};
use runloop_testkit::process::KillOnDrop;
use serde_json::Value;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../corpus")
}

/// Object members whose value is `null` removed, everywhere: an absent
/// optional member and a `null` one mean the same (protocol §8), and the
/// clients may write either in a transcript.
fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(members) => Value::Object(
            members
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

fn check_case(base: &str, name: &str, expected: &Value) {
    let at = format!("{base}/{name}");
    let (status, stdout, stderr) = run(&["run", "--url", &at, "--json", "--disk", "0", "hi"]);
    if let Some(start) = expected.get("start") {
        if let Some(error) = start.get("refused") {
            assert_eq!(status.code(), Some(7), "{name}: {stderr}");
            let said = stderr
                .split_once("the run was refused: ")
                .unwrap_or_else(|| panic!("{name}: {stderr}"))
                .1;
            let said: Value = serde_json::from_str(said.trim()).expect("the refusal's JSON");
            assert_eq!(&said, error, "{name}");
        } else {
            assert!(stderr.contains("did not serve the run"), "{name}: {stderr}");
        }
        return;
    }
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{name}: {line}: {e}")))
        .collect();
    let (ending, events) = lines.split_last().expect("an outcome line");
    let wanted: Vec<Value> = expected["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|event| match event.get("chunk") {
            Some(Value::String(json)) => {
                serde_json::json!({"chunk": serde_json::from_str::<Value>(json).expect("chunk JSON")})
            }
            _ => event.clone(),
        })
        .collect();
    assert_eq!(events, wanted, "{name}: the events");
    let outcome = &expected["outcome"];
    assert_eq!(ending["outcome"], outcome["kind"], "{name}: {ending}");
    assert_eq!(
        ending
            .get("fatal")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        outcome["fatal"].as_bool().expect("fatal"),
        "{name}: {ending}"
    );
    if let Some(reason) = outcome["reason"].as_str() {
        let said = ending["reason"].as_str().unwrap_or_default();
        assert!(
            said.starts_with(reason),
            "{name}: {said:?} is not {reason:?}…"
        );
    }

    let (_, stdout, stderr) = run(&["run", "--url", &at, "--transcript", "--disk", "0", "hi"]);
    let document: Value = serde_json::from_str(stdout.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{name}: {stdout} {stderr}: {e}"));
    assert_eq!(
        without_nulls(&document["transcript"]),
        without_nulls(&expected["transcript"]),
        "{name}: the transcript"
    );
    if !outcome["error"].is_null() {
        assert_eq!(document["error"], outcome["error"], "{name}: the error");
    }
}

/// `runloop __replay` over the corpus, killed when the test ends, and the
/// URL it serves the cases under.
fn replay() -> (KillOnDrop, String) {
    let mut child = runloop()
        .args(["__replay"])
        .arg(corpus())
        .stdout(Stdio::piped())
        .spawn()
        .expect("runloop __replay starts");
    let base = url(&mut child);
    (KillOnDrop(child), base)
}

#[test]
fn the_rust_client_reads_every_case_of_the_corpus_as_expected() {
    let (mut replay, base) = replay();
    let mut names: Vec<String> = std::fs::read_dir(corpus())
        .expect("the corpus")
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            (path.extension()? == "json").then(|| path.file_stem()?.to_str().map(str::to_owned))?
        })
        .collect();
    names.sort();
    assert!(names.len() >= 40, "the corpus: {names:?}");
    for name in &names {
        let text = std::fs::read_to_string(corpus().join(format!("{name}.json"))).expect("a case");
        let expected: Value = serde_json::from_str(&text).expect("the case's JSON");
        check_case(&base, name, &expected);
    }
    // The replay served every case without a client going astray.
    assert!(replay.try_wait().expect("waitable").is_none());
}

#[test]
fn an_unknown_case_is_refused_before_the_upgrade() {
    let (_replay, base) = replay();
    let (status, _, stderr) = run(&["run", "--url", &format!("{base}/no_such_case"), "hi"]);
    assert_ne!(status.code(), Some(0));
    assert!(stderr.contains("404"), "{stderr}");
}
