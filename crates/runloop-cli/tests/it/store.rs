//! `runloop store gc` on a store of the test's own: the least recently
//! used image goes first, a dry run removes nothing, an image another
//! process holds (as a run does: a shared `flock` on its `used` file)
//! stays even when the store then stays over its bound, and the exit
//! code says which.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use runloop_testkit::command::runloop;

/// An unpacked image of the store, used `ago` before now; its directory.
fn image(store: &Path, letter: char, ago: Duration) -> PathBuf {
    let dir = store
        .join("images")
        .join(format!("sha256-{}", letter.to_string().repeat(64)));
    fs::create_dir_all(dir.join("rootfs/bin")).expect("rootfs");
    fs::write(dir.join("rootfs/bin/agent"), vec![b'x'; 200_000]).expect("file");
    let used = fs::File::create(dir.join("used")).expect("used");
    used.set_modified(SystemTime::now() - ago).expect("mtime");
    dir
}

fn gc(store: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let output = runloop()
        .args(["store", "gc", "--store"])
        .arg(store)
        .args(args)
        .output()
        .expect("runloop runs");
    crate::said(&output)
}

/// Another process holding `image` as a run would, until killed.
fn hold(image: &Path) -> Child {
    let used = image.join("used");
    // The lock on a descriptor of the process itself, which `exec` keeps:
    // killing it lets go.
    let child = Command::new("sh")
        .args(["-c", r#"exec 9>>"$0" && flock --shared 9 && exec sleep 60"#])
        .arg(&used)
        .stdout(Stdio::null())
        .spawn()
        .expect("flock runs");
    // Held once an exclusive try fails.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while Command::new("flock")
        .args(["--nonblock", "--exclusive"])
        .arg(&used)
        .arg("true")
        .status()
        .expect("flock runs")
        .success()
    {
        assert!(std::time::Instant::now() < deadline, "never held");
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

#[test]
fn store_gc_sheds_the_least_recently_used_and_never_a_held_image() {
    if !runloop_testkit::needs(&[runloop_testkit::Part::Program {
        name: "flock",
        package: "util-linux",
    }]) {
        return;
    }
    let scratch = tempfile::tempdir().expect("temp");
    let store = scratch.path();
    let oldest = image(store, 'a', Duration::from_secs(300));
    let held = image(store, 'b', Duration::from_secs(200));
    let newest = image(store, 'c', Duration::from_secs(100));
    // Two images fit in 450K, three do not.
    let (code, out, err) = gc(store, &["--max-size", "450K", "--dry-run"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains(&format!("would remove sha256:{}", "a".repeat(64))),
        "{out}"
    );
    assert!(
        !out.contains("sha256:bbbb") && !out.contains("sha256:cccc"),
        "{out}"
    );
    assert!(oldest.is_dir() && held.is_dir() && newest.is_dir());

    let (code, out, err) = gc(store, &["--max-size", "450K"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains(&format!("removed sha256:{}", "a".repeat(64))),
        "{out}"
    );
    assert!(!oldest.exists() && held.is_dir() && newest.is_dir());

    // Held by another process: it stays, and the store stays over its bound.
    let mut holder = hold(&held);
    let (code, out, err) = gc(store, &["--max-size", "0"]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        out.contains(&format!("removed sha256:{}", "c".repeat(64))),
        "{out}"
    );
    assert!(
        out.contains(&format!("kept sha256:{}", "b".repeat(64))) && out.contains("held by a run"),
        "{out}"
    );
    assert!(
        out.contains("over the bound: 1 image(s) left are held by runs"),
        "{out}"
    );
    assert!(
        err.contains("the store stays over its bound: the images left are held by runs"),
        "{err}"
    );
    assert!(held.join("rootfs/bin/agent").is_file() && !newest.exists());

    // Let go of, it goes with the default bound of 0.
    let (code, out, err) = gc(store, &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!held.exists(), "{out}");

    let (code, _, err) = gc(&store.join("nowhere"), &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("is not a container store"), "{err}");
}
