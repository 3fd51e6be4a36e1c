//! The tests of the `runloop` command, in one binary: one link instead
//! of one per file. Each module was a test file of its own; they share
//! the testkit's `command` (starting `runloop serve` and `runloop run`,
//! reading their output) with the binaries beside this one, and its
//! `loads` with `benches/figures/`, which runs them at full size. The
//! container tests (`tests/containers`) and the operator
//! tests (`tests/operate`) stay binaries of their own: each is already
//! one binary of many modules, with helpers of its own.

mod admission;
mod budget;
mod check;
mod cli;
mod conventions;
mod corpus;
mod decode;
mod descriptors;
mod docs;
mod ends;
mod examples;
mod exec;
mod limits;
mod logs;
mod memory;
mod messages;
mod origins;
mod outgoing;
mod pipes;
mod run;
mod run_options;
mod store;
mod tenants;
mod tokens;

/// The `runloop` under test as assert_cmd runs it (the testkit's binary),
/// with nothing of the test's environment that would change what it does
/// or prints: no credential, no colour switch (a test sets its own).
fn runloop() -> assert_cmd::Command {
    let mut command = runloop_testkit::command::runloop();
    command
        .env_remove("RUNLOOP_TOKEN")
        .env_remove("NO_COLOR")
        .env_remove("CLICOLOR_FORCE");
    assert_cmd::Command::from_std(command)
}

/// `runloop ARGS…` ([`runloop`]) run to its end: what it did and printed.
fn runloop_output(args: &[&str]) -> std::process::Output {
    runloop().args(args).output().expect("runloop runs")
}

/// `runloop ARGS…` ([`runloop`]) exits 0 and says nothing on stderr: its
/// stdout.
fn stdout_of(args: &[&str]) -> String {
    let output = runloop()
        .args(args)
        .assert()
        .code(0)
        .stderr("")
        .get_output()
        .clone();
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// `runloop ARGS…` fails as a command (exit code 2: bad arguments,
/// unreadable input), with nothing on stdout and `words` on stderr; for
/// more checks of what it said.
fn exits_2_saying(args: &[&str], words: &str) -> assert_cmd::assert::Assert {
    runloop()
        .args(args)
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicates::str::contains(words))
}

/// What a finished command did and said: its exit code, stdout, stderr.
fn said(output: &std::process::Output) -> (Option<i32>, String, String) {
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
