//! The `runloop` binary's shape: help for every subcommand, exit code 2 for
//! bad arguments, and the schema document.

use assert_cmd::Command;
use predicates::prelude::*;
use serde_json::Value;

fn runloop() -> Command {
    Command::new(env!("CARGO_BIN_EXE_runloop"))
}

const SUBCOMMANDS: [&str; 8] = [
    "run", "serve", "proxy", "agent", "decode", "schema", "check", "bench",
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
        runloop()
            .args(args)
            .assert()
            .code(2)
            .stdout("")
            .stderr(predicate::str::contains("Usage: runloop"));
    }
}

#[test]
fn version_exits_0() {
    runloop()
        .arg("--version")
        .assert()
        .code(0)
        .stdout(format!("runloop {}\n", env!("CARGO_PKG_VERSION")));
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
    let output = runloop()
        .arg("schema")
        .assert()
        .code(0)
        .stderr("")
        .get_output()
        .clone();
    let schema: Value = serde_json::from_slice(&output.stdout).expect("the schema is JSON");
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
    assert!(!output_contains(
        &output.stdout,
        "\"additionalProperties\": false"
    ));

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

fn output_contains(bytes: &[u8], needle: &str) -> bool {
    String::from_utf8_lossy(bytes).contains(needle)
}
