//! Hostile and ordinary layers through the unpacker: every escape an
//! archive can try is refused or lands inside the root, and nothing is
//! written outside it; whiteouts and budgets do what the spec says.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use runloop_oci::unpack::{self, Budget, UnpackError};

/// One archive entry, written with raw headers so that paths the `tar`
/// builder would refuse (`..`, absolute) can be made.
enum Entry<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    HardLink(&'a str, &'a str),
    Char(&'a str),
    Fifo(&'a str),
}

fn header(path: &str, kind: tar::EntryType, size: u64, link: &str, mode: u32) -> tar::Header {
    let mut header = tar::Header::new_old();
    let old = header.as_old_mut();
    old.name[..path.len()].copy_from_slice(path.as_bytes());
    old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(1_700_000_000);
    header.set_cksum();
    header
}

fn archive(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for entry in entries {
        let (header, data): (tar::Header, &[u8]) = match *entry {
            Entry::File(path, data) => (
                header(path, tar::EntryType::Regular, data.len() as u64, "", 0o644),
                data,
            ),
            Entry::Dir(path) => (header(path, tar::EntryType::Directory, 0, "", 0o755), &[]),
            Entry::Symlink(path, target) => {
                (header(path, tar::EntryType::Symlink, 0, target, 0o777), &[])
            }
            Entry::HardLink(path, target) => {
                (header(path, tar::EntryType::Link, 0, target, 0o644), &[])
            }
            Entry::Char(path) => (header(path, tar::EntryType::Char, 0, "", 0o666), &[]),
            Entry::Fifo(path) => (header(path, tar::EntryType::Fifo, 0, "", 0o600), &[]),
        };
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

/// A scratch directory with `root/` (the image root) and `outside/`.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::tempdir().expect("temp dir");
        fs::create_dir(dir.path().join("root")).expect("root");
        fs::create_dir(dir.path().join("outside")).expect("outside");
        fs::write(dir.path().join("outside/secret"), b"host file").expect("secret");
        Scratch { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn outside(&self) -> PathBuf {
        self.dir.path().join("outside")
    }

    fn apply(&self, entries: &[Entry<'_>]) -> Result<(), UnpackError> {
        let mut budget = Budget::new(1 << 20, 1000);
        unpack::apply(&self.root(), archive(entries).as_slice(), &mut budget)
    }

    /// Every path under the scratch directory but outside the root.
    fn outside_tree(&self) -> BTreeSet<PathBuf> {
        let mut seen = BTreeSet::new();
        walk(self.dir.path(), &self.root(), &mut seen);
        seen
    }
}

fn walk(dir: &Path, skip: &Path, seen: &mut BTreeSet<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        if path == skip {
            continue;
        }
        seen.insert(path.clone());
        if fs::symlink_metadata(&path).expect("stat").is_dir() {
            walk(&path, skip, seen);
        }
    }
}

/// Applies a hostile layer, checks it was refused with the expected error,
/// and that nothing outside the root changed.
fn refused(entries: &[Entry<'_>], expected: &str) {
    let scratch = Scratch::new();
    let before = scratch.outside_tree();
    let error = scratch.apply(entries).expect_err("the layer is refused");
    assert_eq!(error.to_string(), expected);
    assert_eq!(
        scratch.outside_tree(),
        before,
        "nothing outside the root changed"
    );
    let secret = scratch.outside().join("secret");
    assert_eq!(fs::read(&secret).expect("secret"), b"host file");
    assert_eq!(fs::metadata(&secret).expect("secret").nlink(), 1);
}

#[test]
fn dot_dot_entries_are_refused() {
    if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
        return;
    }
    refused(
        &[Entry::File("../outside/planted", b"x")],
        "entry \"../outside/planted\" climbs out of the image root with `..`",
    );
    refused(
        &[
            Entry::Dir("a"),
            Entry::File("a/../../outside/planted", b"x"),
        ],
        "entry \"a/../../outside/planted\" climbs out of the image root with `..`",
    );
}

#[test]
fn a_write_through_an_absolute_symlink_does_not_leave_the_root() {
    if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
        return;
    }
    let scratch = Scratch::new();
    let outside = scratch.outside().display().to_string();
    let before = scratch.outside_tree();
    // The symlink is stored as written; the write through it resolves
    // inside the root, where its target does not exist: refused.
    let error = scratch
        .apply(&[
            Entry::Symlink("evil", &outside),
            Entry::File("evil/planted", b"x"),
        ])
        .expect_err("refused");
    assert!(
        error
            .to_string()
            .starts_with("cannot unpack entry \"evil/planted\""),
        "{error}"
    );
    assert_eq!(scratch.outside_tree(), before);
    assert_eq!(
        fs::read_link(scratch.root().join("evil")).expect("symlink kept"),
        PathBuf::from(&outside)
    );

    // A symlink to `/` and a relative one climbing past the root both lead
    // to the root itself: the writes land inside it.
    let scratch = Scratch::new();
    let before = scratch.outside_tree();
    scratch
        .apply(&[
            Entry::Symlink("top", "/"),
            Entry::File("top/through-absolute", b"a"),
            Entry::Dir("d"),
            Entry::Symlink("d/up", "../../../../.."),
            Entry::File("d/up/through-relative", b"r"),
        ])
        .expect("applied");
    assert_eq!(
        fs::read(scratch.root().join("through-absolute")).expect("inside"),
        b"a"
    );
    assert_eq!(
        fs::read(scratch.root().join("through-relative")).expect("inside"),
        b"r"
    );
    assert_eq!(scratch.outside_tree(), before);
    assert!(!Path::new("/through-absolute").exists());
}

#[test]
fn hard_links_out_of_the_root_are_refused() {
    if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
        return;
    }
    let scratch = Scratch::new();
    let secret = scratch.outside().join("secret").display().to_string();
    refused(
        &[Entry::HardLink("stolen", &secret)],
        &format!(
            "hard link \"stolen\" points at {secret:?}, which is not a file inside the image root"
        ),
    );
    refused(
        &[Entry::HardLink("stolen", "../outside/secret")],
        "hard link \"stolen\" points at \"../outside/secret\", which is not a file inside the image root",
    );
    // Through a symlink that points out: resolved inside, not found.
    let outside = scratch.outside().display().to_string();
    refused(
        &[
            Entry::Symlink("door", &outside),
            Entry::HardLink("stolen", "door/secret"),
        ],
        "hard link \"stolen\" points at \"door/secret\", which is not a file inside the image root",
    );
    // A hard link to a file of the image works.
    let scratch = Scratch::new();
    scratch
        .apply(&[
            Entry::File("bin/tool", b"elf"),
            Entry::HardLink("bin/alias", "/bin/tool"),
        ])
        .expect("applied");
    let tool = fs::metadata(scratch.root().join("bin/tool")).expect("tool");
    let alias = fs::metadata(scratch.root().join("bin/alias")).expect("alias");
    assert_eq!((tool.ino(), tool.nlink()), (alias.ino(), 2));
}

#[test]
fn device_nodes_are_refused_and_fifos_kept() {
    if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
        return;
    }
    refused(
        &[Entry::Char("dev/sda")],
        "entry \"dev/sda\" is a device node; images may not carry device nodes",
    );
    let scratch = Scratch::new();
    scratch.apply(&[Entry::Fifo("run/pipe")]).expect("applied");
    let pipe = fs::symlink_metadata(scratch.root().join("run/pipe")).expect("fifo");
    assert!(pipe.file_type().is_fifo());
}

#[test]
fn whiteouts_remove_what_the_layers_below_put_there() {
    if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
        return;
    }
    let scratch = Scratch::new();
    scratch
        .apply(&[
            Entry::File("a/b", b"b"),
            Entry::File("a/c", b"c"),
            Entry::File("d/deep/file", b"d"),
            Entry::File("o/x", b"x"),
            Entry::Symlink("o/link", "/outside"),
        ])
        .expect("first layer");
    scratch
        .apply(&[
            Entry::File("a/.wh.b", b""),
            Entry::File(".wh.d", b""),
            Entry::File("o/y", b"y"),
            Entry::File("o/.wh..wh..opq", b""),
            Entry::File("a/.wh.never-there", b""),
        ])
        .expect("second layer");
    let names = |dir: &str| -> BTreeSet<String> {
        fs::read_dir(scratch.root().join(dir))
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(names("a"), BTreeSet::from(["c".to_owned()]));
    assert_eq!(names("o"), BTreeSet::from(["y".to_owned()]));
    assert!(!scratch.root().join("d").exists());
    assert!(scratch.outside().join("secret").exists());
    refused(
        &[Entry::File("a/.wh..", b"")],
        "entry \"a/.wh..\" is a whiteout for no file",
    );
}

#[test]
fn later_layers_replace_files_directories_and_symlinks() {
    if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
        return;
    }
    let scratch = Scratch::new();
    scratch
        .apply(&[
            Entry::File("x", b"old"),
            Entry::Dir("y"),
            Entry::File("y/inner", b"i"),
            Entry::Symlink("z", "/outside/secret"),
        ])
        .expect("first layer");
    scratch
        .apply(&[
            Entry::Dir("x"),
            Entry::File("y", b"now a file"),
            Entry::File("z", b"not through the link"),
        ])
        .expect("second layer");
    assert!(scratch.root().join("x").is_dir());
    assert_eq!(
        fs::read(scratch.root().join("y")).expect("y"),
        b"now a file"
    );
    assert!(
        !fs::symlink_metadata(scratch.root().join("z"))
            .expect("z")
            .is_symlink()
    );
    assert_eq!(
        fs::read(scratch.outside().join("secret")).expect("secret"),
        b"host file"
    );
}

#[test]
fn budgets_bound_bytes_and_entries() {
    if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
        return;
    }
    let scratch = Scratch::new();
    let big = vec![7u8; 4096];
    let mut budget = Budget::new(6000, 100);
    let layer = archive(&[Entry::File("one", &big), Entry::File("two", &big)]);
    let error =
        unpack::apply(&scratch.root(), layer.as_slice(), &mut budget).expect_err("too large");
    assert_eq!(
        error.to_string(),
        "the image unpacks to more than 6000 bytes of files"
    );

    let scratch = Scratch::new();
    let mut budget = Budget::new(1 << 20, 2);
    let layer = archive(&[Entry::Dir("a"), Entry::Dir("b"), Entry::Dir("c")]);
    let error =
        unpack::apply(&scratch.root(), layer.as_slice(), &mut budget).expect_err("too many");
    assert_eq!(error.to_string(), "the image has more than 2 entries");
}

#[test]
fn owners_are_shifted_into_the_containers_range_and_ids_past_it_refused() {
    if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
        return;
    }
    use runloop_oci::user::{IdMapping, IdRange};
    let range = IdRange::checked(3_000_000, 1000).expect("range");
    let ids = IdMapping::both(range);
    let owned = |path: &str, uid: u64, gid: u64| {
        let mut header = header(path, tar::EntryType::Regular, 1, "", 0o4755);
        header.set_uid(uid);
        header.set_gid(gid);
        header.set_cksum();
        let mut out = header.as_bytes().to_vec();
        out.push(b'x');
        out.resize(out.len().div_ceil(512) * 512 + 1024, 0);
        out
    };
    let scratch = Scratch::new();
    let mut budget = Budget::new(1 << 20, 1000);
    // An implied parent directory belongs to the container's root.
    unpack::apply_as(
        &scratch.root(),
        owned("bin/tool", 0, 0).as_slice(),
        &mut budget,
        ids,
    )
    .expect("applied");
    unpack::apply_as(
        &scratch.root(),
        owned("agent", 999, 7).as_slice(),
        &mut budget,
        ids,
    )
    .expect("applied");
    let meta = |path: &str| fs::symlink_metadata(scratch.root().join(path)).expect(path);
    assert_eq!(
        (meta("bin/tool").uid(), meta("bin/tool").gid()),
        (3_000_000, 3_000_000)
    );
    assert_eq!(
        (meta("bin").uid(), meta("bin").gid()),
        (3_000_000, 3_000_000)
    );
    assert_eq!(
        (meta("agent").uid(), meta("agent").gid()),
        (3_000_999, 3_000_007)
    );
    // The set-id bit survives the shifted chown (it is set after it).
    assert_eq!(meta("agent").mode() & 0o7777, 0o4755);
    let error = unpack::apply_as(
        &scratch.root(),
        owned("far", 1000, 0).as_slice(),
        &mut budget,
        ids,
    )
    .expect_err("past the range");
    assert_eq!(
        error.to_string(),
        r#"entry "far" is owned by uid 1000, past the 1000 ids a container has"#
    );
    assert!(!scratch.root().join("far").exists());
    let error = unpack::apply_as(
        &scratch.root(),
        owned("far", 0, 5000).as_slice(),
        &mut budget,
        ids,
    )
    .expect_err("past the range");
    assert!(error.to_string().contains("owned by gid 5000"), "{error}");
}
