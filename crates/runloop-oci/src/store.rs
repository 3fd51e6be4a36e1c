//! The store: the server's directory of pulled blobs and unpacked images,
//! shared by every run, and of the runs' own directories.
//!
//! ```text
//! STORE/                       mode 0700 (0710 for the containers' root group): images keep set-id bits
//!   layout/                    an OCI image layout: pulled blobs, pulled images in index.json
//!   images/sha256-HEX/rootfs   one unpacked image per manifest digest (the overlay's lower layer)
//!   images/sha256-HEX-ids-U+N-G+M/rootfs  the same, owners shifted into a container id range
//!   images/…/used              locked (shared) by the image's holders; its mtime is its last use
//!   runs/KEY/                  one run: disk.img, its mount, the overlay root, config.json
//!   disks/SIZE.img             a run disk's template, one per size used lately (crate::disk)
//!   lock                       held (flock) by the one server using the store
//!   gc.lock                    shared by pulls and unpacks, exclusive for a collection
//! ```
//!
//! An unpacked image is made under a temporary name and renamed into place
//! when its last layer is applied, so `images/` holds only whole images. A
//! server that stops ([`Store::stop`]) ends the unpacks under way and
//! removes what they made; a crash mid-unpack leaves a temporary directory
//! the next server start removes. Once in place an image is never written again — every run
//! writes to its own overlay upper directory — and it is reused by every
//! later run of the same digest. Two runs that need the same image at the
//! same time unpack it once: the second waits for the first
//! ([`Flights`]).
//!
//! A store whose containers run in a user namespace ([`Store::with_ids`])
//! unpacks each image with its owners shifted into the range (runc 1.1
//! cannot map a mount's ids), under a name that says the range: a server
//! started with another range unpacks the image again rather than run a
//! container over files its root does not own.
//!
//! Every image handed out is held ([`Unpacked::hold`]) for as long as
//! anything runs it; a store with a bound ([`Store::with_max_size`]) sheds
//! the least recently used images no one holds after each image it adds
//! ([`crate::gc`]).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once, Weak};

use runloop_proto::error_chain::Chain;
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::gc::{self, Busy, Hold};
use crate::image::{Compression, Image};
use crate::layout::{Layout, LayoutError};
use crate::unpack::{self, Budget, UnpackError};
use crate::user::IdMapping;

/// An image unpacked in the store, ready to be an overlay's lower layer.
#[derive(Debug, Clone)]
pub struct Unpacked {
    /// The image.
    pub image: Image,
    /// Its root file system (read-only by convention: no run writes it).
    pub rootfs: PathBuf,
    /// Whether this call unpacked it (`false`: it was cached, or another
    /// caller unpacked it while this one waited).
    pub fresh: bool,
    /// The hold that keeps a collection from removing it, and marks its use.
    pub hold: Hold,
}

/// Bounds on what one image may unpack to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnpackLimits {
    /// Bytes of file content.
    pub max_bytes: u64,
    /// Files, directories and links.
    pub max_entries: u64,
}

/// Why an image could not be unpacked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A blob of the image's layout.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A layer was refused or failed.
    #[error("layer {index} ({digest})")]
    Layer {
        /// The layer's position, from 1 at the bottom.
        index: usize,
        /// Its digest.
        digest: String,
        /// What was wrong.
        #[source]
        source: UnpackError,
    },
    /// The store's own files.
    #[error("the store at {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// The blocking unpack task did not finish: it panicked, or was
    /// cancelled.
    #[error("the unpack task failed")]
    Task(#[source] tokio::task::JoinError),
    /// The server is stopping: no unpack starts, and those under way end.
    #[error("the server is stopping; the unpack was ended and removed")]
    Stopping,
}

impl From<gc::GcError> for StoreError {
    fn from(error: gc::GcError) -> StoreError {
        match error {
            gc::GcError::Io { path, source } => StoreError::Io { path, source },
            gc::GcError::Layout(error) => StoreError::Layout(error),
        }
    }
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Locks by key, for work that must happen once however many ask at once:
/// the first caller does it, the others wait and then find it done.
#[derive(Debug, Default)]
pub struct Flights {
    keys: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl Flights {
    /// Waits for the lock on `key`; held until the guard drops.
    pub async fn lock(&self, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut keys = self
                .keys
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            keys.retain(|_, lock| lock.strong_count() > 0);
            match keys.get(key).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(tokio::sync::Mutex::new(()));
                    keys.insert(key.to_owned(), Arc::downgrade(&lock));
                    lock
                }
            }
        };
        lock.lock_owned().await
    }
}

/// The store.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    layout: Arc<Layout>,
    limits: UnpackLimits,
    flights: Flights,
    ids: IdMapping,
    /// Set by [`Store::stop`]: unpacks read it between reads of a layer.
    stopping: Arc<AtomicBool>,
    /// Held (read) by each unpack under way; [`Store::stop`] waits for the write.
    jobs: Arc<tokio::sync::RwLock<()>>,
    /// The bound a collection after each new image holds the store to.
    max_size: Option<u64>,
    /// Wakes the collector; started with the first image added.
    collector: Arc<Notify>,
    collector_started: Once,
}

impl Store {
    /// Opens (making it, mode 0700, if needed) the store at `dir`.
    pub fn open(dir: impl Into<PathBuf>, limits: UnpackLimits) -> Result<Store, StoreError> {
        let dir = dir.into();
        for sub in ["", "images", "runs"] {
            let path = dir.join(sub);
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&path)
                .map_err(io_at(&path))?;
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(io_at(&dir))?;
        let layout = Arc::new(Layout::create(dir.join("layout"))?);
        Ok(Store {
            dir,
            layout,
            limits,
            flights: Flights::default(),
            ids: IdMapping::identity(),
            stopping: Arc::new(AtomicBool::new(false)),
            jobs: Arc::new(tokio::sync::RwLock::new(())),
            max_size: None,
            collector: Arc::new(Notify::new()),
            collector_started: Once::new(),
        })
    }

    /// The store, holding itself to `max_size` bytes of images (`None`: no
    /// bound): after each image it adds, the least recently used ones no
    /// run holds are removed ([`gc::collect`]).
    pub fn with_max_size(mut self, max_size: Option<u64>) -> Store {
        self.max_size = max_size;
        self
    }

    /// Waits until no collection runs; none starts until the guard drops.
    /// A pull holds it from its first look at the store until its run
    /// holds the image.
    pub async fn busy(&self) -> Result<Busy, StoreError> {
        let dir = self.dir.clone();
        let busy = tokio::task::spawn_blocking(move || Busy::wait(&dir))
            .await
            .map_err(StoreError::Task)??;
        Ok(busy)
    }

    /// Says the store has grown: with a bound, a collection runs (one at a
    /// time, on a blocking thread) once the pulls and unpacks under way
    /// are done.
    pub fn grown(&self) {
        let Some(max) = self.max_size else {
            return;
        };
        self.collector_started.call_once(|| {
            let dir = self.dir.clone();
            let wake = Arc::clone(&self.collector);
            let stopping = Arc::clone(&self.stopping);
            tokio::spawn(async move {
                loop {
                    wake.notified().await;
                    if stopping.load(Ordering::SeqCst) {
                        return;
                    }
                    let dir = dir.clone();
                    match tokio::task::spawn_blocking(move || gc::collect(&dir, max, false)).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(error)) => {
                            warn!(error = %Chain(&error), "the store's collection failed")
                        }
                        Err(error) => warn!(%error, "the store's collection task failed"),
                    }
                }
            });
        });
        self.collector.notify_one();
    }

    /// The store, unpacking images with their owners shifted into `ids`.
    /// The store and `runs/` become mode 0710 with the containers' root
    /// group: runc sets a container up as its root, which must reach the
    /// run's files; no other user of the host may (`images/` stays 0700).
    pub fn with_ids(mut self, ids: IdMapping) -> Result<Store, StoreError> {
        if !ids.is_identity() {
            for path in [self.dir.clone(), self.runs()] {
                std::os::unix::fs::chown(&path, Some(0), Some(ids.gids.start))
                    .and_then(|()| fs::set_permissions(&path, fs::Permissions::from_mode(0o710)))
                    .map_err(io_at(&path))?;
            }
        }
        self.ids = ids;
        Ok(self)
    }

    /// The ids images are unpacked for.
    pub fn ids(&self) -> IdMapping {
        self.ids
    }

    /// Ends every unpack under way (each removes its temporary directory)
    /// and refuses new ones; returns when they are all gone. For a server's
    /// shutdown, so that a stop mid-unpack leaves nothing in `images/`.
    pub async fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.collector.notify_one();
        let _all = self.jobs.write().await;
        if let Err(error) = self.sweep() {
            tracing::warn!(%error, "cannot remove an interrupted unpack");
        }
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The layout pulled blobs go to.
    pub fn layout(&self) -> &Arc<Layout> {
        &self.layout
    }

    /// Where runs keep their files.
    pub fn runs(&self) -> PathBuf {
        self.dir.join("runs")
    }

    /// The single-flight locks (shared with the registry's pulls).
    pub fn flights(&self) -> &Flights {
        &self.flights
    }

    /// Removes what an interrupted unpack left: temporary image directories.
    /// Only safe while no other server uses the store (see the host's lock).
    pub fn sweep(&self) -> Result<(), StoreError> {
        let images = self.dir.join("images");
        for entry in fs::read_dir(&images).map_err(io_at(&images))? {
            let entry = entry.map_err(io_at(&images))?;
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(".unpacking-")
            {
                let path = entry.path();
                info!(path = %path.display(), "removing an interrupted unpack");
                unpack::remove_dir_all(&path).map_err(io_at(&path))?;
            }
        }
        Ok(())
    }

    /// The image unpacked, from `source` (whose blobs hold its layers),
    /// unpacking it if it is not cached yet.
    pub async fn unpack(
        &self,
        source: &Arc<Layout>,
        image: &Image,
    ) -> Result<Unpacked, StoreError> {
        self.unpack_within(source, image, u64::MAX).await
    }

    /// [`unpack`](Self::unpack), with at most `max_bytes` of file content
    /// (and never more than the store's own limit): a registry image's
    /// bound, a multiple of its compressed size.
    pub async fn unpack_within(
        &self,
        source: &Arc<Layout>,
        image: &Image,
        max_bytes: u64,
    ) -> Result<Unpacked, StoreError> {
        let dir = self.image_dir(image);
        let _busy = self.busy().await?;
        let _flight = self.flights.lock(&format!("unpack {}", image.digest)).await;
        if let Some(hold) = self.hold(&dir).await? {
            return Ok(Unpacked {
                image: image.clone(),
                rootfs: dir.join("rootfs"),
                fresh: false,
                hold,
            });
        }
        let running = Arc::clone(&self.jobs).read_owned().await;
        if self.stopping.load(Ordering::SeqCst) {
            return Err(StoreError::Stopping);
        }
        let temporary = self
            .dir
            .join("images")
            .join(format!(".unpacking-{}", crate::random_name()));
        let job = Job {
            source: Arc::clone(source),
            image: image.clone(),
            temporary,
            dir: dir.clone(),
            limits: UnpackLimits {
                max_bytes: self.limits.max_bytes.min(max_bytes),
                ..self.limits
            },
            ids: self.ids,
            stopping: Arc::clone(&self.stopping),
        };
        // The job puts the image in place (or removes its temporary
        // directory) itself: a caller that gives up waiting leaves no
        // half-made image, and a finished one is cached for the next.
        let unpacked_bytes = tokio::task::spawn_blocking(move || {
            let _running = running;
            job.run()
        })
        .await
        .map_err(StoreError::Task)??;
        info!(image = %image.digest, layers = image.layers.len(), bytes = unpacked_bytes, "image unpacked");
        let hold = self.hold(&dir).await?.ok_or_else(|| StoreError::Io {
            path: dir.clone(),
            source: io::Error::other("the image unpacked is not in place"),
        })?;
        self.grown();
        Ok(Unpacked {
            image: image.clone(),
            rootfs: dir.join("rootfs"),
            fresh: true,
            hold,
        })
    }

    /// A hold on the image at `dir`, if it is there.
    async fn hold(&self, dir: &Path) -> Result<Option<Hold>, StoreError> {
        let dir = dir.to_owned();
        let hold = tokio::task::spawn_blocking(move || Hold::take(&dir))
            .await
            .map_err(StoreError::Task)??;
        Ok(hold)
    }

    fn image_dir(&self, image: &Image) -> PathBuf {
        let name = if self.ids.is_identity() {
            format!("sha256-{}", image.digest.hex())
        } else {
            // `+`, not `:`: overlay options cannot name a `:`.
            format!(
                "sha256-{}-ids-{}+{}-{}+{}",
                image.digest.hex(),
                self.ids.uids.start,
                self.ids.uids.count,
                self.ids.gids.start,
                self.ids.gids.count
            )
        };
        self.dir.join("images").join(name)
    }
}

/// One unpack, on a blocking thread.
struct Job {
    source: Arc<Layout>,
    image: Image,
    temporary: PathBuf,
    dir: PathBuf,
    limits: UnpackLimits,
    ids: IdMapping,
    stopping: Arc<AtomicBool>,
}

impl Job {
    /// Unpacks into the temporary directory and renames it into place;
    /// on any failure the temporary directory is removed.
    fn run(self) -> Result<u64, StoreError> {
        let unpacked = self.unpack().and_then(|bytes| {
            match fs::rename(&self.temporary, &self.dir) {
                Ok(()) => Ok(bytes),
                // An earlier unpack of the same image, whose caller gave
                // up waiting, finished first.
                Err(_) if self.dir.join("rootfs").is_dir() => Ok(bytes),
                Err(error) => Err(io_at(&self.dir)(error)),
            }
        });
        if self.temporary.exists() {
            let _ = unpack::remove_dir_all(&self.temporary);
        }
        unpacked
    }

    fn unpack(&self) -> Result<u64, StoreError> {
        let rootfs = self.temporary.join("rootfs");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&rootfs)
            .map_err(io_at(&rootfs))?;
        if !self.ids.is_identity() {
            rustix::fs::chown(
                &rootfs,
                Some(rustix::fs::Uid::from_raw(self.ids.uids.start)),
                Some(rustix::fs::Gid::from_raw(self.ids.gids.start)),
            )
            .map_err(|errno| io_at(&rootfs)(errno.into()))?;
        }
        let mut budget = Budget::new(self.limits.max_bytes, self.limits.max_entries);
        for (index, layer) in self.image.layers.iter().enumerate() {
            let failed = |source| StoreError::Layer {
                index: index + 1,
                digest: layer.digest.to_string(),
                source,
            };
            self.source.verify(&layer.digest, layer.size)?;
            let blob = self.source.open_blob(&layer.digest)?;
            let reader = decompress(blob, layer.compression)
                .map_err(|error| failed(UnpackError::Archive(error)))?;
            let reader = Stoppable {
                inner: reader,
                stopping: &self.stopping,
            };
            let applied = unpack::apply_as(&rootfs, reader, &mut budget, self.ids);
            if self.stopping.load(Ordering::SeqCst) {
                return Err(StoreError::Stopping);
            }
            applied.map_err(failed)?;
        }
        if self.stopping.load(Ordering::SeqCst) {
            return Err(StoreError::Stopping);
        }
        let used = self.temporary.join(gc::USED);
        File::create(&used).map_err(io_at(&used))?;
        Ok(budget.bytes())
    }
}

/// A layer's reader that fails once the store is stopping, so that an
/// unpack ends at its next read.
struct Stoppable<'a, R> {
    inner: R,
    stopping: &'a AtomicBool,
}

impl<R: Read> Read for Stoppable<'_, R> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err(io::Error::other("the server is stopping"));
        }
        self.inner.read(buffer)
    }
}

/// A layer blob, decompressed as its media type says.
fn decompress(blob: File, compression: Compression) -> io::Result<Box<dyn Read>> {
    let blob = BufReader::with_capacity(256 << 10, blob);
    Ok(match compression {
        Compression::None => Box::new(blob),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(blob)),
        Compression::Zstd => Box::new(ZstdFrames::new(blob)?),
    })
}

/// A zstd stream of one or more frames (zstd allows them concatenated).
struct ZstdFrames<R: BufRead> {
    frame: Option<ruzstd::decoding::StreamingDecoder<R, ruzstd::decoding::FrameDecoder>>,
}

impl<R: BufRead> ZstdFrames<R> {
    fn new(reader: R) -> io::Result<Self> {
        Ok(ZstdFrames {
            frame: Some(start_frame(reader)?),
        })
    }
}

fn start_frame<R: BufRead>(
    reader: R,
) -> io::Result<ruzstd::decoding::StreamingDecoder<R, ruzstd::decoding::FrameDecoder>> {
    ruzstd::decoding::StreamingDecoder::new(reader)
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, format!("zstd: {error}")))
}

impl<R: BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(frame) = self.frame.as_mut() else {
                return Ok(0);
            };
            let read = frame.read(buffer)?;
            if read > 0 || buffer.is_empty() {
                return Ok(read);
            }
            let Some(frame) = self.frame.take() else {
                return Ok(0);
            };
            let mut reader = frame.into_inner();
            if reader.fill_buf()?.is_empty() {
                return Ok(0);
            }
            self.frame = Some(start_frame(reader)?);
        }
    }
}
