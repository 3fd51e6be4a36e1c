//! Run disks: a file system made for each run, exactly `disk` bytes,
//! holding the run's writable layer and its `/tmp`; and the overlay that
//! puts that layer over the image.
//!
//! ```text
//! RUN/disk.img    sparse file of `disk` bytes, ext4 (no journal, no reserved blocks)
//! RUN/disk/       its mount (through a loop device): upper/ work/ tmp/
//! RUN/rootfs/     overlay: lowerdir = the unpacked image, upperdir = disk/upper
//! ```
//!
//! Why a file system and not a quota: the kernel then holds the limit for
//! every way of writing (files, directories, inodes, the overlay's copies
//! up of image files), the agent sees an ordinary `ENOSPC`, and nothing it
//! writes can grow anything outside the file — the sparse file only takes
//! the blocks the agent fills, and never more than `disk`. Without a
//! journal (a run's disk does not outlive a crash anyway) the file system
//! is made in milliseconds; its own metadata takes a little of `disk`.
//!
//! Teardown works from names alone (the run's directory), so it is the
//! same after a crash as after a stop: unmount the overlay, unmount the
//! disk (the loop device, set to auto-clear, detaches with it), detach any
//! loop device still backed by the run's file, remove the files.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::mount::{MountFlags, UnmountFlags};

use crate::command::{self, CommandError};

/// The smallest `disk` a run may ask for: ext4 needs room for its own
/// metadata and a root directory.
pub const MIN_DISK: u64 = 1 << 20;

/// How long a teardown waits for the run's loop device to go.
const LOOP_DETACH: Duration = Duration::from_secs(5);

/// Why a run's disk or root could not be made or removed.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// A file or directory of the run: its path, and the system's error.
    #[error("{path}")]
    Io {
        /// The path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// mkfs.ext4, mount or losetup.
    #[error(transparent)]
    Command(#[from] CommandError),
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> DiskError + '_ {
    move |source| DiskError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The run's disk image.
pub fn image(run: &Path) -> PathBuf {
    run.join("disk.img")
}

/// Where the run's disk is mounted.
pub fn mount_point(run: &Path) -> PathBuf {
    run.join("disk")
}

/// The run's root: the overlay.
pub fn rootfs(run: &Path) -> PathBuf {
    run.join("rootfs")
}

/// The run's `/tmp`, on its disk.
pub fn tmp(run: &Path) -> PathBuf {
    mount_point(run).join("tmp")
}

/// Makes the run's disk (`size` bytes), mounts it, and lays out `upper/`,
/// `work/` and `tmp/` on it; `upper/` (the root directory the container
/// sees) and `tmp/` belong to `owner`, the host ids of the container's
/// root. (`work/` is the overlay's own, used with the mounter's rights.)
pub async fn create(run: &Path, size: u64, owner: (u32, u32)) -> Result<(), DiskError> {
    let file = image(run);
    fs::File::create_new(&file)
        .and_then(|disk| disk.set_len(size))
        .map_err(io_at(&file))?;
    command::run(
        OsStr::new("mkfs.ext4"),
        [
            OsStr::new("-q"),
            OsStr::new("-F"),
            OsStr::new("-m"),
            OsStr::new("0"),
            OsStr::new("-O"),
            OsStr::new("^has_journal"),
            OsStr::new("-E"),
            OsStr::new("root_owner=0:0"),
            file.as_os_str(),
        ],
        None,
    )
    .await?;
    let mount = mount_point(run);
    fs::create_dir(&mount).map_err(io_at(&mount))?;
    command::run(
        OsStr::new("mount"),
        [
            OsStr::new("-t"),
            OsStr::new("ext4"),
            OsStr::new("-o"),
            OsStr::new("loop,nosuid,nodev,noatime"),
            file.as_os_str(),
            mount.as_os_str(),
        ],
        None,
    )
    .await?;
    for (name, mode, owned) in [
        ("upper", 0o755, true),
        ("work", 0o700, false),
        ("tmp", 0o1777, true),
    ] {
        let dir = mount.join(name);
        fs::DirBuilder::new()
            .mode(mode)
            .create(&dir)
            .and_then(|()| {
                if owned {
                    std::os::unix::fs::chown(&dir, Some(owner.0), Some(owner.1))?;
                }
                fs::set_permissions(&dir, fs::Permissions::from_mode(mode))
            })
            .map_err(io_at(&dir))?;
    }
    let lost = mount.join("lost+found");
    fs::remove_dir(&lost).map_err(io_at(&lost))?;
    Ok(())
}

/// Mounts the run's root: `lower` (an unpacked image) under the run's
/// writable layer.
pub fn overlay(run: &Path, lower: &Path) -> Result<(), DiskError> {
    let root = rootfs(run);
    fs::create_dir(&root).map_err(io_at(&root))?;
    let mount = mount_point(run);
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        mount.join("upper").display(),
        mount.join("work").display()
    );
    let options =
        std::ffi::CString::new(options).map_err(|error| io_at(&root)(io::Error::other(error)))?;
    rustix::mount::mount(
        "overlay",
        &root,
        "overlay",
        MountFlags::NODEV,
        Some(options.as_c_str()),
    )
    .map_err(|errno| io_at(&root)(errno.into()))?;
    Ok(())
}

/// Whether a path can be named in overlay options (which separate with
/// `,` and `:` and escape with `\`).
pub fn overlay_safe(path: &Path) -> bool {
    !path
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .any(|b| matches!(b, b',' | b':' | b'\\'))
}

/// Unmounts the run's root and disk, detaches its loop device and removes
/// the run's directory. Each step is skipped when there is nothing to do.
pub async fn remove(run: &Path) -> Result<(), DiskError> {
    for target in [rootfs(run), mount_point(run)] {
        unmount(&target)?;
    }
    // The kernel detaches an auto-clear loop device in the background once
    // its file system is gone: wait for it, detaching it by hand if it
    // lingers (a crash between attach and mount leaves one unmounted).
    let file = image(run);
    let started = Instant::now();
    let mut asked = false;
    loop {
        let devices = loop_devices(&file);
        if devices.is_empty() {
            break;
        }
        if started.elapsed() >= LOOP_DETACH {
            return Err(DiskError::Io {
                path: file,
                source: io::Error::other(format!(
                    "loop device {} is still attached after {LOOP_DETACH:?}",
                    devices[0].display()
                )),
            });
        }
        if !asked && started.elapsed() >= Duration::from_millis(200) {
            asked = true;
            for device in devices {
                // "No such device": detached meanwhile.
                let _ = command::run(
                    OsStr::new("losetup"),
                    [OsStr::new("-d"), device.as_os_str()],
                    None,
                )
                .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    crate::unpack::remove_dir_all(run).map_err(io_at(run))
}

/// Unmounts `target` if something is mounted there; a busy mount is
/// detached lazily (it goes when its last user does).
fn unmount(target: &Path) -> Result<(), DiskError> {
    for flags in [UnmountFlags::empty(), UnmountFlags::DETACH] {
        match rustix::mount::unmount(target, flags) {
            Ok(()) => return Ok(()),
            // Not a mount point, or not there at all.
            Err(Errno::INVAL | Errno::NOENT) => return Ok(()),
            Err(Errno::BUSY) => continue,
            Err(errno) => return Err(io_at(target)(errno.into())),
        }
    }
    Err(io_at(target)(Errno::BUSY.into()))
}

/// The loop devices backed by `file`.
pub fn loop_devices(file: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let wanted = file.as_os_str().as_encoded_bytes();
    entries
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("loop"))
        .filter(|entry| {
            fs::read(entry.path().join("loop/backing_file")).is_ok_and(|backing| {
                let backing = backing.strip_suffix(b"\n").unwrap_or(&backing);
                let backing = backing.strip_suffix(b" (deleted)").unwrap_or(backing);
                backing == wanted
            })
        })
        .map(|entry| PathBuf::from("/dev").join(entry.file_name()))
        .collect()
}
