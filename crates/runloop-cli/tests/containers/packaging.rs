//! docs/containers.md's "Packaging an agent as an image", run as the page
//! has it, so that the page cannot drift from what works: the offline
//! recipe (umoci and Debian's Python) on the agent guide's Python example,
//! the local registry and the push (docker-registry, skopeo), the page's
//! `runloop serve` line and its two calls, each printing what the page
//! shows; only the registry's and the server's ports are free ones instead
//! of 5000 and 7878. Beside them, the same `agent.py` runs under `exec:`
//! and prints the same lines: one program, unchanged, under both.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use runloop_testkit::document::{marked_block, transcript, workspace};
use runloop_testkit::{Part, needs};

use crate::registry::LocalRegistry;
use crate::{Server, exited, ready_with_registry};

/// The page.
const PAGE: &str = "docs/containers.md";
/// The registry's address on the page.
const PAGE_REGISTRY: &str = "127.0.0.1:5000";
/// The server's URL on the page.
const PAGE_URL: &str = "ws://127.0.0.1:7878";

/// `bash -euo pipefail -c SCRIPT` in `dir`, with this build's `runloop`
/// first on the `PATH`.
fn shell(script: &str, dir: &Path) -> Command {
    let built = Path::new(env!("CARGO_BIN_EXE_runloop"))
        .parent()
        .expect("the binary's directory");
    let path = std::env::var("PATH").unwrap_or_default();
    let mut command = Command::new("bash");
    command
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", format!("{}:{path}", built.display()));
    command
}

/// What a command printed, as a terminal shows it: stdout, then stderr
/// (`runloop run` prints the chunks on one, its summary on the other).
fn printed(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs `command`; asserts that it succeeded, saying `what` failed if not.
fn succeeds(mut command: Command, what: &str) -> Output {
    let output = command.output().expect("bash runs");
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}",
        output.status,
        printed(&output)
    );
    output
}

#[test]
fn the_packaging_recipes_make_an_image_that_runs_the_exec_agent_unchanged() {
    if !ready_with_registry()
        || !needs(&[
            Part::program("umoci", "umoci"),
            Part::program("skopeo", "skopeo"),
            Part::program("python3", "python3"),
        ])
    {
        return;
    }
    let scratch = tempfile::tempdir().expect("scratch");
    let dir = scratch.path().to_owned();
    fs::copy(
        workspace().join("docs/examples/agent.py"),
        dir.join("agent.py"),
    )
    .expect("agent.py copied");

    // The offline recipe: the layout ./agent, one image.
    succeeds(
        shell(&marked_block(PAGE, "recipe: image"), &dir),
        "the offline recipe",
    );
    let index = fs::read_to_string(dir.join("agent/index.json")).expect("the layout's index");
    let index: serde_json::Value = serde_json::from_str(&index).expect("JSON");
    assert_eq!(
        index["manifests"].as_array().map(Vec::len),
        Some(1),
        "{index}"
    );

    // The registry, as the page starts it, on a free port.
    let start = marked_block(PAGE, "recipe: registry");
    assert!(start.contains(PAGE_REGISTRY), "{start}");
    let registry = LocalRegistry::spawn(
        shell(&start.replace(PAGE_REGISTRY, "127.0.0.1:0"), &dir),
        dir.join("registry-access.log"),
        dir.join("registry"),
        None,
    );
    let here = |text: &str| text.replace(PAGE_REGISTRY, &registry.host);
    succeeds(
        shell(&here(&marked_block(PAGE, "recipe: push")), &dir),
        "the push",
    );

    // The page's server, on a free port and a store of its own, in the
    // recipe's directory; the same agent.py under exec: beside it.
    let serve = marked_block(PAGE, "recipe: serve");
    let args = serve
        .trim()
        .strip_prefix("sudo runloop serve ")
        .unwrap_or_else(|| panic!("not a `sudo runloop serve` line: {serve}"));
    assert!(
        !args.contains(['\'', '"', '\n']),
        "one unquoted line: {args}"
    );
    let args = here(args);
    let mut extra: Vec<&str> = args.split_whitespace().collect();
    extra.extend(["--exec-disk", "unenforced"]);
    let store = dir.join("store");
    let server = Server::start_on(
        scratch,
        store.clone(),
        &["echo-exec=exec:python3 agent.py".to_owned()],
        &extra,
    );

    // The page's calls print what the page shows.
    let calls = transcript(&marked_block(PAGE, "recipe: calls"));
    assert_eq!(
        calls.len(),
        2,
        "a call to the registry's image and one to the layout's"
    );
    for call in &calls {
        let command = here(&call.command).replace(PAGE_URL, &server.url);
        let output = succeeds(shell(&command, &dir), &command);
        assert_eq!(printed(&output), call.output, "{command}\n{}", server.log());
    }
    assert!(
        registry.gets("/agents/echo/manifests/") >= 1,
        "the image came from the registry"
    );

    // The same program under exec: prints the same.
    let exec = Command::new(env!("CARGO_BIN_EXE_runloop"))
        .args(["run", "--url", &server.url, "--image", "echo-exec"])
        .args(["--memory", "256M", "--disk", "64M", "hello world"])
        .output()
        .expect("runloop run runs");
    exited(&exec, 0, &server);
    assert_eq!(printed(&exec), calls[0].output);

    // Each container stopped at SIGTERM (the init passed it on to Python),
    // not at the grace's SIGKILL; nothing of them is left.
    server.stop();
    let log = server.log();
    let removed: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("container stopped agent=runloop-"))
        .collect();
    assert_eq!(removed.len(), 2, "{log}");
    for line in removed {
        assert!(line.contains("killed by signal 15"), "{line}");
    }
}
