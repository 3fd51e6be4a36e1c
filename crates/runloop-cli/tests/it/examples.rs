//! The agent guide's examples, run the way the guide runs them: each
//! `runloop serve --agent '…=exec:…'` line of `docs/agents.md` is started,
//! the guide's `runloop run` transcript is replayed against it and must print
//! what the guide shows, and every ending the examples have (finished, fatal,
//! refused) is checked with `--json` and its exit code. So the guide cannot
//! rot: change an example or the CLI, and this fails until the guide says
//! what they now do.
//!
//! The examples need `python3` and `node` on the PATH (`.ci/run` installs
//! them), and the Rust one built (`cargo test --workspace` builds it; alone:
//! `cargo build -p runloop --example echo_agent`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use runloop_testkit::process::KillOnDrop;
use runloop_testkit::{Part, command, document, needs};
use serde_json::{Value, json};

/// Where the guide's `runloop serve` listens (its default address).
const GUIDE_URL: &str = "ws://127.0.0.1:7878";

/// The workspace's root, where the guide's commands are run.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn guide() -> String {
    std::fs::read_to_string(root().join("docs/agents.md")).expect("docs/agents.md")
}

/// A command line of the guide split into words: bare words and
/// single-quoted strings, as a POSIX shell reads them.
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                word.get_or_insert_with(String::new);
            }
            ' ' if !quoted => words.extend(word.take()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    assert!(!quoted, "unbalanced quote in {line:?}");
    words.extend(word);
    words
}

/// The SPECs of the guide's `runloop serve --agent SPEC` lines, each once.
fn served_specs(guide: &str) -> Vec<String> {
    let mut specs: Vec<String> = Vec::new();
    for rest in guide
        .lines()
        .filter_map(|line| line.strip_prefix("$ runloop serve "))
    {
        let spec = match words(rest).as_slice() {
            [disk, unenforced, flag, spec]
                if disk == "--exec-disk" && unenforced == "unenforced" && flag == "--agent" =>
            {
                spec.clone()
            }
            other => panic!(
                "a serve line of the guide is not `--exec-disk unenforced --agent SPEC`: {other:?}"
            ),
        };
        if !specs.contains(&spec) {
            specs.push(spec);
        }
    }
    specs
}

/// One `$ runloop run …` command of the guide's transcript (its arguments
/// after `run`) and the output it shows.
struct Shown {
    args: Vec<String>,
    output: String,
}

/// The transcript: the console block after the `<!-- transcript -->` marker.
fn transcript() -> Vec<Shown> {
    document::transcript(&document::marked_block("docs/agents.md", "transcript"))
        .into_iter()
        .map(|shown| Shown {
            args: words(
                shown
                    .command
                    .strip_prefix("runloop run ")
                    .unwrap_or_else(|| panic!("not a `runloop run`: {}", shown.command)),
            ),
            output: shown.output,
        })
        .collect()
}

/// `runloop serve` on a loopback port with one agent; killed when dropped.
struct Served {
    _child: KillOnDrop,
    url: String,
}

impl Served {
    fn new(spec: &str) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_runloop"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--exec-disk",
                "unenforced",
            ])
            .args(["--agent", spec])
            .current_dir(root())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("runloop serve starts");
        let url = command::first_line(&mut child);
        assert!(url.starts_with("ws://"), "{spec}: {url:?}");
        Served {
            _child: KillOnDrop(child),
            url,
        }
    }

    /// `runloop run ARGS…`, with the guide's URL replaced by this server's:
    /// exit code, stdout, stderr.
    fn run(&self, args: &[String]) -> (Option<i32>, String, String) {
        let args = args
            .iter()
            .map(|arg| if arg == GUIDE_URL { &self.url } else { arg });
        let output = Command::new(env!("CARGO_BIN_EXE_runloop"))
            .arg("run")
            .args(args)
            .current_dir(root())
            .output()
            .expect("runloop run runs");
        crate::said(&output)
    }
}

/// The spec a guide line names, made runnable here: the guide's
/// `target/debug/` is this build's own directory.
fn runnable(spec: &str) -> String {
    let built = Path::new(env!("CARGO_BIN_EXE_runloop"))
        .parent()
        .expect("the binary's directory")
        .to_str()
        .expect("a UTF-8 path");
    assert!(
        !built.contains(char::is_whitespace),
        "exec: splits at whitespace; build in a directory without any: {built}"
    );
    spec.replace("exec:target/debug/", &format!("exec:{built}/"))
}

fn check_requirements(spec: &str) {
    let program = spec
        .split_once("=exec:")
        .and_then(|(_, command)| command.split_whitespace().next())
        .expect("an exec: spec");
    match program {
        // Asked for by the test before anything starts (`needs`).
        "python3" | "node" => {}
        path => {
            let path = Path::new(path);
            assert!(
                path.is_file(),
                "{} is not built: cargo build -p runloop --example echo_agent \
                 (cargo test --workspace builds it)",
                path.display()
            );
            let source = root().join("crates/runloop/examples/echo_agent.rs");
            let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
            assert!(
                modified(path) >= modified(&source),
                "{} is older than its source: cargo build -p runloop --example echo_agent",
                path.display()
            );
        }
    }
}

/// The `--json` lines of a run.
fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
        .collect()
}

fn text(text: &str) -> Value {
    json!({"chunk": {"type": "assistant_text_content", "text": text}})
}

#[test]
fn every_example_of_the_guide_runs_as_the_guide_says() {
    if !needs(&[
        Part::program("python3", "python3"),
        Part::program("node", "nodejs"),
    ]) {
        return;
    }
    let guide = guide();
    let specs = served_specs(&guide);
    assert_eq!(
        specs,
        [
            "echo=exec:python3 docs/examples/agent.py",
            "echo=exec:node docs/examples/agent.mjs",
            "echo=exec:target/debug/examples/echo_agent",
        ],
        "the guide serves its three examples"
    );
    let shown = transcript();
    assert!(shown.len() >= 3, "the transcript shows the three endings");

    let usage = json!({"chunk": {"type": "usage", "prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}});
    let fatal = json!({"chunk": {"type": "notification", "is_fatal": true, "message": "the echo agent was asked to fail"}});
    let empty = json!({"error": {"kind": "agent", "status": 400, "error": {"kind": "echo", "error": "the prompt is empty"}}});
    let endings: [(&str, i32, Vec<Value>); 3] = [
        (
            "hello world",
            0,
            vec![
                text("hello"),
                text(" world"),
                usage,
                json!({"outcome": "finished"}),
            ],
        ),
        (
            "one two fail three",
            6,
            vec![
                text("one"),
                text(" two"),
                fatal,
                json!({"outcome": "finished", "fatal": true}),
            ],
        ),
        (" ", 3, vec![empty, json!({"outcome": "no_loop"})]),
    ];

    for spec in &specs {
        let spec = runnable(spec);
        check_requirements(&spec);
        let served = Served::new(&spec);
        for Shown { args, output } in &shown {
            let (code, stdout, stderr) = served.run(args);
            assert_eq!(
                format!("{stdout}{stderr}"),
                *output,
                "{spec}: `runloop run {}` (exit {code:?})",
                args.join(" ")
            );
        }
        for (prompt, exit, lines) in &endings {
            let (code, stdout, stderr) = served
                .run(&["--url", GUIDE_URL, "--json", "--image", "echo", prompt].map(String::from));
            assert_eq!(code, Some(*exit), "{spec}: {prompt:?}: {stdout}{stderr}");
            assert_eq!(json_lines(&stdout), *lines, "{spec}: {prompt:?}");
        }
    }
}
