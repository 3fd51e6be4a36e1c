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
//! journal (a run's disk does not outlive a crash anyway); its own
//! metadata takes a little of `disk`.
//!
//! Why a template: making the file system is the same work for every run
//! of a size (`mkfs.ext4`, a mount to lay out `upper/`, `work/` and
//! `tmp/`), and it was a third of a start (34 ms of 124, two programs run
//! and a loop device set up by `mount`). So each size is made once, in
//! `STORE/disks/` ([`Templates`], the eight sizes used last; one let go
//! of is removed once no run copies it), and a run's
//! disk is a copy of its template: only the blocks that hold data are
//! copied (the file stays sparse), the loop device is attached by this
//! process (`LOOP_CONFIGURE`, auto-clear) and the file system mounted by a
//! system call, with no program run. Inode tables are left for the kernel
//! to treat as unused rather than zeroed in the background
//! (`noinit_itable`, which ext4's group checksums make safe), so a run's
//! disk does not write megabytes of zeros it will never read.
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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

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

/// Templates kept at once: the sizes used last.
pub const TEMPLATES: usize = 8;

/// Formatted, laid-out empty disks, one per size, made on first use and
/// copied for every run of that size.
#[derive(Debug)]
pub struct Templates {
    dir: PathBuf,
    owner: (u32, u32),
    /// By size, the least recently used first.
    made: Mutex<Vec<(u64, Slot)>>,
}

/// A size's template, once made (by whoever asked first).
type Slot = Arc<OnceCell<Arc<Template>>>;

/// One template's file: removed when the last of those using it (the
/// templates, and each copy under way) lets go, so that a size let go of
/// while a run copies it is still whole for that run.
#[derive(Debug)]
pub struct Template {
    path: PathBuf,
}

impl Template {
    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Template {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

impl Templates {
    /// Templates in `dir` (emptied: a template is quickly made again, and
    /// one of another server's time may have been made otherwise), whose
    /// `upper/` and `tmp/` belong to `owner`, the host ids of the
    /// containers' root.
    pub fn open(dir: impl Into<PathBuf>, owner: (u32, u32)) -> Result<Templates, DiskError> {
        let dir = dir.into();
        if dir.exists() {
            crate::unpack::remove_dir_all(&dir).map_err(io_at(&dir))?;
        }
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io_at(&dir))?;
        Ok(Templates {
            dir,
            owner,
            made: Mutex::new(Vec::new()),
        })
    }

    /// The template of `size` bytes, made if need be (once, whoever asks
    /// at the same time), held for as long as the answer is.
    pub async fn get(&self, size: u64) -> Result<Arc<Template>, DiskError> {
        let cell = {
            let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
            let cell = match made.iter().position(|(made, _)| *made == size) {
                Some(at) => made.remove(at).1,
                None => Arc::new(OnceCell::new()),
            };
            made.push((size, Arc::clone(&cell)));
            if made.len() > TEMPLATES {
                // Its file goes once no copy under way holds it.
                made.remove(0);
            }
            cell
        };
        cell.get_or_try_init(|| async {
            let path = make_template(&self.dir, size, self.owner).await?;
            Ok::<_, DiskError>(Arc::new(Template { path }))
        })
        .await
        .cloned()
    }
}

/// Makes the template of `size` bytes in `dir`: the file system, and on it
/// `upper/` and `tmp/` of `owner` and the overlay's `work/`.
async fn make_template(dir: &Path, size: u64, owner: (u32, u32)) -> Result<PathBuf, DiskError> {
    let name = crate::random_name();
    let file = dir.join(format!(".making-{name}"));
    let made = async {
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
                OsStr::new("root_owner=0:0,lazy_itable_init=1"),
                file.as_os_str(),
            ],
            None,
        )
        .await?;
        let (file, mount) = (file.clone(), dir.join(format!(".mount-{name}")));
        blocking(move || {
            fs::create_dir(&mount).map_err(io_at(&mount))?;
            let laid = mount_ext4(&file, &mount).and_then(|()| lay_out(&mount, owner));
            let unmounted = unmount(&mount);
            let _ = fs::remove_dir(&mount);
            laid.and(unmounted)
        })
        .await
    };
    if let Err(error) = made.await {
        let _ = fs::remove_file(&file);
        return Err(error);
    }
    let template = dir.join(format!("{size}.img"));
    fs::rename(&file, &template).map_err(io_at(&template))?;
    Ok(template)
}

/// `upper/` (the root directory the container sees) and `tmp/` of
/// `owner`; `work/` is the overlay's own, used with the mounter's rights.
fn lay_out(mount: &Path, owner: (u32, u32)) -> Result<(), DiskError> {
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

/// Runs blocking file-system work on the runtime's blocking threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, DiskError> + Send + 'static,
) -> Result<T, DiskError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| DiskError::Io {
            path: PathBuf::new(),
            source: io::Error::other(error),
        })?
}

/// Makes the run's disk (`size` bytes, a copy of its template from
/// `templates`), mounts it, and mounts the run's root over it: `lower`
/// (an unpacked image) under the disk's `upper/`.
pub async fn create(
    run: &Path,
    size: u64,
    templates: &Templates,
    lower: &Path,
) -> Result<(), DiskError> {
    let template = templates.get(size).await?;
    let (run, lower) = (run.to_owned(), lower.to_owned());
    blocking(move || {
        let file = image(&run);
        copy_sparse(template.path(), &file, size)?;
        drop(template);
        let mount = mount_point(&run);
        fs::create_dir(&mount).map_err(io_at(&mount))?;
        mount_ext4(&file, &mount)?;
        overlay(&run, &lower)
    })
    .await
}

/// Copies `from` to a new file `to` of `size` bytes, only the parts that
/// hold data: the copy is as sparse as the template.
fn copy_sparse(from: &Path, to: &Path, size: u64) -> Result<(), DiskError> {
    use rustix::fs::SeekFrom;
    let source = fs::File::open(from).map_err(io_at(from))?;
    let target = fs::File::create_new(to).map_err(io_at(to))?;
    target.set_len(size).map_err(io_at(to))?;
    let mut at = 0u64;
    loop {
        let start = match rustix::fs::seek(&source, SeekFrom::Data(at)) {
            Ok(start) => start,
            // No data past `at`.
            Err(Errno::NXIO) => break,
            Err(errno) => return Err(io_at(from)(errno.into())),
        };
        let end = rustix::fs::seek(&source, SeekFrom::Hole(start))
            .map_err(|errno| io_at(from)(errno.into()))?;
        let (mut read_at, mut write_at) = (start, start);
        while read_at < end {
            let length = usize::try_from(end - read_at).unwrap_or(usize::MAX);
            let copied = rustix::fs::copy_file_range(
                &source,
                Some(&mut read_at),
                &target,
                Some(&mut write_at),
                length,
            )
            .map_err(|errno| io_at(to)(errno.into()))?;
            if copied == 0 {
                break;
            }
        }
        at = end;
    }
    Ok(())
}

/// Attaches `file` to a free loop device (auto-clear: it detaches when the
/// file system on it is unmounted) and mounts its ext4 at `target`,
/// `nosuid`, `nodev`, `noatime`.
fn mount_ext4(file: &Path, target: &Path) -> Result<(), DiskError> {
    let device = crate::loopdev::attach(file).map_err(io_at(file))?;
    rustix::mount::mount(
        device.path(),
        target,
        "ext4",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOATIME,
        Some(c"noinit_itable"),
    )
    .map_err(|errno| io_at(target)(errno.into()))?;
    // The mount holds the device now; closing ours leaves it attached.
    drop(device);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_template_let_go_of_while_a_run_copies_it_stays_whole_for_that_run() {
        if !runloop_testkit::needs(&[
            runloop_testkit::Part::Root,
            runloop_testkit::Part::program("mkfs.ext4", "e2fsprogs"),
        ]) {
            return;
        }
        let dir = tempfile::tempdir().expect("temp");
        let templates = Templates::open(dir.path().join("disks"), (0, 0)).expect("templates");
        let held = templates.get(MIN_DISK).await.expect("the first size");
        assert_eq!(
            templates.get(MIN_DISK).await.expect("again").path(),
            held.path(),
            "made once"
        );
        // More sizes than are kept: the first is let go of…
        for extra in 1..=TEMPLATES as u64 {
            templates
                .get(MIN_DISK + extra * 4096)
                .await
                .expect("another size");
        }
        assert_eq!(
            fs::read_dir(dir.path().join("disks"))
                .expect("the templates")
                .count(),
            TEMPLATES + 1,
            "…but its file stays while it is held"
        );
        let path = held.path().to_owned();
        assert!(path.is_file());
        drop(held);
        assert!(!path.exists(), "and goes when it is not");
    }
}
