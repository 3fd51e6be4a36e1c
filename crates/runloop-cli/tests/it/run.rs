//! `runloop run`, `serve`, `proxy`, `agent demo` and `bench`, as a user
//! runs them: the built binary, real processes, real sockets.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use crate::{runloop, runloop_output};
use runloop_testkit::command;
use runloop_testkit::process::KillOnDrop;
use serde_json::Value;

/// The JSON lines of `run --json`.
fn json_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
        .collect()
}

/// `output` exited with `code`, and its stderr says `words`.
fn exited_saying(output: &std::process::Output, code: i32, words: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    assert!(stderr.contains(words), "{stderr}");
}

/// A long-running subcommand, stopped with SIGTERM when dropped.
struct Running {
    child: KillOnDrop,
    /// The first line it printed: its URL.
    url: String,
}

impl Running {
    fn start(args: &[&str]) -> Running {
        Running::start_with(args, &[])
    }

    fn start_with(args: &[&str], env: &[(&str, &str)]) -> Running {
        let mut child = Command::new(env!("CARGO_BIN_EXE_runloop"))
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts");
        let url = command::first_line(&mut child);
        Running {
            child: KillOnDrop(child),
            url,
        }
    }

    /// Sends SIGTERM and returns the exit code.
    fn terminate(mut self) -> Option<i32> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        self.child.wait().expect("exits").code()
    }
}

#[test]
fn run_shows_every_ending_of_the_demo_with_its_exit_code() {
    for (prompt, code, outcome) in [
        ("hello there", 0, "finished"),
        ("hello demo:break", 1, "unfinished"),
        ("hello demo:refuse", 3, "no_loop"),
        ("hello demo:fatal", 6, "finished"),
    ] {
        let output = runloop_output(&["run", "--json", prompt]);
        assert_eq!(output.status.code(), Some(code), "{prompt}: {output:?}");
        let lines = json_lines(&output.stdout);
        let last = lines.last().expect("an outcome line");
        assert_eq!(last["outcome"], outcome, "{prompt}");
        assert_eq!(last.get("fatal").is_some(), code == 6, "{prompt}: {last}");
        let errors = lines.iter().filter(|l| l.get("error").is_some()).count();
        assert_eq!(errors, usize::from(code == 1 || code == 3), "{prompt}");
        let chunks = lines.iter().filter(|l| l.get("chunk").is_some()).count();
        assert_eq!(chunks > 0, code != 3, "{prompt}");
    }
}

#[test]
fn run_renders_plain_text_when_stdout_is_not_a_terminal() {
    let output = runloop_output(&["run", "three little words"]);
    assert_eq!(output.status.code(), Some(0));
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    let notes = String::from_utf8(output.stderr).expect("UTF-8");
    for shown in [&text, &notes] {
        assert!(
            !shown.contains('\x1b'),
            "no escape codes in a pipe: {shown:?}"
        );
    }
    assert!(text.contains("tool call word_count"), "{text}");
    // stdout holds the loop; the usage and the ending are notes, on stderr.
    assert!(
        !text.contains("usage:") && !text.contains("the loop"),
        "{text}"
    );
    assert_eq!(
        notes,
        "usage: 25 tokens (3 prompt, 22 completion)\nthe loop finished\n"
    );
}

#[test]
fn run_reads_the_prompt_from_standard_input() {
    let output = runloop()
        .args(["run", "--json"])
        .write_stdin("from standard input\n")
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0));
    let text = String::from_utf8_lossy(&output.stdout);
    // The demo counts what it was given: the line, without its newline.
    assert!(text.contains("3 words, 19 characters"), "{text}");
}

#[test]
fn a_capture_decodes_to_the_same_loop_run_printed() {
    let dir = std::env::temp_dir().join(format!("runloop-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let capture = dir.join("loop.capture");
    let run = runloop()
        .args(["run", "--json", "--token", "s3cret-token", "--capture"])
        .arg(&capture)
        .arg("capture me demo:break")
        .output()
        .expect("runs");
    assert_eq!(run.status.code(), Some(1));
    let recorded = std::fs::read_to_string(&capture).expect("a capture");
    assert!(
        !recorded.contains(&hex("s3cret-token")),
        "the credential is not recorded"
    );
    let decode = runloop()
        .arg("decode")
        .arg(&capture)
        .output()
        .expect("decodes");
    assert_eq!(
        decode.status.code(),
        Some(1),
        "decode exits with the same ending"
    );
    let ran = json_lines(&run.stdout);
    // The loop's lines: decode also has a line for each other frame.
    let decoded: Vec<Value> = json_lines(&decode.stdout)
        .into_iter()
        .filter(|line| {
            ["chunk", "error", "outcome"]
                .iter()
                .any(|m| line.get(m).is_some())
        })
        .map(|mut line| {
            let object = line.as_object_mut().expect("an object");
            assert_eq!(object.remove("scope"), Some(Value::from(0)));
            assert_eq!(object.remove("channel"), Some(Value::from(0)));
            assert!(object.remove("time").is_some_and(|time| time.is_f64()));
            line
        })
        .collect();
    assert_eq!(decoded, ran, "the capture holds exactly what run printed");
    std::fs::remove_dir_all(&dir).ok();
}

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn run_fails_clearly_when_it_cannot_run() {
    let output = runloop_output(&["run", "--url", "ws://127.0.0.1:1", "hi"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("runloop: cannot connect to ws://127.0.0.1:1"),
        "{stderr}"
    );

    let output = runloop_output(&["run", "--agent-json", "{nope", "hi"]);
    exited_saying(&output, 2, "--agent-json is not JSON");

    // A refused run has a code of its own.
    let output = runloop_output(&["run", "--image", "unknown", "hi"]);
    exited_saying(
        &output,
        7,
        "image \\\"unknown\\\" is not in this server's catalog",
    );
}

#[test]
fn serve_checks_tokens_and_shuts_down_on_sigterm() {
    let output = runloop_output(&["serve", "--listen", "0.0.0.0:0"]);
    exited_saying(&output, 2, "without a token");

    let server = Running::start_with(
        &["serve", "--listen", "127.0.0.1:0"],
        &[("RUNLOOP_TOKEN", "right")],
    );
    assert!(server.url.starts_with("ws://127.0.0.1:"), "{}", server.url);
    let ok = runloop_output(&["run", "--url", &server.url, "--token", "right", "hi"]);
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
    let wrong = runloop_output(&["run", "--url", &server.url, "--token", "wrong", "hi"]);
    exited_saying(&wrong, 7, "is the credential right?");
    assert_eq!(server.terminate(), Some(0), "a clean shutdown");
}

#[test]
fn run_says_why_when_the_server_turns_it_away() {
    let server = Running::start(&["serve", "--listen", "127.0.0.1:0", "--max-connections", "1"]);
    // One connection through its WebSocket handshake holds the only slot.
    let addr = server.url.trim_start_matches("ws://");
    let mut holding = std::net::TcpStream::connect(addr).expect("connects");
    write!(
        holding,
        "GET / HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .expect("writes");
    let mut status = String::new();
    BufReader::new(&holding)
        .read_line(&mut status)
        .expect("reads");
    assert!(status.starts_with("HTTP/1.1 101"), "{status}");

    let output = runloop_output(&["run", "--url", &server.url, "hi"]);
    exited_saying(&output, 7, "try again later (close code 1013)");
}

#[test]
fn check_passes_against_serve() {
    let server = Running::start(&["serve", "--listen", "127.0.0.1:0"]);
    let output = runloop_output(&["check", "--url", &server.url]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(!text.contains("FAIL"), "{text}");
}

#[test]
fn serve_runs_exec_and_attached_agents_made_of_this_binary() {
    let exe = env!("CARGO_BIN_EXE_runloop");
    // exec: the server starts `runloop agent demo` as a child for each run.
    let exec = format!("demo=exec:{exe} agent demo");
    let server = Running::start(&["serve", "--listen", "127.0.0.1:0", "--agent", &exec]);
    let output = runloop_output(&["run", "--json", "--url", &server.url, "through exec"]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "no disk, the default: {output:?}"
    );
    // A run that asks for a disk, which an exec program cannot be held to.
    let with_disk = |url: &str| {
        runloop_output(&[
            "run",
            "--json",
            "--url",
            url,
            "--disk",
            "1G",
            "through exec",
        ])
    };
    exited_saying(
        &with_disk(&server.url),
        7,
        "cannot be held for an exec agent program (a host process writes wherever its user \
         may); this server refuses exec runs that ask for disk until its operator accepts \
         that (runloop serve --exec-disk unenforced); disk 0 goes ahead",
    );
    drop(server);
    let server = Running::start(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--exec-disk",
        "unenforced",
        "--agent",
        &exec,
    ]);
    let output = with_disk(&server.url);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    drop(server);

    // attach: a standalone agent program and proxy, as in a container.
    let agent = Running::start(&["agent", "demo", "--listen", "127.0.0.1:0"]);
    let port = agent.url.rsplit(':').next().expect("a port").to_owned();
    let proxy = Running::start(&["proxy", "--listen", "127.0.0.1:0", "--agent-port", &port]);
    let attach = format!("demo=proxy:{}", proxy.url);
    let server = Running::start(&["serve", "--listen", "127.0.0.1:0", "--agent", &attach]);
    let output = runloop_output(&["run", "--json", "--url", &server.url, "through a proxy"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(proxy.terminate(), Some(0));
    assert_eq!(agent.terminate(), Some(0));
}

/// Runs `runloop bench ARGS --json`, which must exit 0, and returns its
/// output, its stdout and the JSON object on its last line.
fn bench(args: &[&str]) -> (std::process::Output, String, Value) {
    let output = runloop()
        .arg("bench")
        .args(args)
        .arg("--json")
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let last = serde_json::from_str(text.lines().last().expect("a JSON line")).expect("JSON");
    (output, text, last)
}

/// The arguments of a bench small enough for a test: two loops of 50
/// chunks, two rounds of no set length.
const SMALL: [&str; 8] = [
    "--loops",
    "2",
    "--chunks",
    "50",
    "--duration",
    "0",
    "--rounds",
    "2",
];

/// Every loop of each of `sides` read whole and in order, in both phases:
/// with [`SMALL`], two loops of 50 chunks once per round.
fn every_chunk_read(last: &Value, sides: [&str; 3]) {
    for side in [last, &last["paced"]] {
        for name in sides {
            assert_eq!(side[name]["chunks"], 200, "{name} in {side}");
            assert_eq!(side[name]["disorder"], 0, "{name} in {side}");
            assert_eq!(side[name]["failed_loops"], 0, "{name} in {side}");
        }
    }
}

/// Each of `keys` is a figure, above zero.
fn figures(last: &Value, keys: &[&str]) {
    for key in keys {
        assert!(
            last[key].as_f64().is_some_and(|v| v > 0.0),
            "{key} in {last}"
        );
    }
}

/// Each of `lines` is said in `text` (one explanation per ratio).
fn explained(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(text.contains(line), "{line} in {text}");
    }
}

#[test]
fn bench_smoke_prints_its_figures_as_json() {
    let (output, text, last) = bench(&SMALL);
    figures(
        &last,
        &[
            "relay_ratio",
            "latency_p50_ratio",
            "relay_chunks_per_s",
            "baseline_chunks_per_s",
            "server_peak_rss_mib",
            "relay_vs_direct",
            "relay_paced_latency_p50_ratio",
        ],
    );
    every_chunk_read(&last, ["relay", "baseline", "direct"]);
    // Rounds this short use too few clock ticks of CPU time to be a figure
    // (a unit test of runloop-bench measures a busy process): null, or a
    // time.
    for cpu in [
        &last["relay_cpu_per_chunk_ratio"],
        &last["relay"]["cpu_us_per_chunk"],
        &last["baseline"]["cpu_us_per_chunk"],
    ] {
        assert!(
            cpu.is_null() || cpu.as_f64().is_some_and(|v| v > 0.0),
            "{last}"
        );
    }
    assert!(last.get("relay_cpu_per_chunk_ratio").is_some(), "{last}");
    assert!(last["direct"]["cpu_us_per_chunk"].is_null(), "{last}");
    explained(
        &text,
        &[
            "relay/baseline throughput",
            "relay/baseline CPU per chunk",
            "relay/direct throughput",
        ],
    );
    let warned = String::from_utf8_lossy(&output.stderr).contains("debug build");
    assert_eq!(warned, cfg!(debug_assertions), "{output:?}");
    assert_eq!(last["debug_build"], cfg!(debug_assertions));
}

#[test]
fn bench_shares_connections_among_loops_and_checks_every_chunk() {
    let (_, _, last) = bench(&[
        "--loops",
        "40",
        "--connections",
        "4",
        "--chunks",
        "20",
        "--duration",
        "0",
        "--rounds",
        "1",
        "--pace",
        "0",
    ]);
    assert_eq!(last["connections"], 4);
    assert_eq!(last["relay"]["loops"], 40);
    assert_eq!(last["relay"]["chunks"], 800);
    assert_eq!(last["relay"]["disorder"], 0);
    assert!(last["paced"].is_null(), "--pace 0: no paced phase: {last}");
    assert!(last["relay_paced_latency_p50_ratio"].is_null(), "{last}");
}

#[test]
fn bench_opens_more_connections_at_once_than_a_default_server_takes_from_one_address() {
    // 24 connections at once from one address, two rounds: more than a
    // server lets one address hold unauthorized by default (16), so the
    // server the bench starts must be told otherwise, and have room for
    // what the first round still holds when the second begins.
    let (_, _, last) = bench(&[
        "--loops",
        "48",
        "--connections",
        "24",
        "--chunks",
        "10",
        "--duration",
        "0",
        "--rounds",
        "2",
        "--pace",
        "0",
    ]);
    assert_eq!(last["relay"]["loops"], 96, "{last}");
    assert_eq!(last["relay"]["failed_loops"], 0, "{last}");
    assert_eq!(last["relay"]["disorder"], 0, "{last}");
}

/// The whole chain against nginx: every side's loops read whole and in
/// order, nginx and the server measured, each ratio printed.
#[test]
fn bench_chain_measures_the_whole_chain_against_nginx() {
    if !runloop_testkit::needs(&[runloop_testkit::Part::program("nginx", "nginx")]) {
        return;
    }
    let (_, text, last) = bench(&[&SMALL[..], &["--chain", "--pace", "500"]].concat());
    every_chunk_read(&last, ["chain", "nginx", "agent"]);
    figures(
        &last,
        &[
            "chain_ratio",
            "chain_vs_agent",
            "chain_paced_latency_p50_ratio",
        ],
    );
    assert!(
        last["skipped"].as_array().is_some_and(Vec::is_empty),
        "{last}"
    );
    assert!(last["agent"]["cpu_us_per_chunk"].is_null(), "{last}");
    explained(
        &text,
        &[
            "chain/nginx CPU per chunk",
            "chain/nginx throughput",
            "chain/nginx paced added",
        ],
    );
}
