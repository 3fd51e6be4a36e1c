//! Agents in real containers, as a provider runs them: `runloop serve` with
//! `oci:` entries (and registry images) running under runc as root,
//! `runloop run` as the caller, and the kernel holding memory and disk.
//!
//! Every test starts its own server on its own store (runs have no address
//! on the host, so servers need nothing else apart). A [`Server`] is the
//! fixture: dropped, it stops its server and checks that nothing of its
//! runs is left on the machine — no runc container, cgroup, network
//! namespace, veth, egress link, nft table, mount, loop device or run
//! directory — so no test can forget to ask.

mod egress;
mod figures;
mod hostile;
mod images;
mod isolation;
mod packaging;
mod registry;
mod warm;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use images::Images;
use registry::LocalRegistry;
use runloop_oci::layout::Layout;
use runloop_testkit::command;
use serde_json::{Value, json};

/// The OCI runtime the suite runs under: `RUNLOOP_TEST_OCI_RUNTIME`
/// (`runc` unless set; `runsc` runs every test under gVisor).
fn oci_runtime() -> String {
    std::env::var("RUNLOOP_TEST_OCI_RUNTIME").unwrap_or_else(|_| "runc".to_owned())
}

/// Whether this machine can run the container tests: root, runc and the
/// tools that make a run's disk, network and images; says which part is
/// missing (`skipped: needs …`) when it cannot, a failure under
/// `RUNLOOP_REQUIRE_SYSTEM=1`.
fn ready() -> bool {
    runloop_testkit::needs(runloop_testkit::CONTAINERS)
}

/// [`ready`], and Debian's `docker-registry` for the tests that pull from
/// a real registry.
fn ready_with_registry() -> bool {
    ready() && runloop_testkit::needs(&[runloop_testkit::REGISTRY])
}

/// The test images, where this machine can run the container tests
/// ([`ready`]); `None` where it cannot (having said what it lacks).
fn images() -> Option<&'static Images> {
    ready().then(Images::get)
}

/// [`images`], where the machine has a registry too
/// ([`ready_with_registry`]).
fn images_with_registry() -> Option<&'static Images> {
    ready_with_registry().then(Images::get)
}

/// A `runloop serve` with a store of its own, run in its scratch directory
/// (where relative paths of its arguments point). The store lives as long
/// as this value, stopped or not.
///
/// Dropped while its server runs, it stops it ([`Server::stop`]: SIGTERM,
/// exit 0, nothing of its runs left). A test that stops it another way
/// ([`Server::take`] and a SIGKILL, [`Server::terminate`]) checks what it
/// expects itself; a test that has failed already only kills it.
struct Server {
    child: Mutex<Option<Child>>,
    url: String,
    store: PathBuf,
    log: PathBuf,
    _scratch: tempfile::TempDir,
}

impl Server {
    fn start(agents: &[String], extra: &[&str]) -> Server {
        let scratch = tempfile::tempdir().expect("temp");
        let store = scratch.path().join("store");
        Server::start_on(scratch, store, agents, extra)
    }

    fn start_on(
        scratch: tempfile::TempDir,
        store: PathBuf,
        agents: &[String],
        extra: &[&str],
    ) -> Server {
        Server::start_binary(
            env!("CARGO_BIN_EXE_runloop"),
            scratch,
            store,
            agents,
            extra,
            &[],
        )
    }

    /// [`Server::start`] with `env` in its environment.
    fn start_with_env(agents: &[String], extra: &[&str], env: &[(&str, &str)]) -> Server {
        let scratch = tempfile::tempdir().expect("temp");
        let store = scratch.path().join("store");
        Server::start_binary(
            env!("CARGO_BIN_EXE_runloop"),
            scratch,
            store,
            agents,
            extra,
            env,
        )
    }

    /// [`Server::start_on`] with another `runloop` binary (another build,
    /// for a figure measured before and after a change), and `env`.
    fn start_binary(
        binary: &str,
        scratch: tempfile::TempDir,
        store: PathBuf,
        agents: &[String],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Server {
        let log = scratch
            .path()
            .join(format!("serve-{}.log", runloop_oci::random_name()));
        let mut command = Command::new(binary);
        command
            .current_dir(scratch.path())
            .args(["serve", "--listen", "127.0.0.1:0", "--store"])
            .arg(&store)
            .args(["--container-grace", "1"]);
        if !extra.contains(&"--oci-runtime") {
            command.args(["--oci-runtime", &oci_runtime()]);
        }
        for agent in agents {
            command.args(["--agent", agent]);
        }
        let mut child = command
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("serve starts");
        let url = command::first_line(&mut child);
        let server = Server {
            child: Mutex::new(Some(child)),
            url: url.trim().to_owned(),
            store,
            log,
            _scratch: scratch,
        };
        if server.url.is_empty() {
            let status = server.take().map(|mut child| child.wait());
            panic!("serve did not start ({status:?}):\n{}", server.log());
        }
        server
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `runloop run --json` against this server.
    fn run(&self, image: &str, memory: &str, disk: &str, prompt: &str) -> Output {
        run_against(&self.url, image, memory, disk, prompt)
    }

    /// Waits (`limit` at most) until the server's log says `words`; fails
    /// with the log if it never does.
    fn logs_within(&self, limit: std::time::Duration, words: &str) {
        assert!(
            isolation::wait_until(limit, || self.log().contains(words)),
            "never logged {words:?}:\n{}",
            self.log()
        );
    }

    /// The server's process id.
    fn pid(&self) -> u32 {
        self.child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .expect("running")
            .id()
    }

    /// The server's process, taken (to stop it).
    fn take(&self) -> Option<Child> {
        self.child.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Stops the server with SIGTERM and checks what a stop promises: it
    /// exits 0, and nothing of any run its log names is left ([`leftovers`],
    /// and the runs' egress links).
    fn stop(&self) {
        let code = self.terminate();
        assert_eq!(code, Some(0), "serve's exit\n{}", self.log());
        assert_eq!(self.left(), Vec::<String>::new(), "{}", self.log());
    }

    /// What of its runs is on the machine, in words: [`leftovers`] of the
    /// keys its log names, and the egress links it logged.
    fn left(&self) -> Vec<String> {
        let log = self.log();
        let mut left = leftovers(&self.store, &self.keys());
        for link in egress::links(&log) {
            if egress::link_exists(&link.link) {
                left.push(format!("egress link {link:?}"));
            }
        }
        left
    }

    /// Stops the server with SIGTERM; returns its exit code.
    fn terminate(&self) -> Option<i32> {
        let mut child = self.take().expect("running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        child.wait().expect("exits").code()
    }

    /// The run keys (container `runloop-KEY`) the server's log names.
    fn keys(&self) -> Vec<String> {
        let log = self.log();
        let mut keys: Vec<String> = log
            .match_indices("key=")
            .filter_map(|(at, _)| log.get(at + 4..at + 16))
            .filter(|key| key.bytes().all(|b| b.is_ascii_hexdigit()))
            .map(str::to_owned)
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let running = self
            .child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if !running {
            return;
        }
        if std::thread::panicking() {
            // The test failed already: leave no server behind, and no
            // second panic over what it left.
            if let Some(mut child) = self.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            return;
        }
        self.stop();
    }
}

/// The command `runloop run --json` of a registry image, not yet run.
fn pull_command(url: &str, reference: &str, prompt: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_runloop"));
    command.args([
        "run",
        "--json",
        "--url",
        url,
        "--registry-image",
        reference,
        "--memory",
        "128M",
        "--disk",
        "8M",
        prompt,
    ]);
    command
}

/// `runloop run --json` of a registry image.
fn pull_and_run(url: &str, reference: &str, prompt: &str) -> Output {
    pull_command(url, reference, prompt)
        .output()
        .expect("run runs")
}

fn run_against(url: &str, image: &str, memory: &str, disk: &str, prompt: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runloop"))
        .args([
            "run", "--json", "--url", url, "--image", image, "--memory", memory, "--disk", disk,
            prompt,
        ])
        .output()
        .expect("run runs")
}

/// Checks that the `runloop run` of `output` exited `code`; where it did
/// not, says what it and `server` said.
fn exited(output: &Output, code: i32, server: &Server) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "{output:?}\n{}",
        server.log()
    );
}

/// The JSON lines of `run --json`.
fn json_lines(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
        .collect()
}

/// What of the runs `keys` (on `store`) is still on the machine, in words;
/// empty when nothing is.
fn leftovers(store: &Path, keys: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let mut containers = String::new();
    for runtime in ["runc", "runsc"] {
        if let Ok(listed) = Command::new(runtime).args(["list", "--quiet"]).output() {
            containers.push_str(&String::from_utf8_lossy(&listed.stdout));
        }
    }
    let netns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns");
    let netns = String::from_utf8_lossy(&netns.stdout).into_owned();
    let links = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .expect("ip link");
    let links = String::from_utf8_lossy(&links.stdout).into_owned();
    for key in keys {
        let id = format!("runloop-{key}");
        if containers.lines().any(|line| line == id) {
            found.push(format!("runc container {id}"));
        }
        if netns
            .lines()
            .any(|line| line.split_whitespace().next() == Some(id.as_str()))
        {
            found.push(format!("network namespace {id}"));
        }
        if links.contains(&format!(" rl{key}")) {
            found.push(format!("veth rl{key}"));
        }
        for controller in fs::read_dir("/sys/fs/cgroup").expect("cgroups").flatten() {
            let dir = controller.path().join(&id);
            if dir.exists() {
                found.push(format!("cgroup {}", dir.display()));
            }
        }
        // Below a tenant's cgroup, where runs are.
        if let Ok(version) = runloop_oci::cgroup::detect() {
            for cgroup in runloop_oci::cgroup::of_container(version, &id) {
                for dir in cgroup.leftovers() {
                    found.push(format!("cgroup {}", dir.display()));
                }
            }
        }
    }
    let mounts = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let store_text = store.display().to_string();
    for line in mounts.lines().filter(|line| line.contains(&store_text)) {
        found.push(format!("mount {line}"));
    }
    let losetup = Command::new("losetup")
        .args(["--list", "--noheadings", "--output", "NAME,BACK-FILE"])
        .output()
        .expect("losetup");
    for line in String::from_utf8_lossy(&losetup.stdout).lines() {
        if line.contains(&store_text) {
            found.push(format!("loop device {line}"));
        }
    }
    if egress::table_exists(store) {
        found.push(format!("nft table {}", runloop_oci::egress::table(store)));
    }
    if let Ok(runs) = fs::read_dir(store.join("runs")) {
        for run in runs.flatten() {
            found.push(format!("run directory {}", run.path().display()));
        }
    }
    found
}

/// The chunks of a `run --json` output, as the JSON text of each.
fn chunks(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|line| line.get("chunk"))
        .map(Value::to_string)
        .collect()
}

#[test]
fn a_loop_through_an_oci_image_is_the_builtin_loop_byte_for_byte() {
    let Some(images) = images() else {
        return;
    };
    let (layout, digest) = images.agent_layout("demo");
    let server = Server::start(&[format!("agents/demo=oci:{}", layout.display())], &[]);
    let prompt = "count these words please";
    let contained = server.run(&format!("agents/demo@{digest}"), "256M", "64M", prompt);
    exited(&contained, 0, &server);
    let builtin = Command::new(env!("CARGO_BIN_EXE_runloop"))
        .args(["run", "--json", prompt])
        .output()
        .expect("runs");
    assert_eq!(builtin.status.code(), Some(0), "{builtin:?}");
    let (contained_lines, builtin_lines) = (json_lines(&contained), json_lines(&builtin));
    assert!(chunks(&builtin_lines).len() > 3);
    assert_eq!(chunks(&contained_lines), chunks(&builtin_lines));
    assert_eq!(contained_lines.last(), builtin_lines.last());

    // A digest other than the layout's is refused; nothing starts.
    let other = format!("agents/demo@sha256:{}", "0".repeat(64));
    let refused = server.run(&other, "256M", "64M", prompt);
    assert_ne!(refused.status.code(), Some(0));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains(&format!("pinned to {digest}")), "{said}");

    assert_eq!(server.keys().len(), 1, "one container ran");
}

/// The error value of a `run --json` output, as text.
fn error_text(lines: &[Value]) -> String {
    lines
        .iter()
        .filter_map(|line| line.get("error"))
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A loop that the container's end cuts short after its one chunk, run
/// on `server`: the caller exits 1 and the outcome is unfinished. The
/// chunk's text, and the error's.
fn cut_short(
    server: &Server,
    image: &str,
    memory: &str,
    disk: &str,
    prompt: &str,
) -> (String, String) {
    let output = server.run(image, memory, disk, prompt);
    let lines = json_lines(&output);
    exited(&output, 1, server);
    let mut chunks = chunks(&lines);
    assert_eq!(chunks.len(), 1, "{lines:?}");
    assert_eq!(lines.last().expect("outcome")["outcome"], "unfinished");
    (chunks.remove(0), error_text(&lines))
}

#[test]
fn memory_past_the_limit_kills_the_container_and_the_error_names_memory() {
    let Some(images) = images() else {
        return;
    };
    let (hog, hog_digest) = images.hog_layout("memory");
    let (hungry, hungry_digest) = images.hog_layout("hungry");
    let (demo, demo_digest) = images.agent_layout("after-memory");
    let server = Server::start(
        &[
            format!("hog=oci:{}", hog.display()),
            format!("hungry=oci:{}", hungry.display()),
            format!("demo=oci:{}", demo.display()),
        ],
        &[],
    );
    // Newcomer G9: killed at the limit before it listened, the refusal
    // names memory too.
    let refused = server.run(&format!("hungry@{hungry_digest}"), "32M", "8M", "x");
    assert_eq!(refused.status.code(), Some(7), "{refused:?}");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains(
            "exited before it listened on 127.0.0.1:8080: killed by signal 9; it ran out of memory"
        ),
        "{said}\n{}",
        server.log()
    );

    // The loop said something, then ended without finishing.
    let (_, error) = cut_short(&server, &format!("hog@{hog_digest}"), "32M", "8M", "eat");
    assert!(error.contains("ran out of memory"), "{error}");
    assert!(error.contains("memory limit"), "{error}");

    // The server carries on.
    let after = server.run(
        &format!("demo@{demo_digest}"),
        "256M",
        "16M",
        "still serving?",
    );
    assert_eq!(after.status.code(), Some(0), "{after:?}");
    assert_eq!(server.keys().len(), 3);
}

#[test]
fn a_loop_cut_short_by_a_childs_memory_death_ends_the_container_naming_memory() {
    let Some(images) = images() else {
        return;
    };
    // The agent lives on and cuts its body short once a child of its was
    // killed at the limit: only the proxy's word of the lost connection
    // tells the runtime to look at the container's memory and end it.
    let (hog, digest) = images.hog_layout("child");
    let server = Server::start(&[format!("hog=oci:{}", hog.display())], &[]);
    let (_, error) = cut_short(&server, &format!("hog@{digest}"), "32M", "8M", "eat");
    assert!(
        error.contains("ran out of memory") && error.contains("memory limit"),
        "{error}\n{}",
        server.log()
    );
}

#[test]
fn an_agent_that_dies_mid_loop_is_reported_to_the_caller_in_words() {
    let Some(images) = images() else {
        return;
    };
    let (dies, digest) = images.hog_layout("dies");
    let server = Server::start(&[format!("dies=oci:{}", dies.display())], &[]);
    let (chunk, error) = cut_short(&server, &format!("dies@{digest}"), "64M", "4M", "x");
    assert!(chunk.contains("dying"), "{chunk}");
    // The runtime's words, not the HTTP client's account of a connection.
    assert!(
        error.contains("the agent program exited (exit status 3) before its /run body ended"),
        "{error}\n{}",
        server.log()
    );
    assert_eq!(server.keys().len(), 1, "one container ran");
}

/// The numbers the disk hog reports: (memory limit, tmp error, tmp bytes,
/// root error, root bytes).
fn disk_report(lines: &[Value]) -> (i64, String, u64, String, u64) {
    let text = lines
        .iter()
        .filter_map(|line| line.get("chunk"))
        .find_map(|chunk| chunk["text"].as_str())
        .expect("the hog's report")
        .to_owned();
    // memory limit M; tmp: E after N bytes; root: E after N bytes
    let words: Vec<&str> = text.split([' ', ';']).filter(|w| !w.is_empty()).collect();
    let number = |i: usize| words[i].parse::<i64>().unwrap_or_else(|_| panic!("{text}"));
    (
        number(2),
        words[4].to_owned(),
        number(6) as u64,
        words[9].to_owned(),
        number(11) as u64,
    )
}

fn tree_size(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let meta = entry.metadata().expect("metadata");
            total += if meta.is_dir() {
                tree_size(&entry.path())
            } else {
                meta.len()
            };
        }
    }
    total
}

#[test]
fn writing_past_disk_gets_enospc_and_nothing_outside_grows() {
    let Some(images) = images() else {
        return;
    };
    let (hog, digest) = images.hog_layout("disk");
    let server = Server::start(&[format!("hog=oci:{}", hog.display())], &[]);
    let before = (
        tree_size(&server.store.join("images")),
        tree_size(&server.store.join("layout")),
    );
    let disk: u64 = 8 << 20;
    let output = server.run(&format!("hog@{digest}"), "64M", "8M", "fill it");
    exited(&output, 0, &server);
    let (memory, tmp_error, tmp, root_error, root) = disk_report(&json_lines(&output));
    // gVisor shows no host cgroup inside: the limit is checked under runc.
    if oci_runtime() == "runc" {
        assert_eq!(
            memory,
            64 << 20,
            "the container's cgroup holds its memory limit"
        );
    }
    assert_eq!(
        (tmp_error.as_str(), root_error.as_str()),
        ("ENOSPC", "ENOSPC")
    );
    // Both /tmp and the root's writable layer are on the run's disk: each
    // filled it, and neither got more than it holds.
    for written in [tmp, root] {
        assert!(
            written <= disk,
            "{written} bytes written to an {disk}-byte disk"
        );
        assert!(
            written > disk / 2,
            "only {written} bytes fit on an {disk}-byte disk"
        );
    }
    let after = (
        tree_size(&server.store.join("images")),
        tree_size(&server.store.join("layout")),
    );
    assert_eq!(before, after, "the image and the blobs did not grow");
}

/// Processes whose command line is `/hog stubborn`.
fn stubborn_processes() -> usize {
    fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter(|entry| {
            fs::read(entry.path().join("cmdline"))
                .is_ok_and(|cmdline| cmdline == b"/hog\0stubborn\0")
        })
        .count()
}

#[test]
fn an_agent_that_ignores_sigterm_and_forks_is_killed_after_the_grace() {
    let Some(images) = images() else {
        return;
    };
    let (hog, digest) = images.hog_layout("stubborn");
    let server = Server::start(&[format!("hog=oci:{}", hog.display())], &[]);
    let output = server.run(&format!("hog@{digest}"), "64M", "4M", "stay");
    exited(&output, 0, &server);
    let log = server.log();
    assert!(
        log.contains("the container ignored its stop signal; killing every process in it"),
        "{log}"
    );
    assert_eq!(
        stubborn_processes(),
        0,
        "every process of the container is gone"
    );
}

#[test]
fn twenty_runs_at_once_each_with_its_own_limits() {
    let Some(images) = images() else {
        return;
    };
    let (hog, digest) = images.hog_layout("disk");
    let image = format!("hog@{digest}");
    // Twenty callers from one address authorize at once: more than the
    // per-address wall lets wait (16), which is not what this is about.
    let server = Server::start(
        &[format!("hog=oci:{}", hog.display())],
        &["--max-unauthorized-per-address", "32"],
    );
    let runs: Vec<(u64, u64)> = (0..20u64)
        .map(|i| ((32 + i) << 20, (2 << 20) + i * (256 << 10)))
        .collect();
    let outputs: Vec<Output> = std::thread::scope(|scope| {
        let handles: Vec<_> = runs
            .iter()
            .map(|(memory, disk)| {
                let (url, image) = (server.url.clone(), image.clone());
                scope.spawn(move || {
                    run_against(&url, &image, &memory.to_string(), &disk.to_string(), "fill")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("joined"))
            .collect()
    });
    for ((memory, disk), output) in runs.iter().zip(&outputs) {
        exited(output, 0, &server);
        let (limit, _, tmp, _, root) = disk_report(&json_lines(output));
        if oci_runtime() == "runc" {
            assert_eq!(limit as u64, *memory);
        }
        for written in [tmp, root] {
            assert!(
                written <= *disk && written > disk / 2,
                "{written} on {disk}"
            );
        }
    }
    assert_eq!(server.keys().len(), 20);
}

#[test]
fn a_server_killed_mid_run_is_cleaned_up_by_the_next_one() {
    let Some(images) = images() else {
        return;
    };
    let (demo, digest) = images.agent_layout("crash");
    let image = format!("demo@{digest}");
    let scratch = tempfile::tempdir().expect("temp");
    let store = scratch.path().join("store");
    let agents = [format!("demo=oci:{}", demo.display())];
    let server = Server::start_on(scratch, store.clone(), &agents, &[]);
    // A slow loop keeps the container running.
    let mut caller = Command::new(env!("CARGO_BIN_EXE_runloop"))
        .args([
            "run",
            "--json",
            "--url",
            &server.url,
            "--image",
            &image,
            "--memory",
            "128M",
            "--disk",
            "8M",
            "slow demo:pace=500 a b c d e f g h",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run starts");
    let first = command::first_line(&mut caller);
    assert!(first.contains("chunk"), "{first}");
    let keys = server.keys();
    assert_eq!(keys.len(), 1);
    // SIGKILL: nothing is stopped or removed.
    let mut child = server.take().expect("running");
    child.kill().expect("killed");
    child.wait().expect("reaped");
    let _ = caller.kill();
    let _ = caller.wait();
    let left = leftovers(&store, &keys);
    assert!(
        left.iter().any(|thing| thing.starts_with("runc container")),
        "{left:?}"
    );
    assert!(
        left.iter().any(|thing| thing.starts_with("mount")),
        "{left:?}"
    );

    // A server on another store is not disturbed by them: its runs have
    // nothing to share with theirs.
    let other = Server::start(&agents, &[]);
    let output = other.run(&image, "128M", "8M", "beside the leftovers");
    exited(&output, 0, &other);
    assert_eq!(
        chunks(&json_lines(&output)),
        builtin_chunks("beside the leftovers")
    );
    other.stop();

    // The next server on the store removes all of it before it serves.
    let scratch = tempfile::tempdir().expect("temp");
    let next = Server::start_on(scratch, store.clone(), &agents, &[]);
    assert_eq!(leftovers(&store, &keys), Vec::<String>::new());
    assert!(
        next.log()
            .contains("removing the leftovers of a run of an earlier server")
    );
    let output = next.run(&image, "128M", "8M", "after the crash");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    drop(server);
}

/// The builtin demo's chunks for `prompt`, the reference the containers
/// must match.
fn builtin_chunks(prompt: &str) -> Vec<String> {
    let builtin = Command::new(env!("CARGO_BIN_EXE_runloop"))
        .args(["run", "--json", prompt])
        .output()
        .expect("runs");
    chunks(&json_lines(&builtin))
}

#[test]
fn a_registry_image_runs_and_two_runs_at_once_pull_it_once() {
    let Some(images) = images_with_registry() else {
        return;
    };
    let (path, digest) = images.agent_layout("registry");
    let registry = LocalRegistry::start();
    registry.push(
        &Layout::open(&path).expect("layout"),
        &digest,
        "agents/demo",
        "1",
    );
    let server = Server::start(&[], &["--insecure-registry", &registry.host]);
    let reference = format!("{}/agents/demo:1", registry.host);
    let prompt = "pulled from a registry";
    let outputs: Vec<Output> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|_| scope.spawn(|| pull_and_run(&server.url, &reference, prompt)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("joined"))
            .collect()
    });
    let expected = builtin_chunks(prompt);
    for output in &outputs {
        exited(output, 0, &server);
        assert_eq!(chunks(&json_lines(output)), expected);
    }
    // Each blob came from the registry once.
    let manifest: Value = serde_json::from_slice(
        &fs::read(Layout::open(&path).expect("layout").blob_path(&digest)).expect("manifest"),
    )
    .expect("JSON");
    let blobs: Vec<&str> = std::iter::once(&manifest["config"])
        .chain(manifest["layers"].as_array().expect("layers"))
        .map(|descriptor| descriptor["digest"].as_str().expect("digest"))
        .collect();
    for blob in &blobs {
        assert_eq!(registry.gets(&format!("/blobs/{blob}")), 1, "{blob}");
    }
    // Pinned by digest and in the store: the registry is not asked at all.
    let manifests = registry.gets("/manifests/");
    let pinned = format!("{}/agents/demo@{digest}", registry.host);
    let output = pull_and_run(&server.url, &pinned, prompt);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(registry.gets("/manifests/"), manifests);
    // The store is an OCI layout that names what was pulled.
    let index = fs::read_to_string(server.store.join("layout/index.json")).expect("index");
    assert!(index.contains(&reference), "{index}");

    assert_eq!(server.keys().len(), 3);
}

/// A registry over HTTPS, pulled with the tree's one TLS stack (rustls with
/// `ring`, the platform's roots; no OpenSSL): trusted when the platform's
/// roots hold its authority (`SSL_CERT_FILE`, as the operator's machine
/// would), and refused, naming the certificate, when they do not.
#[test]
fn a_registry_over_https_is_pulled_when_its_authority_is_trusted() {
    let Some(images) = images_with_registry() else {
        return;
    };
    let (path, digest) = images.agent_layout("registry");
    let scratch = tempfile::tempdir().expect("temp");
    let storage = scratch.path().join("storage");
    // Pushed over plain HTTP, then served from the same storage over HTTPS.
    {
        let plain = LocalRegistry::start_at(&storage, None);
        plain.push(
            &Layout::open(&path).expect("layout"),
            &digest,
            "agents/demo",
            "1",
        );
    }
    let (ca, cert, key) = authority_and_certificate(scratch.path());
    let registry = LocalRegistry::start_at(&storage, Some((&cert, &key)));
    let reference = format!("{}/agents/demo:1", registry.host);
    let prompt = "pulled over https";
    let ca = ca.to_str().expect("UTF-8");

    let trusted = Server::start_with_env(
        &[],
        &["--registry", &registry.host],
        &[("SSL_CERT_FILE", ca)],
    );
    let output = pull_and_run(&trusted.url, &reference, prompt);
    exited(&output, 0, &trusted);
    assert_eq!(chunks(&json_lines(&output)), builtin_chunks(prompt));
    drop(trusted);

    // The platform's roots alone do not hold the test's authority.
    let untrusted = Server::start(&[], &["--registry", &registry.host]);
    let output = pull_and_run(&untrusted.url, &reference, prompt);
    let refused = refusal(&output);
    assert!(refused.contains("certificate"), "{refused}");
}

/// A certificate authority, and a certificate it signed for 127.0.0.1 and
/// localhost with its key: three PEM files in `dir`.
fn authority_and_certificate(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().expect("a key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).expect("the authority");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("a key");
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("params")
        .signed_by(&key, &issuer)
        .expect("a certificate");
    let write = |name: &str, pem: String| {
        let file = dir.join(name);
        fs::write(&file, pem).expect("a PEM file");
        file
    };
    (
        write("ca.pem", ca_cert.pem()),
        write("registry.pem", leaf.pem()),
        write("registry.key", key.serialize_pem()),
    )
}

/// The message of a refused run (`runloop run` exits 7 and says it).
fn refusal(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(7), "{output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn registry_images_are_refused_before_anything_starts() {
    let Some(images) = images_with_registry() else {
        return;
    };
    let (path, digest) = images.agent_layout("refusals");
    let layout = Layout::open(&path).expect("layout");
    let registry = LocalRegistry::start();
    registry.push(&layout, &digest, "agents/demo", "1");
    let server = Server::start(&[], &["--insecure-registry", &registry.host]);
    let host = &registry.host;

    let output = pull_and_run(&server.url, "127.0.0.1:9/agents/demo:1", "x");
    let said = refusal(&output);
    assert!(said.contains(r#""kind":"policy""#), "{said}");
    assert!(
        said.contains("registry 127.0.0.1:9 is not one this server pulls from"),
        "{said}"
    );

    let said = refusal(&pull_and_run(
        &server.url,
        &format!("{host}/agents/absent:1"),
        "x",
    ));
    assert!(said.contains("not found"), "{said}");
    // Newcomer G16: not the dangling "its manifest of …".
    assert!(
        said.contains(&format!("the manifest of {host}/agents/absent:1: ")),
        "{said}"
    );

    let wrong = format!("sha256:{}", "0".repeat(64));
    let said = refusal(&pull_and_run(
        &server.url,
        &format!("{host}/agents/demo:1@{wrong}"),
        "x",
    ));
    assert!(said.contains("not found"), "{said}");
    // A digest that breaks the rule is named by it (newcomer 2's fourth
    // guess: it read "invalid reference format").
    let said = refusal(&pull_and_run(
        &server.url,
        &format!("{host}/agents/demo:1@sha256:abc"),
        "x",
    ));
    assert!(
        said.contains(r#"digest \"sha256:abc\" is not sha256: and 64 lowercase hex digits"#),
        "{said}"
    );

    // A manifest whose bytes no longer match its digest.
    let (tampered_manifest, _) =
        images::write_image(&layout, "other", &[&images.hog], &["/hog", "disk"]);
    registry.push(&layout, &tampered_manifest, "agents/tampered-manifest", "1");
    registry.tamper_manifest(&tampered_manifest);
    let said = refusal(&pull_and_run(
        &server.url,
        &format!("{host}/agents/tampered-manifest:1"),
        "x",
    ));
    assert!(said.contains("digest mismatch"), "{said}");

    // A layer whose bytes no longer match its digest.
    let odd = images::layer(&[("odd", 0o644, b"a layer only this image has")]);
    let (tampered_layer, manifest) =
        images::write_image(&layout, "odd", &[&images.hog, &odd], &["/hog", "disk"]);
    registry.push(&layout, &tampered_layer, "agents/tampered-layer", "1");
    let parsed: Value = serde_json::from_slice(&manifest).expect("JSON");
    let odd_digest: runloop_oci::digest::Digest = parsed["layers"][1]["digest"]
        .as_str()
        .expect("digest")
        .parse()
        .expect("digest");
    registry.tamper(&odd_digest);
    let said = refusal(&pull_and_run(
        &server.url,
        &format!("{host}/agents/tampered-layer:1"),
        "x",
    ));
    assert!(said.contains("digest mismatch"), "{said}");

    assert_eq!(server.keys(), Vec::<String>::new(), "no container started");
    assert_eq!(
        fs::read_dir(server.store.join("images"))
            .expect("images")
            .count(),
        0,
        "nothing unpacked"
    );
    server.stop();

    // Too large: refused from the manifest, before any layer is fetched.
    let small = Server::start(
        &[],
        &["--insecure-registry", host, "--max-image-size", "64K"],
    );
    let layer_gets = registry.gets("/blobs/");
    let said = refusal(&pull_and_run(
        &small.url,
        &format!("{host}/agents/demo:1"),
        "x",
    ));
    assert!(said.contains("too large"), "{said}");
    assert!(
        said.contains("over this server's limit of 65536 bytes"),
        "{said}"
    );
    assert_eq!(registry.gets("/blobs/"), layer_gets, "no blob was fetched");
    assert_eq!(small.keys(), Vec::<String>::new());
}

#[test]
fn a_server_without_registries_refuses_registry_images() {
    let Some(images) = images() else {
        return;
    };
    let (path, _) = images.agent_layout("no-registry");
    let server = Server::start(&[format!("demo=oci:{}", path.display())], &[]);
    let said = refusal(&pull_and_run(&server.url, "127.0.0.1:9/agents/demo:1", "x"));
    assert!(said.contains("registry images are not run here"), "{said}");
}

/// `runloop serve` that is expected to refuse to start: its stderr.
fn serve_refuses(prefix: &[&str], agent: &str, env_path: Option<&str>) -> String {
    let scratch = tempfile::tempdir().expect("temp");
    let mut command = Command::new(
        prefix
            .first()
            .copied()
            .unwrap_or(env!("CARGO_BIN_EXE_runloop")),
    );
    if !prefix.is_empty() {
        command
            .args(&prefix[1..])
            .arg(env!("CARGO_BIN_EXE_runloop"));
    }
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(scratch.path().join("store"))
        .args(["--agent", agent]);
    if let Some(path) = env_path {
        command.env("PATH", path);
    }
    let output = command.output().expect("serve runs");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(output.stdout.is_empty(), "it never listened: {output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn serve_refuses_at_startup_what_it_cannot_run() {
    let Some(images) = images() else {
        return;
    };
    let (path, digest) = images.agent_layout("startup");
    let agent = format!("demo=oci:{}", path.display());

    let said = serve_refuses(&[], &agent, Some("/nonexistent"));
    assert!(
        said.contains("cannot run containers: runc does not run"),
        "{said}"
    );

    let nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    let said = serve_refuses(&nobody, &agent, None);
    assert!(said.contains("running containers needs root"), "{said}");

    let wrong = format!("sha256:{}", "0".repeat(64));
    let said = serve_refuses(&[], &format!("demo@{wrong}=oci:{}", path.display()), None);
    assert!(
        said.contains(&format!("holds image {digest}, not the pinned {wrong}")),
        "{said}"
    );

    let said = serve_refuses(&[], "demo=oci:/nonexistent/layout", None);
    assert!(said.contains("is not an OCI image layout"), "{said}");
    assert!(!said.contains(":TAG"), "{said}");

    // Newcomer G15: skopeo's oci:DIR:TAG, where DIR is a layout.
    let said = serve_refuses(&[], &format!("demo=oci:{}:1", path.display()), None);
    assert!(
        said.contains(&format!(
            "; oci:DIR names the layout's directory alone, with no :TAG (oci:{} serves the one \
             image it holds)",
            path.display()
        )),
        "{said}"
    );
}

#[test]
fn a_store_the_containers_cannot_reach_is_refused_at_startup_with_its_fix() {
    // Issue 40, item 8: `serve --store DIR/store` with DIR mode 0700 (a
    // `mktemp -d`) started, and every container run failed with runc's
    // "error preparing rootfs: … permission denied".
    let Some(images) = images() else {
        return;
    };
    let (layout, digest) = images.agent_layout("unreachable-store");
    let agent = format!("demo=oci:{}", layout.display());
    let scratch = tempfile::tempdir().expect("temp");
    let private = scratch.path().join("private");
    fs::create_dir(&private).expect("made");
    fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod 0700");
    let store = private.join("store");
    if oci_runtime() == "runsc" {
        // The sandbox's gofer reaches the store as root: nothing to refuse.
        return;
    }
    let mut serve = Command::new(env!("CARGO_BIN_EXE_runloop"))
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(&store)
        .args(["--oci-runtime", &oci_runtime(), "--agent", &agent])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve runs");
    let url = command::first_line(&mut serve);
    if !url.is_empty() {
        let _ = serve.kill();
        let _ = serve.wait();
        panic!("serve started at {url} with a store its containers cannot reach");
    }
    let output = serve.wait_with_output().expect("serve exits");
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{said}");
    assert!(
        said.contains(&format!("is below {} (mode 0700", private.display()))
            && said.contains(&format!("chmod o+x {}", private.display())),
        "{said}"
    );
    // The fix it names works: a loop runs.
    fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .expect("chmod o+x");
    let server = Server::start_on(scratch, store, &[agent], &[]);
    let ran = server.run(&format!("demo@{digest}"), "256M", "64M", "hello");
    exited(&ran, 0, &server);
}

#[test]
fn a_container_runs_below_its_tenant_s_cgroup_of_the_tenant_s_weight() {
    // Issue 40, item 6: a tenant's oci runs share one CPU weight, as its
    // exec runs do (tests/it/exec.rs has the two tenants).
    let Some(images) = images() else {
        return;
    };
    let (layout, digest) = images.agent_layout("tenant-cgroup");
    let server = Server::start(
        &[format!("demo=oci:{}", layout.display())],
        &["--tenant-cpu-weight", "250"],
    );
    let own = format!("{}.", server.pid());
    let root = if Path::new("/sys/fs/cgroup/cpu/cpu.shares").exists() {
        "/sys/fs/cgroup/cpu"
    } else {
        "/sys/fs/cgroup"
    };
    let tenant = || -> Option<PathBuf> {
        fs::read_dir(format!("{root}/runloop-tenants"))
            .ok()?
            .flatten()
            .find(|d| d.file_name().to_string_lossy().starts_with(&own))
            .map(|d| d.path().join("tenant-anonymous"))
            .filter(|dir| dir.is_dir())
    };
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let client = runloop::client::Client::connect(&server.url, "")
            .await
            .expect("connects");
        let json = format!(
            r#"{{"image":{{"server":{{"name":"demo","digest":"{digest}"}}}},"memory":268435456,"disk":67108864,"agent":{{}}}}"#
        );
        let request = <runloop::proto::agents_run::RunRequest as runloop::proto::Decode>::decode(
            json.as_bytes(),
        )
        .expect("a request");
        let run = client.start(request).await.expect("the run starts");
        let dir = tenant().expect("the tenant's cgroup");
        let containers: Vec<String> = fs::read_dir(&dir)
            .expect("its runs")
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(containers.len(), 1, "{containers:?}");
        assert!(containers[0].starts_with("runloop-"), "{containers:?}");
        let (file, expected) = if root.ends_with("/cpu") {
            ("cpu.shares", "2560")
        } else {
            ("cpu.weight", "250")
        };
        assert_eq!(
            fs::read_to_string(dir.join(file)).expect("a weight").trim(),
            expected
        );
        run.stop().await;
        client.close().await;
    });
    assert!(
        tenant().is_none(),
        "the tenant's cgroup goes with its last run"
    );
}

#[test]
fn a_container_that_does_not_start_says_why_and_leaves_nothing() {
    let Some(images) = images() else {
        return;
    };
    let (missing, missing_digest) = images.layout("missing-entrypoint", &[&images.hog], &["/nope"]);
    // Never listening at all.
    let (quiet, quiet_digest) = images.hog_layout("silent");
    let server = Server::start(
        &[
            format!("missing=oci:{}", missing.display()),
            format!("quiet=oci:{}", quiet.display()),
        ],
        &["--container-startup-timeout", "1"],
    );
    let said = refusal(&server.run(&format!("missing@{missing_digest}"), "64M", "4M", "x"));
    assert!(said.contains(r#""kind":"runtime""#), "{said}");
    // Checked in the image before runc starts (under the init, runc no
    // longer sees the image's program itself).
    assert!(
        said.contains(r#"the image's program \"/nope\" is not in the image"#),
        "{said}"
    );
    assert!(said.contains("no such file or directory"), "{said}");
    // Below the minimums: refused before anything is made.
    let said = refusal(&server.run(&format!("missing@{missing_digest}"), "1M", "4M", "x"));
    assert!(said.contains("below the container minimum"), "{said}");
    let said = refusal(&server.run(&format!("missing@{missing_digest}"), "64M", "64K", "x"));
    assert!(said.contains("below the container minimum"), "{said}");
    let said = refusal(&server.run(&format!("quiet@{quiet_digest}"), "64M", "4M", "x"));
    assert!(
        said.contains("the agent program did not listen on"),
        "{said}"
    );
    assert!(said.contains(":8080 within 1 s"), "{said}");
    assert_eq!(
        server.keys().len(),
        2,
        "two containers were made, then removed"
    );
}

/// The escape probes' answers (`NAME: RESULT` chunks of the hog's
/// `escape` mode), by name.
fn probes(lines: &[Value]) -> std::collections::BTreeMap<String, String> {
    lines
        .iter()
        .filter_map(|line| line.get("chunk"))
        .filter_map(|chunk| chunk["text"].as_str())
        .filter_map(|text| text.split_once(':'))
        .map(|(name, result)| (name.to_owned(), result.trim().to_owned()))
        .collect()
}

/// The CPU quotas (`cpu.cfs_quota_us`) of the containers' cgroups seen
/// on the host while `during` runs.
fn quotas_seen<T>(during: impl FnOnce() -> T) -> (T, std::collections::BTreeSet<String>) {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut seen = std::collections::BTreeSet::new();
            while !done.load(Ordering::Relaxed) {
                for root in ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"] {
                    // Containers are below their tenant's cgroup, below
                    // their server's: runloop-tenants/*/*/runloop-KEY.
                    let tenants = fs::read_dir(format!("{root}/runloop-tenants"))
                        .into_iter()
                        .flatten()
                        .flatten()
                        .flat_map(|server| fs::read_dir(server.path()).into_iter().flatten())
                        .flatten()
                        .map(|tenant| tenant.path());
                    for dir in tenants.chain([PathBuf::from(root)]) {
                        let Ok(entries) = fs::read_dir(dir) else {
                            continue;
                        };
                        for entry in entries.flatten() {
                            let name = entry.file_name().to_string_lossy().into_owned();
                            if name.starts_with("runloop-")
                                && name != "runloop-tenants"
                                && name != "runloop-exec"
                                && let Ok(quota) =
                                    fs::read_to_string(entry.path().join("cpu.cfs_quota_us"))
                            {
                                seen.insert(quota.trim().to_owned());
                            }
                        }
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            seen
        });
        let result = during();
        done.store(true, Ordering::Relaxed);
        (result, watcher.join().expect("watcher"))
    })
}

/// The escape suite under `runtime`: every control proven from inside a
/// hostile image (the hog's `escape` probes).
fn a_hostile_image_is_held(runtime: &str) {
    let images = Images::get();
    let (hog, digest) = images.hog_layout("escape");
    let server = Server::start(
        &[format!("hog=oci:{}", hog.display())],
        &[
            "--oci-runtime",
            runtime,
            "--container-uid-range",
            "2100000000:65536",
            // A quota no other test uses (their default is one CPU here).
            "--container-cpus",
            "0.37",
            "--container-nofile",
            "512",
            "--container-pids",
            "64",
        ],
    );
    let (output, quotas) =
        quotas_seen(|| server.run(&format!("hog@{digest}"), "64M", "4M", "look around"));
    exited(&output, 0, &server);
    let seen = probes(&json_lines(&output));
    let said = |name: &str| {
        seen.get(name)
            .unwrap_or_else(|| panic!("no probe {name:?} in {seen:#?}"))
            .as_str()
    };
    let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    let sandbox = runtime == "runsc";
    if sandbox {
        // gVisor's own kernel answers, not the host's.
        let host = Command::new("uname").arg("-r").output().expect("uname");
        let host = String::from_utf8_lossy(&host.stdout).trim().to_owned();
        assert!(!said("kernel").contains(&host), "{seen:#?}");
    } else {
        // A user namespace: the container's root is host uid 2100000000.
        assert_eq!(words(said("uid_map")), "0 2100000000 65536", "{seen:#?}");
        assert_eq!(words(said("gid_map")), "0 2100000000 65536");
        // The image was unpacked with its owners shifted into the range.
        let shifted = fs::read_dir(server.store.join("images"))
            .expect("images")
            .flatten()
            .find(|entry| {
                entry
                    .file_name()
                    .to_string_lossy()
                    .ends_with("-ids-2100000000+65536-2100000000+65536")
            })
            .expect("an image unpacked for the range");
        let hog_file = fs::metadata(shifted.path().join("rootfs/hog")).expect("hog");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            (hog_file.uid(), hog_file.gid()),
            (2_100_000_000, 2_100_000_000)
        );
    }
    // The syscall filter, no new privileges, three capabilities.
    assert_eq!(said("Seccomp"), "2", "{seen:#?}");
    assert_eq!(said("CapEff"), "0000000020000420");
    if !sandbox {
        assert_eq!(said("NoNewPrivs"), "1");
    }
    for refused in [
        "unshare user",
        "unshare user+mount",
        "unshare net",
        "clone user",
        "io_uring_setup",
        "perf_event_open",
        "mount",
        "keyctl",
        "add_key",
        "bpf",
        "mknod",
    ] {
        assert_eq!(said(refused), "EPERM", "{refused}: {seen:#?}");
    }
    // runsc has no raw sockets at all.
    assert!(
        matches!(
            said("raw socket"),
            "EPERM" | "Address family not supported by protocol"
        ),
        "{seen:#?}"
    );
    assert_eq!(said("clone plain"), "ok");
    // Masked and read-only kernel files (gVisor has none of them); no
    // host block devices.
    for masked in ["keys", "timer_list", "partitions", "diskstats", "kcore"] {
        assert!(matches!(said(masked), "" | "ENOENT"), "{masked}: {seen:#?}");
    }
    for empty in ["sys firmware", "sys block", "sys class block"] {
        assert!(matches!(said(empty), "0" | "ENOENT"), "{empty}: {seen:#?}");
    }
    for written in ["proc sys write", "sysrq-trigger write"] {
        assert_ne!(said(written), "ok", "{written}");
    }
    // The CPU quota, seen on the host (runc: inside too), and the
    // open-file limit.
    assert!(quotas.contains("37000"), "{quotas:?}");
    if !sandbox {
        assert_eq!(said("cpu quota"), "37000");
        assert_eq!(said("cpu period"), "100000");
    }
    assert_eq!(said("nofile"), "512 512");
    // The agent is not PID 1: the init is.
    assert_ne!(said("pid"), "1");
    assert_eq!(said("pid 1"), "/dev/runloop-init -- /hog escape");
    // Its root may still write its own root and /tmp.
    assert_eq!(said("write root"), "ok");
    assert_eq!(said("write tmp"), "ok");

    // A fork bomb is held by the run's process bound (64 here). Under
    // runc the bomb's fork fails with EAGAIN (the init, the hog and its
    // children share the 64) and the run goes on. Under runsc every guest
    // process is a host process of the sandbox (its ptrace platform), the
    // host bound holds the sandbox's own threads besides (2 × 64 + 256,
    // `bundle::host_pids`), and at it either the fork fails or the
    // sandbox ends: the run is cut short. Either way the server serves
    // the next run.
    let bomb = server.run(&format!("hog@{digest}"), "64M", "4M", "fork bomb");
    let lines = json_lines(&bomb);
    let seen = probes(&lines);
    match seen.get("fork bomb") {
        Some(answer) => {
            let (made, why) = answer.split_once(' ').expect("COUNT ERRNO");
            let made: u32 = made.parse().expect("a count");
            let bound = if sandbox { 2 * 64 + 256 } else { 64 };
            assert!((32..bound).contains(&made), "{made} children: {seen:#?}");
            assert_eq!(why, "EAGAIN", "{seen:#?}");
            assert_eq!(bomb.status.code(), Some(0), "{bomb:?}");
        }
        None => {
            assert!(sandbox, "runc let the bomb end the run: {bomb:?}");
            assert_eq!(lines.last(), Some(&json!({"outcome": "unfinished"})));
        }
    }
    let after = server.run(&format!("hog@{digest}"), "64M", "4M", "look around");
    assert_eq!(after.status.code(), Some(0), "{after:?}");
}

#[test]
fn a_hostile_image_finds_an_unprivileged_root_a_syscall_filter_and_masked_host_files() {
    if !ready() {
        return;
    }
    a_hostile_image_is_held("runc");
}

#[test]
fn a_hostile_image_under_runsc_finds_gvisors_kernel_and_the_same_controls() {
    if ready() && runloop_testkit::needs(&[runloop_testkit::Part::program("runsc", "runsc")]) {
        a_hostile_image_is_held("runsc");
    }
}

#[test]
fn serve_names_its_runc_and_warns_when_it_predates_the_2025_fixes() {
    let Some(images) = images() else {
        return;
    };
    let (demo, _) = images.agent_layout("runc-version");
    let server = Server::start(
        &[format!("demo=oci:{}", demo.display())],
        &["--oci-runtime", "runc"],
    );
    let log = server.log();
    let version = Command::new("runc")
        .arg("--version")
        .output()
        .expect("runc");
    let line = String::from_utf8_lossy(&version.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    assert!(log.contains(&line), "{line}\n{log}");
    let parsed = runloop_oci::runc::parse_version(&line).expect("a version");
    let warned = log.contains("predates the fixes for CVE-2025-31133");
    assert_eq!(
        warned,
        runloop_oci::runc::advisory(parsed).is_some(),
        "{log}"
    );
}

/// How long `terminate` takes for a container of `layout` whose agent
/// has answered nothing yet, with the init or without it.
fn stop_time(layout: &Path, init: bool, grace: std::time::Duration) -> std::time::Duration {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let scratch = tempfile::tempdir().expect("temp");
        let mut config = runloop_oci::HostConfig::new(scratch.path().join("store"));
        config.grace = grace;
        config.init = init;
        let host = runloop_oci::Host::open(config).await.expect("host");
        let (_, oci) = host.layout(layout, None).await.expect("layout");
        let container = oci
            .spawn(runloop::runtime::ContainerLimits::new(64 << 20, 4 << 20))
            .await
            .expect("starts");
        let started = std::time::Instant::now();
        let reason = container.terminate().await;
        let elapsed = started.elapsed();
        assert!(reason.contains("the container was stopped"), "{reason}");
        elapsed
    })
}

#[test]
fn an_agent_without_a_sigterm_handler_stops_at_once_under_the_init() {
    let Some(images) = images() else {
        return;
    };
    let (plain, _) = images.hog_layout("plain");
    let grace = std::time::Duration::from_secs(3);
    let with_init = stop_time(&plain, true, grace);
    let as_pid_1 = stop_time(&plain, false, grace);
    println!(
        "stop of an agent without a SIGTERM handler: {with_init:?} under the init, {as_pid_1:?} as PID 1 (grace {grace:?})"
    );
    // As PID 1 the SIGTERM is dropped and the grace runs out; under the
    // init it reaches the agent, whose default action ends it.
    assert!(as_pid_1 >= grace, "{as_pid_1:?}");
    assert!(with_init < grace / 3, "{with_init:?}");
}
