//! Garbage collection of the store: images shed, least recently used
//! first, until the store fits its bound — never one a run holds, nor one
//! being pulled or unpacked.
//!
//! Every registry image a caller names stays in the store (its blobs in
//! `layout/`, its root under `images/`, once per id range) so that the next
//! run of it starts at once; without a bound, callers naming tag after tag
//! fill the disk. What is counted is what images take: pulled blobs and
//! unpacked roots, as `du` counts them. A run's own disk (`runs/`) is held
//! by the disk budget instead.
//!
//! Three kinds of `flock`, so that a server and `runloop store gc` in
//! another process share one store safely (the store's own `lock` stays the
//! one-server lock, which `store gc` does not take):
//!
//! - `STORE/gc.lock`: each pull and each unpack holds it shared from its
//!   first look at the store until its run holds the image ([`Busy`]); a
//!   collection holds it exclusively for the whole pass, so it never sees
//!   an image half pulled, nor takes a blob a pull has just found there.
//! - `images/NAME/used`: every holder of an unpacked image (an `oci:`
//!   entry of the catalog for the server's life, a registry run until its
//!   container is torn down) holds it shared ([`Hold`]); a collection
//!   removes an image only with every such file of it locked exclusively.
//!   A held image stays, even when the store then stays over its bound:
//!   the log says so.
//! - Its modification time is the image's last use: touched when the image
//!   is taken and at each container start, so the order survives restarts.
//!
//! An image is its manifest digest: its roots (every id range), the
//! entries of `layout/index.json` naming it and the blobs no other image
//! kept names. Blobs no image names (what a failed pull left) go first.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use oci_spec::image::ImageManifest;
use runloop_proto::error_chain::Chain;
use rustix::fs::FlockOperation;
use tracing::{info, warn};

use crate::digest::Digest;
use crate::layout::{Layout, digest_of};
use crate::unpack;

/// The file in an unpacked image's directory that its holders lock and
/// whose modification time is its last use.
pub const USED: &str = "used";

/// The store's file that pulls and unpacks lock shared and a collection
/// exclusively.
pub const GC_LOCK: &str = "gc.lock";

/// What a collection, a hold or a pull's wait could not do. (Its own
/// type, not the store's error: the store calls down to this module, and
/// nothing here calls up.)
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    /// A file of the store that could not be opened, locked, read or
    /// removed.
    #[error("the store at {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// The store's image layout (its index).
    #[error(transparent)]
    Layout(#[from] crate::layout::LayoutError),
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> GcError + '_ {
    move |source| GcError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A pull or an unpack under way: no collection runs while one is held.
#[derive(Debug)]
pub struct Busy {
    _lock: File,
}

impl Busy {
    /// Waits (blocking) until no collection runs on the store at `dir`, and
    /// keeps any from starting until dropped.
    pub fn wait(dir: &Path) -> Result<Busy, GcError> {
        let path = dir.join(GC_LOCK);
        let file = lock_file(&path).map_err(io_at(&path))?;
        rustix::fs::flock(&file, FlockOperation::LockShared)
            .map_err(|errno| io_at(&path)(errno.into()))?;
        Ok(Busy { _lock: file })
    }
}

fn lock_file(path: &Path) -> io::Result<File> {
    File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
}

/// A run's hold on an unpacked image: while any clone lives, no collection
/// removes it.
#[derive(Debug, Clone)]
pub struct Hold(Arc<File>);

impl Hold {
    /// Holds the image at `dir` (blocking while a collection looks at it)
    /// and marks it used; `None` when it is gone (a collection removed it).
    pub fn take(dir: &Path) -> Result<Option<Hold>, GcError> {
        let path = dir.join(USED);
        let file = match lock_file(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(io_at(&path)(error)),
        };
        rustix::fs::flock(&file, FlockOperation::LockShared)
            .map_err(|errno| io_at(&path)(errno.into()))?;
        if !dir.join("rootfs").is_dir() {
            return Ok(None);
        }
        let hold = Hold(Arc::new(file));
        hold.touch();
        Ok(Some(hold))
    }

    /// Marks the image used now: a collection sheds it after images used
    /// longer ago.
    pub fn touch(&self) {
        if let Err(error) = self.0.set_modified(SystemTime::now()) {
            warn!(error = %Chain(&error), "cannot mark an image used; it may be collected as if unused");
        }
    }
}

/// One image of the store, as a collection counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    /// Its manifest digest.
    pub digest: String,
    /// What removing it frees, bytes.
    pub bytes: u64,
    /// Its last use.
    pub used: SystemTime,
}

/// What a collection did (or, dry, would do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collection {
    /// The bound, bytes.
    pub max: u64,
    /// What images took before, bytes.
    pub before: u64,
    /// What they take after, bytes.
    pub after: u64,
    /// Blobs no image names, removed first: how many, and their bytes.
    pub orphans: (usize, u64),
    /// The images removed, least recently used first.
    pub removed: Vec<Counted>,
    /// The images that would have gone but a run holds.
    pub held: Vec<Counted>,
}

impl Collection {
    /// Whether the store fits its bound.
    pub fn within(&self) -> bool {
        self.after <= self.max
    }
}

/// An image found in the store, before it is judged.
#[derive(Default)]
struct Found {
    /// Its unpacked directories (one per id range).
    roots: Vec<PathBuf>,
    /// Their bytes.
    root_bytes: u64,
    /// The blobs it names.
    blobs: HashSet<String>,
    /// Its digest, when `index.json` names it.
    indexed: Option<Digest>,
    /// Its last use.
    used: Option<SystemTime>,
}

/// Sheds images from the store at `dir`, least recently used first, until
/// it takes at most `max` bytes; `dry`: says what it would remove and
/// removes nothing (and waits for no pull).
pub fn collect(dir: &Path, max: u64, dry: bool) -> Result<Collection, GcError> {
    let _exclusive = if dry {
        None
    } else {
        let path = dir.join(GC_LOCK);
        let file = lock_file(&path).map_err(io_at(&path))?;
        rustix::fs::flock(&file, FlockOperation::LockExclusive)
            .map_err(|errno| io_at(&path)(errno.into()))?;
        Some(file)
    };
    let mut images: BTreeMap<String, Found> = BTreeMap::new();
    let images_dir = dir.join("images");
    let entries = match fs::read_dir(&images_dir) {
        Ok(entries) => entries.collect::<Result<Vec<_>, _>>(),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(error) => Err(error),
    }
    .map_err(io_at(&images_dir))?;
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        // `.unpacking-*`: an unpack under way, or the leftover a server's
        // start removes.
        let Some(hex) = image_hex(&name) else {
            continue;
        };
        let path = entry.path();
        let found = images.entry(hex.to_owned()).or_default();
        found.root_bytes += du(&path).map_err(io_at(&path))?;
        let used = fs::metadata(path.join(USED))
            .or_else(|_| fs::metadata(&path))
            .and_then(|meta| meta.modified())
            .ok();
        found.used = found.used.max(used);
        found.roots.push(path);
    }
    let layout_dir = dir.join("layout");
    let layout = Layout::open(&layout_dir).ok();
    let mut blob_bytes: HashMap<String, u64> = HashMap::new();
    if let Some(layout) = &layout {
        let blobs = layout_dir.join("blobs").join("sha256");
        for entry in fs::read_dir(&blobs).map_err(io_at(&blobs))? {
            let entry = entry.map_err(io_at(&blobs))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // `.partial-*`: a blob being written.
            if name.starts_with('.') {
                continue;
            }
            let meta = entry.metadata().map_err(io_at(&entry.path()))?;
            blob_bytes.insert(name, meta.blocks() * 512);
        }
        for entry in layout.index()?.manifests() {
            let Ok(digest) = digest_of(entry) else {
                continue;
            };
            let found = images.entry(digest.hex().to_owned()).or_default();
            found.indexed = Some(digest.clone());
            found.blobs.insert(digest.hex().to_owned());
            if found.used.is_none() {
                found.used = fs::metadata(layout.blob_path(&digest))
                    .and_then(|meta| meta.modified())
                    .ok();
            }
            if let Ok((manifest, _)) = layout.read_json::<ImageManifest>("manifest", &digest, None)
            {
                let named = std::iter::once(manifest.config())
                    .chain(manifest.layers())
                    .filter_map(|descriptor| digest_of(descriptor).ok());
                found
                    .blobs
                    .extend(named.map(|digest| digest.hex().to_owned()));
            }
        }
    }
    let mut references: HashMap<&str, usize> = HashMap::new();
    for found in images.values() {
        for blob in &found.blobs {
            *references.entry(blob).or_default() += 1;
        }
    }
    let before = images.values().map(|found| found.root_bytes).sum::<u64>()
        + blob_bytes.values().sum::<u64>();
    let mut collection = Collection {
        max,
        before,
        after: before,
        orphans: (0, 0),
        removed: Vec::new(),
        held: Vec::new(),
    };
    if collection.within() {
        return Ok(collection);
    }
    let orphans: Vec<(&String, &u64)> = blob_bytes
        .iter()
        .filter(|(blob, _)| !references.contains_key(blob.as_str()))
        .collect();
    for (blob, bytes) in orphans {
        if !dry {
            let path = layout_dir.join("blobs").join("sha256").join(blob);
            fs::remove_file(&path).map_err(io_at(&path))?;
        }
        collection.orphans.0 += 1;
        collection.orphans.1 += bytes;
        collection.after -= bytes;
    }
    let mut order: Vec<(&String, &Found)> = images.iter().collect();
    order.sort_by_key(|(_, found)| found.used);
    for (hex, found) in order {
        if collection.within() {
            break;
        }
        let freed = found.root_bytes
            + found
                .blobs
                .iter()
                .filter(|blob| references.get(blob.as_str()) == Some(&1))
                .filter_map(|blob| blob_bytes.get(blob))
                .sum::<u64>();
        let counted = Counted {
            digest: format!("sha256:{hex}"),
            bytes: freed,
            used: found.used.unwrap_or(SystemTime::UNIX_EPOCH),
        };
        let Some(_locks) = unheld(&found.roots)? else {
            collection.held.push(counted);
            continue;
        };
        if !dry {
            remove(layout.as_ref(), found, &references)?;
            info!(image = %counted.digest, bytes = freed, "removed from the store, least recently used");
        }
        for blob in &found.blobs {
            if let Some(count) = references.get_mut(blob.as_str()) {
                *count -= 1;
            }
        }
        collection.after -= freed;
        collection.removed.push(counted);
    }
    if !collection.within() && !collection.held.is_empty() {
        warn!(
            bytes = collection.after,
            max,
            held = collection.held.len(),
            "the store stays over its bound: the images left are held by runs"
        );
    }
    Ok(collection)
}

/// The manifest digest's hex of an image directory's name
/// (`sha256-HEX` or `sha256-HEX-ids-…`).
fn image_hex(name: &str) -> Option<&str> {
    let name = name.strip_prefix("sha256-")?;
    let (hex, rest) = (name.get(..64)?, name.get(64..)?);
    (hex.bytes().all(|byte| byte.is_ascii_hexdigit()) && (rest.is_empty() || rest.starts_with('-')))
        .then_some(hex)
}

/// Every `used` file of `roots` locked exclusively, or `None` if a run
/// holds any of them.
fn unheld(roots: &[PathBuf]) -> Result<Option<Vec<File>>, GcError> {
    let mut locks = Vec::new();
    for root in roots {
        let path = root.join(USED);
        let file = match File::open(&path) {
            Ok(file) => file,
            // Never taken since it was unpacked: nobody holds it.
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(io_at(&path)(error)),
        };
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => locks.push(file),
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
            Err(errno) => return Err(io_at(&path)(errno.into())),
        }
    }
    Ok(Some(locks))
}

/// Removes one image: its index entries first (so a crash leaves blobs no
/// image names, which the next collection takes), its roots, then the blobs
/// only it named.
fn remove(
    layout: Option<&Layout>,
    found: &Found,
    references: &HashMap<&str, usize>,
) -> Result<(), GcError> {
    if let (Some(layout), Some(digest)) = (layout, &found.indexed) {
        layout.remove_manifests(digest)?;
    }
    for root in &found.roots {
        unpack::remove_dir_all(root).map_err(io_at(root))?;
    }
    if let Some(layout) = layout {
        for blob in &found.blobs {
            if references.get(blob.as_str()) == Some(&1) {
                let path = layout.dir().join("blobs").join("sha256").join(blob);
                match fs::remove_file(&path) {
                    Err(error) if error.kind() != io::ErrorKind::NotFound => {
                        return Err(io_at(&path)(error));
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

/// The bytes a directory tree takes on disk, as `du` counts them: each
/// file's blocks, a file of several links once; links are not followed.
pub fn du(root: &Path) -> io::Result<u64> {
    let mut seen = HashSet::new();
    let mut bytes = 0;
    let mut stack = vec![root.to_owned()];
    while let Some(path) = stack.pop() {
        let meta = fs::symlink_metadata(&path)?;
        if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        bytes += meta.blocks() * 512;
        if meta.is_dir() {
            for entry in fs::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_directories_are_named_by_digest_and_range() {
        let hex = "a".repeat(64);
        assert_eq!(image_hex(&format!("sha256-{hex}")), Some(hex.as_str()));
        assert_eq!(
            image_hex(&format!(
                "sha256-{hex}-ids-2000000000+65536-2000000000+65536"
            )),
            Some(hex.as_str())
        );
        assert_eq!(image_hex(".unpacking-0123456789ab"), None);
        assert_eq!(image_hex(&format!("sha256-{hex}x")), None);
        assert_eq!(image_hex("sha256-short"), None);
    }
}
