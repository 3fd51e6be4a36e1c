//! The exec runtime with real child processes: small python3 agent
//! programs under `tests/fixtures/` that serve HTTP and SSE on `$PORT`.
//! Each test checks what became of the child: reaped (`/proc/<pid>` gone),
//! and no descendant left running. Where the machine has cgroups (root,
//! as CI runs), each run has its own, and the tests check what it holds.

use std::time::Duration;

use runloop::proto::run_loop::Outcome;
use runloop::runtime::{
    Confinement, Container, ContainerLimits, DiskPolicy, Exec, ExecConfig, ExecContainer,
    ExecNetwork, Runtime,
};
use runloop_testkit::logs::Logs;
use runloop_testkit::path::{End, error_json, exchange, outcome, register};
use runloop_testkit::process::reaped;

const GIB: u64 = 1 << 30;

/// Waits, within a generous bound, until `pid` is no longer a running
/// process (gone, or a zombie that is not ours to reap).
async fn wait_dead(pid: u32) -> bool {
    for _ in 0..2000 {
        if dead(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Whether `pid` is gone or a zombie.
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| matches!(state, 'Z' | 'X')),
    }
}

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn limits(memory: u64) -> ContainerLimits {
    ContainerLimits::new(memory, 0)
}

/// An exec runtime whose runs' `disk` is accepted unenforced.
fn exec<S: Into<String>>(program: &str, args: impl IntoIterator<Item = S>) -> Exec {
    Exec::new(program, args).with_disk(DiskPolicy::Unenforced)
}

/// Whether this machine gives exec runs cgroups (root, memory and pids
/// controllers); the tests that need them say so when it does not.
/// Whether this machine gives exec runs cgroups; where it does, the
/// runtime must agree.
fn cgroups() -> bool {
    if !runloop_testkit::needs(&[runloop_testkit::Part::Cgroups]) {
        return false;
    }
    assert!(
        matches!(Confinement::host(), Confinement::Cgroups(_)),
        "cgroups are here but the runtime does not use them: {:?}",
        Confinement::host()
    );
    true
}

fn pidfile(test: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("runloop-{test}-{}.pid", std::process::id()))
}

fn read_pids(path: &std::path::Path) -> Vec<u32> {
    let text = std::fs::read_to_string(path).expect("the fixture wrote its pids");
    text.split_whitespace()
        .map(|pid| pid.parse().expect("a pid"))
        .collect()
}

/// The log of this test binary, shared by its tests.
fn logs() -> Logs {
    static LOGS: std::sync::OnceLock<Logs> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| Logs::global(tracing::Level::INFO))
        .clone()
}

#[tokio::test]
async fn a_child_serves_loops_and_stop_terminates_and_reaps_it() {
    let logs = logs();

    let exec = exec("python3", [fixture("sse_agent.py")]);
    let container = exec.spawn(limits(GIB)).await.expect("starts");
    let pid = container.pid();
    assert!(!reaped(pid), "the child runs");
    match container.cgroup() {
        Some(cgroup) => {
            assert_eq!(cgroup.procs(), [pid], "the child is in the run's cgroup");
            let dir = format!("/sys/fs/cgroup/memory/{}", cgroup.path());
            let limit = std::fs::read_to_string(format!("{dir}/memory.limit_in_bytes"))
                .or_else(|_| {
                    std::fs::read_to_string(format!("/sys/fs/cgroup/{}/memory.max", cgroup.path()))
                })
                .expect("a memory limit");
            assert_eq!(
                limit.trim(),
                "1073741824",
                "the memory limit is the cgroup's"
            );
        }
        None => assert_eq!(
            data_limit(pid),
            "1073741824",
            "the memory limit is RLIMIT_DATA"
        ),
    }

    let url = container.proxy_url().to_owned();
    register(&url).await;
    // The fixture writes the prompt the way python's json.dumps does,
    // escapes and all; that is what must arrive.
    for (prompt, quoted) in [("first", r#""first""#), ("second é", r#""second \u00e9""#)] {
        let ask = serde_json::to_vec(&serde_json::json!({ "prompt": prompt })).expect("JSON");
        let done = exchange(&url, "/agent/run", &ask).await;
        assert_eq!(done.end, End::Clean);
        assert_eq!(
            done.messages,
            [
                b"\x00{\"type\":\"assistant_reasoning\", \"text\" : \"reading\"}".to_vec(),
                format!("\x00{{\"type\":\"assistant_text_content\",\"text\":{quoted}}}").into_bytes(),
                b"\x00{\"type\":\"usage\",\"completion_tokens\":2,\"prompt_tokens\":1,\"total_tokens\":3}"
                    .to_vec(),
            ],
            "the bytes the agent program wrote, unchanged"
        );
        assert_eq!(outcome(&done).1, Outcome::Finished { fatal: false });
    }

    let cgroup = container.cgroup().cloned();
    let how = container.terminate().await;
    assert_eq!(how, "the agent program was stopped: killed by signal 15");
    assert!(reaped(pid), "the child is reaped once stop resolves");
    if let Some(cgroup) = cgroup {
        assert!(cgroup.leftovers().is_empty(), "the run's cgroup is removed");
    }
    let text = logs.text();
    let ours = |stream: &str, words: &str| {
        text.lines().any(|line| {
            line.contains(&format!("pid={pid} stream=\"{stream}\"")) && line.contains(words)
        })
    };
    assert!(
        ours("stdout", "sse agent listening on"),
        "stdout is logged line by line:\n{text}"
    );
    assert!(
        ours("stderr", "\"POST /run HTTP/1.1\" 200"),
        "stderr is logged line by line:\n{text}"
    );
}

#[tokio::test]
async fn a_child_that_ignores_sigterm_is_killed_with_its_group() {
    let path = pidfile("stubborn");
    let exec = exec(
        "python3",
        [fixture("ignores_sigterm.py"), path.display().to_string()],
    )
    .with_grace(Duration::from_millis(200));
    let container = exec.spawn(limits(GIB)).await.expect("starts");
    let pids = read_pids(&path);
    let _ = std::fs::remove_file(&path);
    let [child, grandchild] = pids[..] else {
        panic!("two pids: {pids:?}");
    };
    assert_eq!(child, container.pid());
    assert!(!reaped(grandchild), "the grandchild runs");

    let how = container.terminate().await;
    assert_eq!(how, "the agent program was stopped: killed by signal 9");
    assert!(reaped(child), "the child is reaped");
    assert!(
        wait_dead(grandchild).await,
        "the grandchild, in the child's group, is killed too"
    );
}

#[tokio::test]
async fn a_child_that_dies_mid_loop_ends_the_loop_and_the_container() {
    let exec = exec("python3", [fixture("dies_mid_stream.py")]);
    let mut container = exec.spawn(limits(GIB)).await.expect("starts");
    let pid = container.pid();
    let url = container.proxy_url().to_owned();
    register(&url).await;

    let done = exchange(&url, "/agent/run", br#"{"prompt":"x"}"#).await;
    assert_eq!(done.end, End::Clean);
    assert_eq!(done.messages.len(), 3, "two chunks, then the error");
    let error = error_json(&done.messages[2]);
    assert_eq!(error["kind"], "agent");
    assert_eq!(
        error["error"], "the agent program exited (exit status 3) before its /run body ended",
        "the runtime's words, not the HTTP client's"
    );
    let (chunks, result) = outcome(&done);
    assert_eq!(chunks.len(), 2);
    assert_eq!(result.name(), "unfinished");

    let reason = container.ended().await;
    assert_eq!(reason, "the agent program exited by itself: exit status 3");
    assert!(reaped(pid), "reaped as soon as it ended");
    // `ended` is cancel-safe and may be asked again.
    assert_eq!(container.ended().await, reason);
    assert_eq!(container.terminate().await, reason);
}

#[tokio::test]
async fn a_child_that_exits_before_listening_fails_the_start() {
    let path = pidfile("early-exit");
    let script = "import os, sys\nopen(sys.argv[1], 'w').write(str(os.getpid()))\nsys.exit(7)";
    let exec = exec("python3", ["-c", script, &path.display().to_string()]);
    let error = exec
        .start(limits(GIB))
        .await
        .expect_err("the child exits first");
    let pids = read_pids(&path);
    let _ = std::fs::remove_file(&path);
    let message = error.to_string();
    assert!(
        message.starts_with("the agent program exited before it listened on 127.0.0.1:")
            && message.ends_with(": exit status 7 (its output is in the server's log)"),
        "{message}"
    );
    assert!(reaped(pids[0]), "the child is reaped");
}

#[tokio::test]
async fn a_memory_limit_too_small_to_start_in_fails_the_start() {
    let exec = exec("python3", [fixture("sse_agent.py")]);
    let error = exec
        .start(limits(1 << 20))
        .await
        .expect_err("python3 cannot start in 1 MiB of data");
    assert!(
        error
            .to_string()
            .starts_with("the agent program exited before it listened"),
        "{error}"
    );
}

#[tokio::test]
async fn a_child_that_never_listens_is_killed_when_the_start_times_out() {
    let path = pidfile("silent");
    let script =
        "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(600)";
    let exec = exec("python3", ["-c", script, &path.display().to_string()])
        // Room for python3 to start and write its pid even on a busy machine.
        .with_startup_timeout(Duration::from_secs(2));
    let error = exec.start(limits(GIB)).await.expect_err("never listens");
    let pids = read_pids(&path);
    let _ = std::fs::remove_file(&path);
    assert!(
        error.to_string().contains("did not listen on 127.0.0.1:"),
        "{error}"
    );
    assert!(reaped(pids[0]), "the child is killed and reaped");
}

#[tokio::test]
async fn a_program_that_cannot_be_started() {
    let exec = exec("/nonexistent/agent-program", Vec::<String>::new());
    let error = exec.start(limits(GIB)).await.expect_err("no such program");
    assert_eq!(
        error.to_string(),
        "cannot start the agent program \"/nonexistent/agent-program\": No such file or directory (os error 2)"
    );
}

#[tokio::test]
async fn a_container_dropped_without_stop_still_ends_its_child() {
    let exec = exec("python3", [fixture("sse_agent.py")]);
    let container = exec.spawn(limits(GIB)).await.expect("starts");
    let pid = container.pid();
    drop(container);
    assert!(wait_dead(pid).await, "the child is terminated");
    for _ in 0..2000 {
        if reaped(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the child {pid} was not reaped");
}

/// The child's `RLIMIT_DATA`, as `/proc/PID/limits` writes it.
fn data_limit(pid: u32) -> String {
    let proc_limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let data = proc_limits
        .lines()
        .find(|line| line.starts_with("Max data size"))
        .expect("a data limit");
    let words: Vec<&str> = data.split_whitespace().collect();
    assert_eq!(words[3], words[4], "soft and hard: {data}");
    words[3].to_owned()
}

#[tokio::test]
async fn without_cgroups_the_memory_limit_is_rlimit_data() {
    let exec = exec("python3", [fixture("sse_agent.py")]).with_config(ExecConfig {
        disk: DiskPolicy::Unenforced,
        confinement: Some(Confinement::Rlimit("a test without cgroups".into())),
        ..ExecConfig::default()
    });
    let container = exec.spawn(limits(GIB)).await.expect("starts");
    assert!(container.cgroup().is_none());
    let pid = container.pid();
    assert_eq!(data_limit(pid), "1073741824");
    container.terminate().await;
    assert!(reaped(pid));
}

#[tokio::test]
async fn a_run_s_disk_is_refused_unless_the_operator_accepts_it_unenforced() {
    let refusing = Exec::new("python3", [fixture("sse_agent.py")]);
    let error = refusing
        .start(ContainerLimits::new(GIB, 64 << 20))
        .await
        .expect_err("disk cannot be held");
    assert_eq!(
        error.to_string(),
        "disk 67108864 bytes cannot be held for an exec agent program (a host process writes \
         wherever its user may); this server refuses exec runs that ask for disk until its \
         operator accepts that (runloop serve --exec-disk unenforced); disk 0 goes ahead"
    );
    assert!(
        refusing
            .caveat()
            .is_some_and(|why| why.starts_with("every run that asks for disk will be refused")),
        "said at startup"
    );
    // Disk 0 asks nothing that needs holding.
    let nothing = refusing
        .spawn(ContainerLimits::new(GIB, 0))
        .await
        .expect("disk 0 runs under --exec-disk refuse");
    nothing.terminate().await;
    let accepting = refusing.with_disk(DiskPolicy::Unenforced);
    assert_eq!(accepting.caveat(), None);
    let container = accepting
        .spawn(ContainerLimits::new(GIB, 64 << 20))
        .await
        .expect("runs, disk unenforced");
    container.terminate().await;
}

#[tokio::test]
async fn a_descendant_that_leaves_the_session_does_not_outlive_the_stop() {
    if !cgroups() {
        return;
    }
    let path = pidfile("escapes");
    let exec = exec(
        "python3",
        [fixture("escapes.py"), path.display().to_string()],
    )
    .with_grace(Duration::from_millis(200));
    let container = exec.spawn(limits(GIB)).await.expect("starts");
    let pids = read_pids(&path);
    let _ = std::fs::remove_file(&path);
    let [child, escaped] = pids[..] else {
        panic!("two pids: {pids:?}");
    };
    assert!(!reaped(escaped), "the escaped child runs");
    let group = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let (_, rest) = stat.rsplit_once(')').expect("a stat line");
        rest.split_whitespace().nth(2).expect("pgrp").to_owned()
    };
    assert_ne!(
        group(escaped),
        group(child),
        "it left the child's process group"
    );

    container.terminate().await;
    assert!(reaped(child));
    assert!(
        wait_dead(escaped).await,
        "the escaped child is killed with the run's cgroup"
    );
}

#[tokio::test]
async fn shared_memory_counts_against_the_limit() {
    if !cgroups() {
        return;
    }
    // 1 GiB of shared anonymous memory under a 256 MiB limit: RLIMIT_DATA
    // would not count it; the cgroup kills the program at the limit.
    let exec = exec("python3", [fixture("hog.py"), "shared".to_owned()]);
    let error = exec
        .start(limits(256 << 20))
        .await
        .expect_err("killed at the limit");
    let message = error.to_string();
    assert!(
        message.starts_with("the agent program exited before it listened")
            && message.contains("killed by signal 9; it ran out of memory"),
        "{message}"
    );
}

#[tokio::test]
async fn children_count_against_the_limit_together() {
    if !cgroups() {
        return;
    }
    // 8 children of 200 MiB each under a 256 MiB limit: each is within a
    // per-process limit; together the cgroup holds them to 256 MiB.
    let report = pidfile("forks");
    let exec = exec(
        "python3",
        [
            fixture("hog.py"),
            "forks".to_owned(),
            report.display().to_string(),
        ],
    );
    let container = exec.spawn(limits(256 << 20)).await.expect("starts");
    let alive: u32 = std::fs::read_to_string(&report)
        .expect("the fixture reported")
        .trim()
        .parse()
        .expect("a count");
    let _ = std::fs::remove_file(&report);
    let cgroup = container.cgroup().cloned().expect("a cgroup");
    let peak = cgroup.peak_memory().expect("a peak");
    let kills = cgroup.oom_kills().expect("an OOM count");
    container.terminate().await;
    println!(
        "8 children of 200 MiB under 256 MiB: {alive} alive, {kills} OOM kills, peak {} MiB",
        peak >> 20
    );
    assert!(
        alive <= 1,
        "{alive} children of 200 MiB outlived a 256 MiB limit"
    );
    assert!(peak <= 256 << 20, "peak {peak} bytes");
    assert!(kills >= 7, "{kills} OOM kills");
}

/// What `reach.py` wrote: its `$PORT` and whether it reached the host's
/// listener.
async fn reach(
    host_port: u16,
    network: ExecNetwork,
    report: &std::path::Path,
) -> (String, ExecContainer) {
    let exec = exec(
        "python3",
        [
            fixture("reach.py"),
            report.display().to_string(),
            host_port.to_string(),
        ],
    )
    .with_config(ExecConfig {
        disk: DiskPolicy::Unenforced,
        network,
        ..ExecConfig::default()
    });
    let container = exec.spawn(limits(GIB)).await.expect("starts");
    let said = std::fs::read_to_string(report).expect("the fixture reported");
    let _ = std::fs::remove_file(report);
    (said, container)
}

#[tokio::test]
async fn each_run_listens_on_a_loopback_of_its_own_and_reaches_nothing_of_the_hosts() {
    if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
        return;
    }
    // A service of the host, on its loopback.
    let host = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    host.set_nonblocking(true).expect("non-blocking");
    let host_port = host.local_addr().expect("address").port();
    let (first, a) = reach(host_port, ExecNetwork::Own, &pidfile("reach-a")).await;
    let (second, b) = reach(host_port, ExecNetwork::Own, &pidfile("reach-b")).await;
    // Both on the same port, each on its own loopback, neither reaching
    // the host's service.
    assert_eq!(first, "8080 refused");
    assert_eq!(second, "8080 refused");
    assert!(
        host.accept().is_err(),
        "no run connected to the host's service"
    );
    // Each serves its own loops, through its own proxy.
    for container in [&a, &b] {
        let url = container.proxy_url().to_owned();
        register(&url).await;
        let done = exchange(&url, "/agent/run", br#"{"prompt":"mine"}"#).await;
        assert_eq!(done.end, End::Clean);
        assert_eq!(outcome(&done).1, Outcome::Finished { fatal: false });
    }
    assert_ne!(a.proxy_url(), b.proxy_url());
    let (pid_a, pid_b) = (a.pid(), b.pid());
    a.terminate().await;
    b.terminate().await;
    assert!(reaped(pid_a) && reaped(pid_b));

    // On the host's network (the operator's opt-in) the same program
    // reaches the host's service, on a port of the host's loopback.
    let (said, host_run) = reach(host_port, ExecNetwork::Host, &pidfile("reach-host")).await;
    let (port, outcome) = said.split_once(' ').expect("port and outcome");
    assert_eq!(outcome, "connected");
    assert_ne!(port, "8080");
    host_run.terminate().await;
}
