//! Layer unpacking: an image's tar layers applied in order onto one root
//! directory, with OCI whiteouts, and nothing landing outside that root.
//!
//! A layer comes from whoever built the image, so every entry is hostile
//! until proven otherwise. The rules, and why each holds:
//!
//! - **Paths never climb.** An entry's path is split on `/`; empty and `.`
//!   components are dropped, a leading `/` is ignored (paths are relative
//!   to the image root), and a `..` component refuses the layer. The same
//!   goes for a hard link's target.
//! - **Nothing is followed on the host.** Every parent directory is
//!   resolved with `openat2(RESOLVE_IN_ROOT)` from a descriptor of the root:
//!   the kernel resolves symlinks as if the root were `/`, so an absolute
//!   symlink, or a relative one full of `..`, leads to a path *inside* the
//!   root (as it will inside the container), never out of it. The entry
//!   itself is then made with a `*at` call on that parent descriptor,
//!   without following its last component (`O_NOFOLLOW | O_EXCL` for
//!   files). A write "through" a symlink either lands inside the root or,
//!   when the in-root target does not exist, refuses the layer.
//! - **Symlinks are stored, not checked.** A symlink's target is written
//!   as is: it is resolved by the container, in the container's root. Only
//!   the host must never follow it, which the rule above guarantees.
//! - **Hard links stay inside.** The target is resolved in the root, must
//!   exist and must not be a directory, and is linked by descriptor
//!   (`linkat(AT_EMPTY_PATH)`), so no path is resolved twice.
//! - **No device nodes.** Character and block devices are refused: a
//!   container gets its `/dev` from the runtime, and a device node in an
//!   image could open the host's disks. FIFOs are harmless and kept.
//! - **Bounded.** Bytes of file content and the number of entries are
//!   counted across all layers against a [`Budget`], so a small compressed
//!   layer cannot fill the host's disk or inodes.
//! - **Owners shifted into the containers' range.** Applied for a user
//!   namespace ([`apply_as`]), an entry owned by the image's id N is owned
//!   on the host by the range's START + N; an id past the range refuses the
//!   layer (it could not be mapped inside, and must not land as a host id).
//!
//! Whiteouts follow the OCI image spec: `.wh.NAME` removes `NAME` from the
//! layers below, `.wh..wh..opq` empties its directory of everything the
//! layers below put there (entries of the same layer stay). Removal never
//! follows a symlink either: it walks directories by descriptor.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{
    AtFlags, CWD, Dir, FileType, Gid, Mode, OFlags, ResolveFlags, Timespec, Timestamps, Uid,
};
use rustix::io::Errno;
use tar::EntryType;

use crate::user::{IdMapping, IdRange};

/// The prefix of a whiteout entry's name.
const WHITEOUT: &[u8] = b".wh.";
/// The name of an opaque whiteout.
const OPAQUE: &[u8] = b".wh..wh..opq";

/// What an image may unpack to, counted across all its layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    bytes: u64,
    entries: u64,
    max_bytes: u64,
    max_entries: u64,
}

impl Budget {
    /// At most `max_bytes` of file content in at most `max_entries` entries.
    pub fn new(max_bytes: u64, max_entries: u64) -> Budget {
        Budget {
            bytes: 0,
            entries: 0,
            max_bytes,
            max_entries,
        }
    }

    /// Bytes of file content unpacked so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn entry(&mut self) -> Result<(), UnpackError> {
        self.entries += 1;
        if self.entries > self.max_entries {
            return Err(UnpackError::TooManyEntries {
                max: self.max_entries,
            });
        }
        Ok(())
    }

    fn take(&mut self, bytes: u64) -> Result<(), UnpackError> {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > self.max_bytes {
            return Err(UnpackError::TooLarge {
                max: self.max_bytes,
            });
        }
        Ok(())
    }
}

/// Why a layer was refused or could not be applied. Entry paths are shown
/// as the archive wrote them.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// A path or hard-link target with a `..` component.
    #[error("entry {entry:?} climbs out of the image root with `..`")]
    Climbs {
        /// The entry's path (or, for a hard link, its target).
        entry: String,
    },
    /// A character or block device.
    #[error("entry {entry:?} is a device node; images may not carry device nodes")]
    Device {
        /// The entry's path.
        entry: String,
    },
    /// A hard link whose target is not a file already inside the root.
    #[error("hard link {entry:?} points at {target:?}, which is not a file inside the image root")]
    LinkTarget {
        /// The entry's path.
        entry: String,
        /// The link's target, as written.
        target: String,
        /// Why the target did not resolve.
        #[source]
        source: io::Error,
    },
    /// A whiteout for `.`, `..` or nothing.
    #[error("entry {entry:?} is a whiteout for no file")]
    Whiteout {
        /// The entry's path.
        entry: String,
    },
    /// A tar entry type this unpacker does not apply.
    #[error("entry {entry:?} has tar type {kind:?}, which images do not use")]
    Type {
        /// The entry's path.
        entry: String,
        /// The type byte.
        kind: char,
    },
    /// A uid or gid that is not a valid id.
    #[error("entry {entry:?} is owned by {id}, which is not a valid user or group id")]
    Owner {
        /// The entry's path.
        entry: String,
        /// The id.
        id: u64,
    },
    /// An owner past the containers' id range.
    #[error("entry {entry:?} is owned by {kind} {id}, past the {count} ids a container has")]
    Unmapped {
        /// The entry's path.
        entry: String,
        /// `uid` or `gid`.
        kind: &'static str,
        /// The id.
        id: u32,
        /// The range's size.
        count: u32,
    },
    /// More content than the budget allows.
    #[error("the image unpacks to more than {max} bytes of files")]
    TooLarge {
        /// The budget's bytes.
        max: u64,
    },
    /// More entries than the budget allows.
    #[error("the image has more than {max} entries")]
    TooManyEntries {
        /// The budget's entries.
        max: u64,
    },
    /// A system call on an entry failed.
    #[error("cannot unpack entry {entry:?}")]
    Entry {
        /// The entry's path.
        entry: String,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// The archive itself does not read (bad header, truncated, bad compression).
    #[error("the layer is not a readable tar archive")]
    Archive(#[source] io::Error),
    /// The root directory cannot be opened.
    #[error("cannot open the image root {path}")]
    Root {
        /// The root.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Applies one uncompressed tar layer onto the directory at `root`, with
/// the owners the layer names.
pub fn apply(root: &Path, layer: impl Read, budget: &mut Budget) -> Result<(), UnpackError> {
    apply_as(root, layer, budget, IdMapping::identity())
}

/// Applies one uncompressed tar layer onto the directory at `root`, each
/// owner shifted into `ids`.
pub fn apply_as(
    root: &Path,
    layer: impl Read,
    budget: &mut Budget,
    ids: IdMapping,
) -> Result<(), UnpackError> {
    let root_fd = rustix::fs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|errno| UnpackError::Root {
        path: root.display().to_string(),
        source: errno.into(),
    })?;
    let mut unpacker = Unpacker {
        root: root_fd,
        created: HashSet::new(),
        ids,
    };
    let mut archive = tar::Archive::new(layer);
    let entries = archive.entries().map_err(UnpackError::Archive)?;
    for entry in entries {
        let entry = entry.map_err(UnpackError::Archive)?;
        unpacker.entry(entry, budget)?;
    }
    Ok(())
}

/// One layer's application: the root, and the paths this layer made (an
/// opaque whiteout keeps those).
struct Unpacker {
    root: OwnedFd,
    created: HashSet<Vec<u8>>,
    ids: IdMapping,
}

/// An entry's path as components, or `None` if one is `..`.
fn components(path: &[u8]) -> Option<Vec<&[u8]>> {
    let mut out = Vec::new();
    for part in path.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return None,
            part => out.push(part),
        }
    }
    Some(out)
}

fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.join(&b'/')
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn is_missing(errno: Errno) -> bool {
    errno == Errno::NOENT
}

impl Unpacker {
    fn entry<R: Read>(
        &mut self,
        mut entry: tar::Entry<'_, R>,
        budget: &mut Budget,
    ) -> Result<(), UnpackError> {
        let raw = entry.path_bytes().into_owned();
        let name_for_errors = || lossy(&raw);
        let kind = entry.header().entry_type();
        if kind == EntryType::XGlobalHeader {
            return Ok(());
        }
        let parts = components(&raw).ok_or_else(|| UnpackError::Climbs {
            entry: name_for_errors(),
        })?;
        let Some((&name, parent)) = parts.split_last() else {
            // The root itself ("./"): its metadata is the runtime's business.
            return Ok(());
        };
        let failed = |source: io::Error| UnpackError::Entry {
            entry: name_for_errors(),
            source,
        };
        if name == OPAQUE {
            return self.opaque(parent).map_err(failed);
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            if matches!(hidden, b"" | b"." | b"..") || hidden.contains(&b'/') {
                return Err(UnpackError::Whiteout {
                    entry: name_for_errors(),
                });
            }
            return self.whiteout(parent, hidden).map_err(failed);
        }
        budget.entry()?;
        if matches!(kind, EntryType::Char | EntryType::Block) {
            return Err(UnpackError::Device {
                entry: name_for_errors(),
            });
        }
        let header = entry.header();
        let mode = Mode::from_raw_mode(header.mode().map_err(failed)? & 0o7777);
        let owner = |id: u64| {
            u32::try_from(id)
                .ok()
                .filter(|&id| id != u32::MAX)
                .ok_or_else(|| UnpackError::Owner {
                    entry: name_for_errors(),
                    id,
                })
        };
        let shift = |id: u32, range: IdRange, kind: &'static str| {
            range.host(id).ok_or_else(|| UnpackError::Unmapped {
                entry: name_for_errors(),
                kind,
                id,
                count: range.count,
            })
        };
        let uid = owner(header.uid().map_err(failed)?)?;
        let gid = owner(header.gid().map_err(failed)?)?;
        let uid = Uid::from_raw(shift(uid, self.ids.uids, "uid")?);
        let gid = Gid::from_raw(shift(gid, self.ids.gids, "gid")?);
        let mtime = header.mtime().unwrap_or(0);
        let link = entry.link_name_bytes().map(|link| link.into_owned());
        let dir = self.make_parents(parent).map_err(failed)?;
        match kind {
            EntryType::Directory => {
                let existing = stat(&dir, name).map_err(failed)?;
                if existing != Some(FileType::Directory) {
                    if existing.is_some() {
                        remove_tree(dir.as_fd(), name).map_err(failed)?;
                    }
                    rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o700))
                        .map_err(|e| failed(e.into()))?;
                }
                let made = open_dir(&dir, name).map_err(failed)?;
                owned(&made, uid, gid, mode).map_err(failed)?;
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                remove_tree(dir.as_fd(), name).map_err(failed)?;
                let fd = rustix::fs::openat(
                    &dir,
                    name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| failed(e.into()))?;
                let mut file = File::from(fd);
                copy(&mut entry, &mut file, budget, failed)?;
                owned(&file, uid, gid, mode).map_err(failed)?;
                let time = Timespec {
                    tv_sec: i64::try_from(mtime).unwrap_or(0),
                    tv_nsec: 0,
                };
                let times = Timestamps {
                    last_access: time,
                    last_modification: time,
                };
                rustix::fs::futimens(&file, &times).map_err(|e| failed(e.into()))?;
            }
            EntryType::Symlink => {
                let target = link.filter(|link| !link.is_empty()).ok_or_else(|| {
                    failed(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a symlink without a target",
                    ))
                })?;
                remove_tree(dir.as_fd(), name).map_err(failed)?;
                rustix::fs::symlinkat(target.as_slice(), &dir, name)
                    .map_err(|e| failed(e.into()))?;
                rustix::fs::chownat(&dir, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| failed(e.into()))?;
            }
            EntryType::Link => {
                let target = link.unwrap_or_default();
                self.hard_link(&dir, name, &target)
                    .map_err(|source| UnpackError::LinkTarget {
                        entry: name_for_errors(),
                        target: lossy(&target),
                        source,
                    })?;
            }
            EntryType::Fifo => {
                remove_tree(dir.as_fd(), name).map_err(failed)?;
                rustix::fs::mknodat(&dir, name, FileType::Fifo, mode, 0)
                    .map_err(|e| failed(e.into()))?;
                rustix::fs::chownat(&dir, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| failed(e.into()))?;
            }
            other => {
                return Err(UnpackError::Type {
                    entry: name_for_errors(),
                    kind: char::from(other.as_byte()),
                });
            }
        }
        self.created.insert(join(&parts));
        Ok(())
    }

    /// Opens `parts` as a directory, resolved inside the root.
    fn open_in_root(&self, parts: &[&[u8]]) -> rustix::io::Result<OwnedFd> {
        if parts.is_empty() {
            return rustix::fs::openat(
                &self.root,
                ".",
                OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            );
        }
        rustix::fs::openat2(
            &self.root,
            join(parts).as_slice(),
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        )
    }

    /// The directory `parts`, resolved inside the root, made (mode 0755,
    /// root-owned, as tar does for a directory an archive leaves out) where
    /// missing.
    fn make_parents(&mut self, parts: &[&[u8]]) -> io::Result<OwnedFd> {
        match self.open_in_root(parts) {
            Err(errno) if is_missing(errno) => {}
            other => return other.map_err(io::Error::from),
        }
        let mut dir = self.open_in_root(&[])?;
        for depth in 1..=parts.len() {
            dir = match self.open_in_root(&parts[..depth]) {
                Ok(next) => next,
                Err(errno) if is_missing(errno) => {
                    let name = parts[depth - 1];
                    rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755))?;
                    self.created.insert(join(&parts[..depth]));
                    let made = open_dir(&dir, name)?;
                    // The layer did not name it: the container's root owns it.
                    if !self.ids.is_identity() {
                        rustix::fs::fchown(
                            &made,
                            Some(Uid::from_raw(self.ids.uids.start)),
                            Some(Gid::from_raw(self.ids.gids.start)),
                        )?;
                    }
                    made
                }
                Err(errno) => return Err(errno.into()),
            };
        }
        Ok(dir)
    }

    /// `.wh.NAME`: removes NAME from the layers below.
    fn whiteout(&mut self, parent: &[&[u8]], hidden: &[u8]) -> io::Result<()> {
        match self.open_in_root(parent) {
            Ok(dir) => remove_tree(dir.as_fd(), hidden),
            Err(errno) if is_missing(errno) => Ok(()),
            Err(errno) => Err(errno.into()),
        }
    }

    /// `.wh..wh..opq`: empties the directory of what the layers below put in it.
    fn opaque(&mut self, parent: &[&[u8]]) -> io::Result<()> {
        let dir = match self.open_in_root(parent) {
            Ok(dir) => dir,
            Err(errno) if is_missing(errno) => return Ok(()),
            Err(errno) => return Err(errno.into()),
        };
        let prefix = join(parent);
        for name in children(&dir)? {
            let mut path = prefix.clone();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(&name);
            if !self.created.contains(&path) {
                remove_tree(dir.as_fd(), &name)?;
            }
        }
        Ok(())
    }

    /// A hard link at `dir/name` to `target`, which must already be a
    /// non-directory inside the root.
    fn hard_link(&mut self, dir: &OwnedFd, name: &[u8], target: &[u8]) -> io::Result<()> {
        let parts = components(target).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "the target climbs with `..`")
        })?;
        if parts.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the target is the root",
            ));
        }
        let source = rustix::fs::openat2(
            &self.root,
            join(&parts).as_slice(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        )?;
        let kind = FileType::from_raw_mode(rustix::fs::fstat(&source)?.st_mode);
        if kind == FileType::Directory {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the target is a directory",
            ));
        }
        remove_tree(dir.as_fd(), name)?;
        rustix::fs::linkat(&source, "", dir, name, AtFlags::EMPTY_PATH)?;
        Ok(())
    }
}

/// Copies an entry's content into `file`, counting it against the budget
/// before it is written.
fn copy(
    entry: &mut impl Read,
    file: &mut File,
    budget: &mut Budget,
    failed: impl Fn(io::Error) -> UnpackError,
) -> Result<(), UnpackError> {
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        let read = match entry.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(UnpackError::Archive(error)),
        };
        budget.take(read as u64)?;
        file.write_all(&buffer[..read]).map_err(&failed)?;
    }
}

/// Sets the owner, then the mode (a chown clears set-id bits).
fn owned(fd: &impl AsFd, uid: Uid, gid: Gid, mode: Mode) -> io::Result<()> {
    rustix::fs::fchown(fd, Some(uid), Some(gid))?;
    rustix::fs::fchmod(fd, mode)?;
    Ok(())
}

/// The type of `dir/name`, not following a symlink; `None` if absent.
fn stat(dir: &OwnedFd, name: &[u8]) -> io::Result<Option<FileType>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(FileType::from_raw_mode(stat.st_mode))),
        Err(errno) if is_missing(errno) => Ok(None),
        Err(errno) => Err(errno.into()),
    }
}

/// Opens `dir/name` as a directory without following a symlink.
fn open_dir(dir: &impl AsFd, name: &[u8]) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The names in a directory, `.` and `..` left out.
fn children(dir: &impl AsFd) -> io::Result<Vec<Vec<u8>>> {
    let mut names = Vec::new();
    for entry in Dir::read_from(dir)? {
        let name = entry?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(name);
        }
    }
    Ok(names)
}

/// Removes `dir/name` and, for a directory, everything under it, walking
/// by descriptor and never following a symlink. Absent is fine.
pub(crate) fn remove_tree(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(errno) if is_missing(errno) => Ok(()),
        Err(errno) => Err(errno.into()),
        Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Directory => {
            let inner = open_dir(&dir, name)?;
            for child in children(&inner)? {
                remove_tree(inner.as_fd(), &child)?;
            }
            Ok(rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
        }
        Ok(_) => Ok(rustix::fs::unlinkat(dir, name, AtFlags::empty())?),
    }
}

/// Removes the directory at `path` and everything under it, never
/// following a symlink inside it. Absent is fine.
pub fn remove_dir_all(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} has no parent to remove it from", path.display()),
        ));
    };
    let parent = match rustix::fs::openat(
        CWD,
        parent,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(parent) => parent,
        Err(errno) if is_missing(errno) => return Ok(()),
        Err(errno) => return Err(errno.into()),
    };
    use std::os::unix::ffi::OsStrExt as _;
    remove_tree(parent.as_fd(), name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_drop_dots_and_refuse_climbing() {
        assert_eq!(
            components(b"./a//b/./c/"),
            Some(vec![&b"a"[..], b"b", b"c"])
        );
        assert_eq!(
            components(b"/etc/passwd"),
            Some(vec![&b"etc"[..], b"passwd"])
        );
        assert_eq!(components(b"a/../b"), None);
        assert_eq!(components(b".."), None);
        assert_eq!(components(b"./"), Some(vec![]));
    }
}
