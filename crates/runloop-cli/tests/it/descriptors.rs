//! `runloop serve` and its descriptor limit: raised to the hard limit at
//! startup, and a `--max-connections` and `--max-runs` that cannot fit in
//! it refused.

use runloop_testkit::command;

/// `runloop serve ARGS…` under `ulimit -S SOFT -H HARD` (descriptors), run
/// to its end: exit code, stdout and stderr.
fn serve_limited(soft: u32, hard: u32, args: &str) -> std::process::Output {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -Sn {soft} && ulimit -Hn {hard} && exec \"$0\" serve --listen 127.0.0.1:0 {args}"
        ))
        .arg(env!("CARGO_BIN_EXE_runloop"))
        .env("RUST_LOG", "error")
        .env_remove("RUNLOOP_TOKEN")
        .output()
        .expect("sh runs")
}

#[test]
fn a_max_connections_that_cannot_fit_is_refused_saying_what_it_needs() {
    let output = serve_limited(
        256,
        1024,
        "--max-connections 256 --max-unauthorized 256 --max-runs 64 --max-loops-per-identity 64",
    );
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(output.stdout.is_empty(), "it never listened");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "runloop: --max-connections 256, --max-unauthorized 256, --max-runs 64 and \
         --max-loops-per-identity 64 (1 identity: 64 loops) need 1088 descriptors (1 per \
         connection, 4 per run, 4 per loop, 64 for the server itself), but RLIMIT_NOFILE allows \
         1024 (the hard limit): lower the limits, or raise the hard limit (ulimit -Hn as root, \
         LimitNOFILE= in a systemd unit)\n"
    );
}

#[test]
fn every_identity_s_loops_are_counted() {
    let limits = "--max-connections 100 --max-unauthorized 10 --max-runs 10 \
                  --max-loops-per-identity 100";
    // Two tokens' 200 loops would fit (64 + 110 + 4 × 10 + 4 × 200 =
    // 1014); three tokens' 300 do not.
    let output = serve_limited(
        1024,
        1024,
        &format!("{limits} --token a --token b --token c"),
    );
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "--max-loops-per-identity 100 (3 identities: 300 loops) need 1414 descriptors"
        ),
        "{stderr}"
    );
}

#[test]
fn the_soft_limit_is_raised_to_the_hard_one() {
    // 700 connections, 200 not yet authorized, 7 runs and 7 loops fit in
    // 1024 descriptors, not in a soft limit of 256.
    let (mut child, _) = command::serve_under(
        &["-Sn 256", "-Hn 1024"],
        "error",
        "--max-connections 700 --max-unauthorized 200 --max-runs 7 --max-loops-per-identity 7",
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).expect("limits");
    let open_files = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .expect("a descriptor limit");
    assert_eq!(
        open_files.split_whitespace().collect::<Vec<_>>(),
        ["Max", "open", "files", "1024", "1024", "files"]
    );
    let _ = child.kill();
    let _ = child.wait();
}
