//! The `runloop` binary's shape: help for every subcommand, exit code 2 for
//! bad arguments, and the schema document.

use crate::{exits_2_saying, runloop, runloop_output, stdout_of};
use predicates::prelude::*;
use serde_json::Value;

const SUBCOMMANDS: [&str; 10] = [
    "run",
    "serve",
    "proxy",
    "agent",
    "decode",
    "schema",
    "check",
    "bench",
    "completions",
    "man",
];

#[test]
fn help_works_for_the_command_and_every_subcommand() {
    runloop()
        .arg("--help")
        .assert()
        .code(0)
        .stdout(predicate::str::contains("Usage: runloop <COMMAND>"))
        .stdout(predicate::str::contains("Exit codes: 0 finished"))
        .stderr("");
    for subcommand in SUBCOMMANDS {
        runloop()
            .args([subcommand, "--help"])
            .assert()
            .code(0)
            .stdout(predicate::str::contains(format!(
                "Usage: runloop {subcommand}"
            )))
            .stderr("");
        runloop()
            .args(["help", subcommand])
            .assert()
            .code(0)
            .stdout(predicate::str::contains(format!(
                "Usage: runloop {subcommand}"
            )));
    }
    runloop()
        .args(["decode", "--help"])
        .assert()
        .stdout(predicate::str::contains("Capture format:"))
        .stdout(predicate::str::contains("--payloads"));
}

#[test]
fn bad_arguments_exit_2_with_usage_on_stderr() {
    for args in [
        &[][..],
        &["frobnicate"],
        &["decode", "--nope"],
        &["decode", "a", "b"],
        &["schema", "extra"],
    ] {
        exits_2_saying(args, "Usage: runloop");
    }
}

/// What `git ARGS…` prints in the workspace, if git runs there.
fn git(args: &[&str]) -> Option<String> {
    let output = std::process::Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    let version = stdout_of(&["--version"]);
    let expected = format!("runloop {}", env!("CARGO_PKG_VERSION"));
    match git(&["log", "-1", "--format=%h %cs"]) {
        // Built from this checkout: the commit and its date. (A build from
        // a tarball has no git, and prints the version alone.)
        Some(commit) => assert_eq!(version, format!("{expected} ({commit})\n")),
        None => assert_eq!(version, format!("{expected}\n")),
    }
    // Each subcommand has it too.
    runloop()
        .args(["run", "--version"])
        .assert()
        .code(0)
        .stdout(predicate::str::starts_with("runloop-run 0"));
}

#[test]
fn completions_for_each_shell() {
    for (shell, marker, capture) in [
        ("bash", "complete -F _runloop", "--capture"),
        ("zsh", "#compdef runloop", "--capture"),
        ("fish", "complete -c runloop", "-l capture"),
        ("powershell", "Register-ArgumentCompleter", "--capture"),
    ] {
        let script = stdout_of(&["completions", shell]);
        assert!(script.contains(marker), "{shell}: {script}");
        // Made from the arguments: subcommands and their flags are in it.
        for word in ["decode", capture, "payloads"] {
            assert!(script.contains(word), "{shell} lacks {word}");
        }
    }
    exits_2_saying(
        &["completions", "tcsh"],
        "possible values: bash, zsh, fish, powershell",
    );
}

#[test]
fn bash_accepts_its_completion_script() {
    let output = runloop_output(&["completions", "bash"]);
    let dir = tempfile::tempdir().expect("a scratch directory");
    let script = dir.path().join("runloop.bash");
    std::fs::write(&script, &output.stdout).expect("written");
    // Sourced by a real bash, then asked to complete `runloop dec` as bash
    // asks a completion function: the command, the word, the word before.
    let probe = format!(
        "source {}; COMP_WORDS=(runloop dec); COMP_CWORD=1; _runloop runloop dec runloop; \
         echo \"${{COMPREPLY[@]}}\"",
        script.display()
    );
    let Ok(completed) = std::process::Command::new("bash")
        .args(["-c", &probe])
        .output()
    else {
        panic!("bash runs");
    };
    assert!(completed.status.success(), "{completed:?}");
    assert_eq!(String::from_utf8_lossy(&completed.stdout).trim(), "decode");
}

#[test]
fn man_pages() {
    let page = stdout_of;
    let main = page(&["man"]);
    assert!(main.contains(".TH runloop 1"), "{main}");
    assert!(main.contains("decode"), "{main}");
    let run = page(&["man", "run"]);
    assert!(run.contains(".TH runloop-run 1"), "{run}");
    assert!(run.contains("\\-\\-capture"), "{run}");
    // Issue 30 §10: every header field in its place (date, source,
    // manual), and options in the SYNOPSIS with their values' names.
    let header = run
        .lines()
        .find(|line| line.starts_with(".TH "))
        .expect("a header");
    let fields: Vec<&str> = header.split('"').collect();
    assert_eq!(fields.len(), 7, "three quoted fields: {header}");
    assert!(
        fields[1].is_empty() || fields[1].len() == 10 && fields[1].as_bytes()[4] == b'-',
        "the date field holds a date, not the version: {header}"
    );
    assert!(fields[3].starts_with("runloop 0."), "{header}");
    let synopsis = run
        .split(".SH SYNOPSIS\n")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .expect("a SYNOPSIS");
    for shown in [
        r"[\fB\-\-url\fR \fIURL\fR]",
        r"[\fB\-\-ca\fR \fIFILE\fR]…",
        r"[\fB\-v\fR|\fB\-\-verbose\fR]",
        r"[\fIPROMPT\fR]",
    ] {
        assert!(synopsis.contains(shown), "{shown} in {synopsis}");
    }
    runloop()
        .args(["man", "nope"])
        .assert()
        .code(2)
        .stderr("runloop: runloop has no subcommand \"nope\" (see runloop --help)\n");

    // A directory that is not there yet (a fresh home's man1) is made.
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let dir = scratch.path().join("share/man/man1");
    runloop()
        .args(["man", "--dir"])
        .arg(&dir)
        .assert()
        .code(0)
        .stdout("");
    for name in [
        "runloop.1",
        "runloop-run.1",
        "runloop-decode.1",
        "runloop-agent-demo.1",
    ] {
        let text =
            std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{name}");
    }
    assert!(
        !dir.join("runloop-__forward.1").exists(),
        "the hidden subcommand has no page"
    );
}

/// Every `$ref` in `value`.
fn refs<'a>(value: &'a Value, found: &mut Vec<&'a str>) {
    match value {
        Value::Object(members) => {
            if let Some(Value::String(target)) = members.get("$ref") {
                found.push(target);
            }
            members.values().for_each(|member| refs(member, found));
        }
        Value::Array(items) => items.iter().for_each(|item| refs(item, found)),
        _ => {}
    }
}

#[test]
fn schema_is_one_json_schema_document_with_the_ten_kinds() {
    let text = stdout_of(&["schema"]);
    let schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );

    // The root is the chunk: one alternative per kind, told apart by its
    // `type` constant, which is required.
    let kinds: Vec<&str> = schema["oneOf"]
        .as_array()
        .expect("oneOf")
        .iter()
        .map(|kind| {
            assert_eq!(kind["required"], serde_json::json!(["type"]), "{kind}");
            kind["properties"]["type"]["const"]
                .as_str()
                .expect("a type constant")
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "assistant_reasoning",
            "assistant_text_content",
            "assistant_refusal",
            "assistant_tool_call",
            "assistant_image_content",
            "assistant_audio_content",
            "tool_response",
            "user",
            "usage",
            "notification",
        ]
    );

    // Required members are required, optional ones are not (protocol §8).
    let defs = &schema["$defs"];
    let required = |name: &str| defs[name]["required"].clone();
    assert_eq!(required("TextChunk"), serde_json::json!(["text"]));
    assert_eq!(required("ToolCallChunk"), serde_json::json!(["id", "name"]));
    assert_eq!(
        required("MediaChunk"),
        serde_json::json!(["data", "mimeType"])
    );
    assert_eq!(
        required("ToolResponseChunk"),
        serde_json::json!(["id", "content"])
    );
    assert_eq!(required("UserChunk"), serde_json::json!(["prompt"]));
    assert_eq!(
        required("UsageChunk"),
        serde_json::json!(["completion_tokens", "prompt_tokens", "total_tokens"])
    );
    assert_eq!(
        required("NotificationChunk"),
        serde_json::json!(["is_fatal", "message"])
    );
    for optional in ["annotations", "_meta", "parent_tool_call_id", "logprobs"] {
        assert!(
            defs["TextChunk"]["properties"].get(optional).is_some(),
            "{optional}"
        );
    }
    // Unknown members are tolerated, so no kind forbids them.
    assert!(!text.contains("\"additionalProperties\": false"));

    // The error value is any JSON value: no constraint at all.
    let error = defs["Error"].as_object().expect("$defs/Error");
    assert!(
        error
            .keys()
            .all(|key| key == "description" || key == "title"),
        "{error:?}"
    );

    // Every reference resolves inside the document.
    let mut found = Vec::new();
    refs(&schema, &mut found);
    assert!(!found.is_empty());
    for target in found {
        let name = target.strip_prefix("#/$defs/").expect("a local reference");
        assert!(defs.get(name).is_some(), "{target} does not resolve");
    }
}
