//! The run budget: how many runs the server holds at once, how much memory
//! and disk they may claim together, and the most one run may claim; and
//! the same for each tenant, whose share is fixed (protocol §12 "Fair
//! shares").
//!
//! A run's `memory` and `disk` are the caller's numbers (protocol §5), and
//! the runtime holds the agent to them; left at that, one caller could ask
//! for 2^64−1 bytes, or start as many runs as its connections allow, each
//! with its processes. So before a run starts it is admitted here, and the
//! [`Claim`] it gets is held until its container has stopped. The tenant's
//! limits are looked at first, so that a refusal names the tenant's limit
//! when that is what was hit:
//!
//! ```text
//! memory > max_run_memory, disk > max_run_disk        refused, always
//! memory > the tenant's max-run-memory                refused, always
//! the tenant's runs = its max-runs                    refused, try again later
//! the tenant's memory + memory > its memory-budget    refused, try again later
//! the tenant's disk + disk > its disk-budget          refused, try again later
//! runs held = max_runs                                refused, try again later
//! memory claimed + memory > memory_budget             refused, try again later
//! disk claimed + disk > disk_budget                   refused, try again later
//! ```
//!
//! A tenant's share is a fixed cap, not borrowed while the others are
//! idle: unless configured otherwise it is half of each server-wide
//! budget (see [`Quota`](super::Quota)), so one tenant can never make the
//! server refuse every other.
//!
//! Each refusal is the run's error response (kind `policy`), naming the
//! limit and its value.
//!
//! A run's loops are bounded by `max_channels` each, but a tenant with
//! many runs could still hold many loops, each with its relay task and its
//! proxy path; so a loop, too, is admitted before its relay starts, and
//! its [`LoopClaim`] is held until its channel's finish:
//!
//! ```text
//! the tenant's loops = its max-loops                  refused, try again later
//! ```
//!
//! The refusal is the channel's error and finish (protocol §7: no loop
//! ran), kind `policy`, naming the limit. With any credential accepted
//! every caller is the same tenant, and the server-wide limits are its
//! limits: the per-tenant ones apply only to tenants of tokens.
//!
//! Memory a tenant pays for includes what it has half sent (protocol §12):
//! the bytes of a caller's message that has begun and not ended are held
//! by the server, so they are a claim on the same memory as runs'
//! ([`HalfSent`], grown as the message grows, given back when it ends or
//! its connection does). A message that does not fit closes its
//! connection:
//!
//! ```text
//! the tenant's memory + half sent + more > its memory-budget   closed
//! memory claimed + half sent + more > memory_budget            closed
//! ```
//!
//! Disk is real space (protocol §12): run disks are sparse files, which
//! take blocks only as they are written, so a disk budget of the store's
//! size would admit runs whose disks the filesystem cannot hold together.
//! Where runs' disks are made on a filesystem of the server's
//! ([`Ledger::new`]'s `run_disks`), a run asking for disk is admitted only
//! when it fits that filesystem's free space (statvfs, blocks available
//! to unprivileged writers) less what the runs admitted may still write:
//! each one's disk, less the blocks its disk file already holds (which
//! the free space already counts), when its runtime says which file that
//! is ([`Claim::disk_file`]), else the whole of its disk. So no run meets
//! a full disk before its own limit:
//!
//! ```text
//! disk + what admitted runs may still write > free space    refused, try again later
//! ```
//!
//! A connection whose token a reload revoked holds nothing new: every run
//! and loop it asks for is refused, naming the revocation; what it half
//! sends in its grace counts against the server's budget alone.
//!
//! A warm container (one a runtime keeps started for runs to come) claims
//! its memory and disk of the server-wide budgets alone
//! ([`Ledger::claim_reserve`]): no run's place and no tenant's share, since
//! no one asked for it yet; the run that takes it makes its own claim.
//!
//! The [`Ledger`] is the run budget's part of the server's shared state:
//! the budget, what runs and loops claim under its own lock, and the
//! roster it asks for a tenant's share ([`Ledger::share`], its one
//! question about a tenant). A run's [`Claim`] and a loop's [`LoopClaim`]
//! hold the ledger, and nothing else of the server.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use runloop_metrics::RunRefusal;
use runloop_proto::{ErrorKind, ErrorValue};

use super::admission::release;
use super::identity::{Identity, Shares};
use super::tenants::{Revoked, Roster};
use runloop_wire::limits::{Limit, LimitError};

/// Runs held at once unless configured otherwise.
pub const DEFAULT_MAX_RUNS: usize = 256;
/// The largest `memory` of one run unless configured otherwise: 4 GiB.
pub const DEFAULT_MAX_RUN_MEMORY: u64 = 4 << 30;
/// The largest `disk` of one run unless configured otherwise: 16 GiB.
pub const DEFAULT_MAX_RUN_DISK: u64 = 16 << 30;
/// Loops one identity holds at once unless configured otherwise: two for
/// each run it may hold (the proxy serves one loop of a run at a time, and
/// the next may be asked for while the last is ending).
pub const DEFAULT_MAX_LOOPS_PER_IDENTITY: usize = DEFAULT_MAX_RUNS / 4 * 2;
/// The memory budget when the machine's memory cannot be read: 4 GiB.
const FALLBACK_MEMORY_BUDGET: u64 = 4 << 30;
/// The disk budget when the filesystem's size cannot be read: 64 GiB.
const FALLBACK_DISK_BUDGET: u64 = 64 << 30;

/// What runs may claim, each and together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunBudget {
    /// Runs held at once, server-wide, from their admission to their
    /// container's stop. At least one.
    pub max_runs: usize,
    /// Runs one token identity may hold at once. At least one.
    pub max_runs_per_identity: usize,
    /// Run-loop channels one token identity may have served at once, from
    /// the order to the channel's finish, over all its runs. At least one.
    pub max_loops_per_identity: usize,
    /// The largest `memory` one run may ask for, bytes. At least
    /// [`Limit::MIN_RUN_MEMORY`].
    pub max_run_memory: u64,
    /// The largest `disk` one run may ask for, bytes.
    pub max_run_disk: u64,
    /// The most the `memory` of every run held may add up to, bytes. At
    /// least [`Limit::MIN_RUN_MEMORY`].
    pub memory_budget: u64,
    /// The most the `disk` of every run held may add up to, bytes. At
    /// least [`Limit::MIN_RUN_MEMORY`].
    pub disk_budget: u64,
}

impl Default for RunBudget {
    /// [`DEFAULT_MAX_RUNS`], a quarter of them per identity,
    /// [`DEFAULT_MAX_LOOPS_PER_IDENTITY`], the default per-run maximums,
    /// [`default_memory_budget`] and the [`default_disk_budget`] of `/`.
    fn default() -> Self {
        RunBudget {
            max_runs: DEFAULT_MAX_RUNS,
            max_runs_per_identity: DEFAULT_MAX_RUNS / 4,
            max_loops_per_identity: DEFAULT_MAX_LOOPS_PER_IDENTITY,
            max_run_memory: DEFAULT_MAX_RUN_MEMORY,
            max_run_disk: DEFAULT_MAX_RUN_DISK,
            memory_budget: default_memory_budget(),
            disk_budget: default_disk_budget(std::path::Path::new("/")),
        }
    }
}

impl RunBudget {
    /// Whether every limit is at least its minimum; the first that is not
    /// is the error.
    pub fn validate(&self) -> Result<(), LimitError> {
        Limit::MaxRuns.check(self.max_runs as u64)?;
        Limit::MaxRunsPerIdentity.check(self.max_runs_per_identity as u64)?;
        Limit::MaxLoopsPerIdentity.check(self.max_loops_per_identity as u64)?;
        Limit::MaxRunMemory.check(self.max_run_memory)?;
        Limit::MemoryBudget.check(self.memory_budget)?;
        Limit::DiskBudget.check(self.disk_budget)
    }
}

/// Three quarters of the size of the filesystem that holds `path` (or,
/// when it does not exist yet, its nearest ancestor that does), leaving
/// the rest to the images, logs and the system; 64 GiB where it cannot be
/// read.
pub fn default_disk_budget(path: &std::path::Path) -> u64 {
    filesystem_size(path).map_or(FALLBACK_DISK_BUDGET, |total| total / 4 * 3)
}

/// The quarter of the filesystem holding `path` that
/// [`default_disk_budget`] leaves to the images: the bound of a container
/// store unless configured otherwise (16 GiB where it cannot be read).
pub fn default_store_max_size(path: &std::path::Path) -> u64 {
    filesystem_size(path).map_or(FALLBACK_DISK_BUDGET / 4, |total| total / 4)
}

/// The size in bytes of the filesystem that holds `path` or its nearest
/// existing ancestor.
fn filesystem_size(path: &std::path::Path) -> Option<u64> {
    let stat = statvfs(path)?;
    blocks_in_bytes(stat.f_blocks, stat.f_frsize)
}

/// The bytes an unprivileged writer may still write on the filesystem
/// that holds `path` or its nearest existing ancestor (its available
/// blocks: a run's disk file is written by the server for an agent that
/// is nobody on the host, so the blocks kept for root are not its).
fn filesystem_free(path: &Path) -> Option<u64> {
    let stat = statvfs(path)?;
    blocks_in_bytes(stat.f_bavail, stat.f_frsize)
}

/// `blocks` of `size` bytes, in bytes. statvfs(3)'s counts and sizes are
/// 64-bit on Linux and narrower on other Unixes (32-bit block counts on
/// macOS), hence the conversions that are no-ops here.
#[allow(clippy::useless_conversion)]
fn blocks_in_bytes(blocks: libc::fsblkcnt_t, size: libc::c_ulong) -> Option<u64> {
    u64::from(blocks).checked_mul(u64::from(size))
}

/// statvfs(3) of `path` or its nearest existing ancestor.
fn statvfs(path: &Path) -> Option<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let existing = path.ancestors().find(|p| p.exists())?;
    let name = std::ffi::CString::new(existing.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `name` is a NUL-terminated path and `stat` is written by
    // statvfs(3) before it is read, only when it succeeds.
    unsafe {
        if libc::statvfs(name.as_ptr(), stat.as_mut_ptr()) != 0 {
            return None;
        }
        Some(stat.assume_init())
    }
}

/// The bytes `file` holds on its filesystem (its allocated blocks: a
/// sparse file's written part); none when it is not there (yet, or any
/// more).
fn allocated(file: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(file).map_or(0, |meta| meta.blocks().saturating_mul(512))
}

/// Three quarters of the machine's memory (`MemTotal` in /proc/meminfo),
/// leaving the rest to the server itself and the system; 4 GiB where it
/// cannot be read.
pub fn default_memory_budget() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|meminfo| mem_total(&meminfo))
        .map_or(FALLBACK_MEMORY_BUDGET, |total| total / 4 * 3)
}

/// `MemTotal` of a /proc/meminfo, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line
        .trim_start_matches("MemTotal:")
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// What the runs and loops held claim, counted under one lock.
#[derive(Debug, Default)]
struct Claimed {
    runs: usize,
    memory: u64,
    disk: u64,
    /// Bytes of messages begun and not ended, over every connection.
    half_sent: u64,
    tenants: HashMap<Identity, TenantClaimed>,
    loops_per_identity: HashMap<Identity, usize>,
    /// The disks of the runs admitted, on the filesystem of `run_disks`,
    /// by claim.
    disks: HashMap<u64, RunDisk>,
    /// The number of the next disk claimed.
    next_disk: u64,
}

/// What one tenant's runs and half-sent messages claim.
#[derive(Debug, Default, Clone, Copy)]
struct TenantClaimed {
    runs: usize,
    memory: u64,
    disk: u64,
    half_sent: u64,
}

/// An admitted run's disk: its size, and the file that holds it once its
/// runtime has said.
#[derive(Debug)]
struct RunDisk {
    size: u64,
    file: Option<PathBuf>,
}

impl RunDisk {
    /// What the run may still write: its size less what its file holds.
    fn still(&self) -> u64 {
        let written = self.file.as_deref().map_or(0, allocated);
        self.size.saturating_sub(written)
    }
}

/// The run ledger of a server: what its runs and loops claim of the run
/// budget.
#[derive(Debug)]
pub(crate) struct Ledger {
    budget: RunBudget,
    /// Where runs' disks are made, when on a filesystem of the server's.
    run_disks: Option<PathBuf>,
    /// What the runs and loops held claim.
    claimed: Mutex<Claimed>,
    /// Whose share an identity holds.
    tenants: Arc<Roster>,
}

impl Ledger {
    /// The ledger of `budget`, asking `tenants` for their shares; runs'
    /// disks are made on the filesystem that holds `run_disks`, if any.
    pub(crate) fn new(
        budget: RunBudget,
        run_disks: Option<PathBuf>,
        tenants: Arc<Roster>,
    ) -> Ledger {
        Ledger {
            budget,
            run_disks,
            claimed: Mutex::new(Claimed::default()),
            tenants,
        }
    }

    /// What `identity`'s tenant may hold, when tenants are counted
    /// (tokens); `None` with any credential accepted; an error when its
    /// token was revoked. Every claim asks here.
    fn share(&self, identity: &Identity) -> Result<Option<Shares>, Revoked> {
        self.tenants.shares(identity)
    }

    /// Bytes of half-sent messages held, over every connection.
    pub(crate) fn half_sent(&self) -> u64 {
        self.claimed().half_sent
    }

    /// A claim on the memory for a message `identity`'s connection has
    /// begun and not ended: nothing yet, grown as the message grows.
    pub(crate) fn half_sent_by(self: &Arc<Self>, identity: &Identity) -> HalfSent {
        HalfSent {
            ledger: Arc::clone(self),
            identity: identity.clone(),
            tenant_bytes: 0,
            held: 0,
        }
    }

    /// What the runs and loops held claim, locked.
    fn claimed(&self) -> MutexGuard<'_, Claimed> {
        self.claimed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Loops held by tenants that are counted, over all of them (what the
    /// tests check comes back to zero).
    #[cfg(test)]
    fn loops_held(&self) -> usize {
        self.claimed().loops_per_identity.values().sum()
    }

    /// Admits a run asking for `memory` and `disk`, served as `identity`,
    /// or says which limit refuses it — the tenant's, when that is what
    /// was hit, or the server's — and how the refusal is counted.
    pub(crate) fn claim_run(
        self: &Arc<Self>,
        identity: &Identity,
        memory: u64,
        disk: u64,
    ) -> Result<Claim, (RunRefusal, ErrorValue)> {
        let budget = &self.budget;
        let refuse =
            |why: String| Err((RunRefusal::Budget, ErrorValue::kind(ErrorKind::Policy, why)));
        if memory > budget.max_run_memory {
            return refuse(format!(
                "memory {memory} is over this server's largest run memory (max_run_memory {} bytes)",
                budget.max_run_memory
            ));
        }
        if disk > budget.max_run_disk {
            return refuse(format!(
                "disk {disk} is over this server's largest run disk (max_run_disk {} bytes)",
                budget.max_run_disk
            ));
        }
        let shares = self.share(identity).map_err(|revoked| {
            (
                RunRefusal::Revoked,
                ErrorValue::kind(ErrorKind::Policy, revoked.to_string()),
            )
        })?;
        let per_identity = shares.is_some().then(|| identity.clone());
        if let Some(shares) = &shares
            && memory > shares.max_run_memory
        {
            return refuse(format!(
                "memory {memory} is over tenant {identity}'s largest run memory \
                 (max-run-memory {} bytes)",
                shares.max_run_memory
            ));
        }
        let mut claimed = self.claimed();
        if let (Some(identity), Some(shares)) = (&per_identity, &shares) {
            let held = claimed.tenants.get(identity).copied().unwrap_or_default();
            if held.runs >= shares.max_runs {
                return refuse(format!(
                    "tenant {identity} holds as many runs as it may (max-runs {}); \
                     try again later",
                    shares.max_runs
                ));
            }
            if held
                .memory
                .saturating_add(held.half_sent)
                .saturating_add(memory)
                > shares.memory_budget
            {
                return refuse(format!(
                    "memory {memory} does not fit tenant {identity}'s memory budget: {} of \
                     memory-budget {} bytes; try again later",
                    holding("its runs", held.memory, "its", held.half_sent),
                    shares.memory_budget
                ));
            }
            if held.disk.saturating_add(disk) > shares.disk_budget {
                return refuse(format!(
                    "disk {disk} does not fit tenant {identity}'s disk budget: its runs \
                     hold {} of disk-budget {} bytes; try again later",
                    held.disk, shares.disk_budget
                ));
            }
        }
        if claimed.runs >= budget.max_runs {
            return refuse(format!(
                "this server holds as many runs as it may (max_runs {}); try again later",
                budget.max_runs
            ));
        }
        if claimed
            .memory
            .saturating_add(claimed.half_sent)
            .saturating_add(memory)
            > budget.memory_budget
        {
            return refuse(format!(
                "memory {memory} does not fit this server's memory budget: {} of \
                 memory_budget {} bytes; try again later",
                holding("runs", claimed.memory, "", claimed.half_sent),
                budget.memory_budget
            ));
        }
        if claimed.disk.saturating_add(disk) > budget.disk_budget {
            return refuse(format!(
                "disk {disk} does not fit this server's disk budget: runs hold {} of \
                 disk_budget {} bytes; try again later",
                claimed.disk, budget.disk_budget
            ));
        }
        let disk_claim = match (&self.run_disks, disk) {
            (Some(place), 1..) => Some(self.fits_the_filesystem(&mut claimed, place, disk)?),
            _ => None,
        };
        claimed.runs += 1;
        claimed.memory += memory;
        claimed.disk += disk;
        if let Some(identity) = &per_identity {
            let held = claimed.tenants.entry(identity.clone()).or_default();
            held.runs += 1;
            held.memory += memory;
            held.disk += disk;
        }
        drop(claimed);
        Ok(Claim {
            ledger: Arc::clone(self),
            identity: per_identity,
            run: true,
            memory,
            disk,
            disk_claim,
        })
    }

    /// Claims `memory` and `disk` of the server-wide budgets for a warm
    /// container (kept started for runs to come): no run's place and no
    /// tenant's share; `None` when it does not fit.
    pub(crate) fn claim_reserve(self: &Arc<Self>, memory: u64, disk: u64) -> Option<Claim> {
        let mut claimed = self.claimed();
        let fits = claimed
            .memory
            .saturating_add(claimed.half_sent)
            .saturating_add(memory)
            <= self.budget.memory_budget
            && claimed.disk.saturating_add(disk) <= self.budget.disk_budget;
        if !fits {
            return None;
        }
        let disk_claim = match (&self.run_disks, disk) {
            (Some(place), 1..) => Some(self.fits_the_filesystem(&mut claimed, place, disk).ok()?),
            _ => None,
        };
        claimed.memory += memory;
        claimed.disk += disk;
        Some(Claim {
            ledger: Arc::clone(self),
            identity: None,
            run: false,
            memory,
            disk,
            disk_claim,
        })
    }

    /// Whether `disk` fits the free space of the filesystem that holds
    /// `place`, less what the runs admitted may still write; if so it is
    /// claimed (its number), else the refusal says how much there is.
    /// Under the claims' lock, so that two admissions never count the
    /// same free space.
    fn fits_the_filesystem(
        &self,
        claimed: &mut Claimed,
        place: &Path,
        disk: u64,
    ) -> Result<u64, (RunRefusal, ErrorValue)> {
        // A filesystem that cannot be read is left to the disk budget.
        if let Some(free) = filesystem_free(place) {
            let still: u64 = claimed.disks.values().map(RunDisk::still).sum();
            if disk.saturating_add(still) > free {
                return Err((
                    RunRefusal::Disk,
                    ErrorValue::kind(
                        ErrorKind::Policy,
                        format!(
                            "disk {disk} does not fit the free space of the filesystem that \
                             holds runs' disks: {free} bytes free, of which the runs admitted \
                             may still write {still}; try again later"
                        ),
                    ),
                ));
            }
        }
        let number = claimed.next_disk;
        claimed.next_disk += 1;
        claimed.disks.insert(
            number,
            RunDisk {
                size: disk,
                file: None,
            },
        );
        Ok(number)
    }

    /// Admits a loop of a run served as `identity`, or says that its
    /// tenant holds as many as it may.
    pub(crate) fn claim_loop(
        self: &Arc<Self>,
        identity: &Identity,
    ) -> Result<LoopClaim, ErrorValue> {
        let shares = self
            .share(identity)
            .map_err(|revoked| ErrorValue::kind(ErrorKind::Policy, revoked.to_string()))?;
        let Some(shares) = shares else {
            return Ok(LoopClaim {
                identity: identity.clone(),
                held: None,
            });
        };
        let limit = shares.max_loops;
        let mut claimed = self.claimed();
        let held = claimed
            .loops_per_identity
            .get(identity)
            .copied()
            .unwrap_or(0);
        if held >= limit {
            return Err(ErrorValue::kind(
                ErrorKind::Policy,
                format!(
                    "tenant {identity} holds as many loops as it may \
                     (max-loops {limit}); try again later"
                ),
            ));
        }
        *claimed
            .loops_per_identity
            .entry(identity.clone())
            .or_default() += 1;
        drop(claimed);
        Ok(LoopClaim {
            identity: identity.clone(),
            held: Some(Arc::clone(self)),
        })
    }
}

/// The words of what is held of a memory budget: `runs` hold `memory`,
/// and, when there are any, `whose` half-sent messages `half_sent`.
fn holding(runs: &str, memory: u64, whose: &str, half_sent: u64) -> String {
    if half_sent == 0 {
        format!("{runs} hold {memory}")
    } else {
        let whose = if whose.is_empty() {
            String::new()
        } else {
            format!("{whose} ")
        };
        format!("{runs} hold {memory} and {whose}half-sent messages {half_sent}")
    }
}

/// A run's admission, held until its container has stopped; dropping it
/// gives its place, its memory and its disk back.
pub(crate) struct Claim {
    ledger: Arc<Ledger>,
    identity: Option<Identity>,
    /// Whether it holds a run's place (a warm container's holds none).
    run: bool,
    memory: u64,
    disk: u64,
    /// Its disk's number among those on the filesystem of `run_disks`.
    disk_claim: Option<u64>,
}

impl Claim {
    /// The file that holds the run's disk, as its runtime says: what it
    /// already holds is no longer counted as still to be written.
    pub(crate) fn disk_file(&self, file: Option<PathBuf>) {
        if let (Some(number), Some(file)) = (self.disk_claim, file)
            && let Some(disk) = self.ledger.claimed().disks.get_mut(&number)
        {
            disk.file = Some(file);
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut claimed = self.ledger.claimed();
        claimed.runs -= usize::from(self.run);
        claimed.memory -= self.memory;
        claimed.disk -= self.disk;
        if let Some(number) = self.disk_claim {
            claimed.disks.remove(&number);
        }
        if let Some(identity) = &self.identity
            && let Some(held) = claimed.tenants.get_mut(identity)
        {
            held.runs -= 1;
            held.memory -= self.memory;
            held.disk -= self.disk;
            if held.runs == 0 && held.half_sent == 0 {
                claimed.tenants.remove(identity);
            }
        }
    }
}

/// A connection's claim on memory for the message it has begun and not
/// ended (see the module's docs): grown as the message grows, given back
/// at its end, and when dropped.
pub(crate) struct HalfSent {
    ledger: Arc<Ledger>,
    identity: Identity,
    /// Of what it holds, the bytes counted under its tenant too: none
    /// with any credential accepted, or grown once its token is revoked.
    tenant_bytes: u64,
    held: u64,
}

/// Why a half-sent message does not fit: the limit, in words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct OverMemory(String);

impl HalfSent {
    /// Bytes held.
    pub(crate) fn held(&self) -> u64 {
        self.held
    }

    /// Grows the claim to `bytes`, or says which budget the message does
    /// not fit: its tenant's, when that is what was hit, or the server's.
    pub(crate) fn grow(&mut self, bytes: u64) -> Result<(), OverMemory> {
        let more = bytes.saturating_sub(self.held);
        if more == 0 {
            return Ok(());
        }
        // A revoked identity has no share: its bytes count against the
        // server's budget alone, for the little while its grace lasts.
        let shares = self.ledger.share(&self.identity).ok().flatten();
        let budget = self.ledger.budget.memory_budget;
        let mut claimed = self.ledger.claimed();
        if let Some(shares) = shares {
            let held = claimed
                .tenants
                .get(&self.identity)
                .copied()
                .unwrap_or_default();
            if held
                .memory
                .saturating_add(held.half_sent)
                .saturating_add(more)
                > shares.memory_budget
            {
                return Err(OverMemory(format!(
                    "a half-sent message of {bytes} bytes does not fit tenant {}'s memory \
                     budget: {} of memory-budget {} bytes",
                    self.identity,
                    holding("its runs", held.memory, "its", held.half_sent),
                    shares.memory_budget
                )));
            }
        }
        if claimed
            .memory
            .saturating_add(claimed.half_sent)
            .saturating_add(more)
            > budget
        {
            return Err(OverMemory(format!(
                "a half-sent message of {bytes} bytes does not fit this server's memory \
                 budget: {} of memory_budget {budget} bytes",
                holding("runs", claimed.memory, "", claimed.half_sent),
            )));
        }
        claimed.half_sent += more;
        if shares.is_some() {
            claimed
                .tenants
                .entry(self.identity.clone())
                .or_default()
                .half_sent += more;
            self.tenant_bytes += more;
        }
        self.held = bytes;
        Ok(())
    }

    /// The message ended: what it held goes back.
    pub(crate) fn clear(&mut self) {
        if self.held == 0 {
            return;
        }
        let mut claimed = self.ledger.claimed();
        claimed.half_sent -= self.held;
        if self.tenant_bytes > 0
            && let Some(held) = claimed.tenants.get_mut(&self.identity)
        {
            held.half_sent -= self.tenant_bytes;
            if held.runs == 0 && held.half_sent == 0 {
                claimed.tenants.remove(&self.identity);
            }
        }
        self.held = 0;
        self.tenant_bytes = 0;
    }
}

impl Drop for HalfSent {
    fn drop(&mut self) {
        self.clear();
    }
}

/// A run-loop channel's admission, held until its finish; dropping it
/// gives its tenant's place back.
pub(crate) struct LoopClaim {
    /// The tenant it is served as, whose figures count its chunks.
    pub(crate) identity: Identity,
    /// The ledger, when tenants are of tokens and the loop is counted;
    /// with any credential accepted nothing is counted.
    held: Option<Arc<Ledger>>,
}

impl Drop for LoopClaim {
    fn drop(&mut self) {
        if let Some(ledger) = &self.held {
            release(&mut ledger.claimed().loops_per_identity, &self.identity);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Credentials;
    use crate::tenants::tests::roster;

    /// A ledger of `budget` for callers of `credentials`, whose tenants
    /// hold two runs and two loops each, 1 GiB of memory and of disk
    /// together, and runs of 1 GiB at most.
    fn ledger(budget: RunBudget, credentials: &Credentials) -> Arc<Ledger> {
        Arc::new(Ledger::new(budget, None, Arc::new(roster(credentials))))
    }

    const GIB: u64 = 1 << 30;

    /// A server of three runs and 8 GiB of memory and disk, runs of 2 GiB
    /// at most.
    fn three_runs() -> RunBudget {
        RunBudget {
            max_runs: 3,
            max_runs_per_identity: 3,
            max_loops_per_identity: 2,
            max_run_memory: 2 * GIB,
            max_run_disk: 2 * GIB,
            memory_budget: 8 * GIB,
            disk_budget: 8 * GIB,
        }
    }

    /// A refusal's error value, of a loop's or a run's.
    trait Refusal {
        fn value(self) -> ErrorValue;
    }

    impl Refusal for ErrorValue {
        fn value(self) -> ErrorValue {
            self
        }
    }

    impl Refusal for (RunRefusal, ErrorValue) {
        fn value(self) -> ErrorValue {
            self.1
        }
    }

    /// The words of a refusal, which must be a policy one.
    fn refusal<T, E: Refusal>(claimed: Result<T, E>) -> String {
        let Err(error) = claimed else {
            panic!("admitted")
        };
        let error = error.value();
        assert_eq!(error.0["kind"], "policy");
        error.0["error"].as_str().expect("words").to_owned()
    }

    #[test]
    fn a_run_is_refused_by_its_tenants_share_first_then_the_servers() {
        let ledger = ledger(
            three_runs(),
            &Credentials::Tokens(vec!["a".into(), "b".into()]),
        );
        let accept = |token| ledger.tenants.accept(token).expect("a token");
        let (alice, bob) = (accept("a"), accept("b"));
        let small = GIB / 4;
        assert_eq!(
            refusal(ledger.claim_run(&alice, 3 * GIB, 0)),
            "memory 3221225472 is over this server's largest run memory \
             (max_run_memory 2147483648 bytes)"
        );
        assert_eq!(
            refusal(ledger.claim_run(&alice, 0, 3 * GIB)),
            "disk 3221225472 is over this server's largest run disk \
             (max_run_disk 2147483648 bytes)"
        );
        assert_eq!(
            refusal(ledger.claim_run(&alice, 2 * GIB, 0)),
            "memory 2147483648 is over tenant token #1's largest run memory \
             (max-run-memory 1073741824 bytes)"
        );
        let first = ledger
            .claim_run(&alice, small, small)
            .expect("alice's first");
        assert_eq!(
            refusal(ledger.claim_run(&alice, GIB, 0)),
            "memory 1073741824 does not fit tenant token #1's memory budget: its runs \
             hold 268435456 of memory-budget 1073741824 bytes; try again later"
        );
        assert_eq!(
            refusal(ledger.claim_run(&alice, 0, GIB)),
            "disk 1073741824 does not fit tenant token #1's disk budget: its runs \
             hold 268435456 of disk-budget 1073741824 bytes; try again later"
        );
        let second = ledger
            .claim_run(&alice, small, small)
            .expect("alice's second");
        assert_eq!(
            refusal(ledger.claim_run(&alice, small, small)),
            "tenant token #1 holds as many runs as it may (max-runs 2); try again later"
        );
        let bobs = ledger.claim_run(&bob, small, small).expect("bob's first");
        assert_eq!(
            refusal(ledger.claim_run(&bob, small, small)),
            "this server holds as many runs as it may (max_runs 3); try again later"
        );
        // Over both, the tenant's limit is the one named.
        assert_eq!(
            refusal(ledger.claim_run(&alice, small, small)),
            "tenant token #1 holds as many runs as it may (max-runs 2); try again later"
        );
        drop(first);
        let again = ledger
            .claim_run(&bob, small, small)
            .expect("a place is back");
        drop((second, bobs, again));
        let claimed = ledger.claimed();
        assert_eq!((claimed.runs, claimed.memory, claimed.disk), (0, 0, 0));
        assert!(claimed.tenants.is_empty());
    }

    #[test]
    fn without_tokens_the_servers_budget_is_the_only_one() {
        let ledger = ledger(three_runs(), &Credentials::Any);
        let anyone = ledger.tenants.accept("").expect("any");
        // Over a tenant's share of 1 GiB, within the server's.
        let held: Vec<Claim> = (0..3)
            .map(|_| {
                ledger
                    .claim_run(&anyone, 2 * GIB, 2 * GIB)
                    .expect("admitted")
            })
            .collect();
        assert_eq!(
            refusal(ledger.claim_run(&anyone, GIB, 0)),
            "this server holds as many runs as it may (max_runs 3); try again later"
        );
        drop(held);
        let mut budget = three_runs();
        budget.memory_budget = 3 * GIB;
        budget.disk_budget = 3 * GIB;
        let ledger = self::ledger(budget, &Credentials::Any);
        let held = ledger
            .claim_run(&anyone, 2 * GIB, 2 * GIB)
            .expect("admitted");
        assert_eq!(
            refusal(ledger.claim_run(&anyone, 2 * GIB, 0)),
            "memory 2147483648 does not fit this server's memory budget: runs hold \
             2147483648 of memory_budget 3221225472 bytes; try again later"
        );
        assert_eq!(
            refusal(ledger.claim_run(&anyone, 0, 2 * GIB)),
            "disk 2147483648 does not fit this server's disk budget: runs hold \
             2147483648 of disk_budget 3221225472 bytes; try again later"
        );
        drop(held);
        assert_eq!(ledger.claimed().runs, 0);
    }

    #[test]
    fn a_token_holds_its_loops_up_to_the_limit_and_gets_them_back() {
        let ledger = ledger(
            three_runs(),
            &Credentials::Tokens(vec!["a".into(), "b".into()]),
        );
        let accept = |token| ledger.tenants.accept(token).expect("a token");
        let (alice, bob) = (accept("a"), accept("b"));
        let held = [
            ledger.claim_loop(&alice).expect("alice's first"),
            ledger.claim_loop(&alice).expect("alice's second"),
        ];
        assert_eq!(
            refusal(ledger.claim_loop(&alice)),
            "tenant token #1 holds as many loops as it may (max-loops 2); try again later"
        );
        let bobs = ledger.claim_loop(&bob).expect("bob's");
        let [first, second] = held;
        drop(first);
        let again = ledger.claim_loop(&alice).expect("alice's place is back");
        drop((second, again, bobs));
        assert_eq!(ledger.loops_held(), 0);
    }

    #[test]
    fn without_tokens_loops_are_not_counted_per_identity() {
        let ledger = ledger(three_runs(), &Credentials::Any);
        let anyone = ledger.tenants.accept("").expect("any");
        let held: Vec<LoopClaim> = (0..3)
            .map(|_| ledger.claim_loop(&anyone).expect("not limited"))
            .collect();
        assert_eq!(ledger.loops_held(), 0);
        drop(held);
    }

    #[test]
    fn half_sent_bytes_are_held_within_the_tenants_memory_and_the_servers() {
        let mut budget = three_runs();
        budget.memory_budget = 3 * GIB;
        let ledger = ledger(budget, &Credentials::Tokens(vec!["a".into(), "b".into()]));
        let accept = |token| ledger.tenants.accept(token).expect("a token");
        let (alice, bob) = (accept("a"), accept("b"));
        // alice's share is 1 GiB: a run of half of it, then messages.
        let run = ledger.claim_run(&alice, GIB / 2, 0).expect("a run");
        let mut first = ledger.half_sent_by(&alice);
        first.grow(GIB / 4).expect("within her share");
        first.grow(GIB / 8).expect("shrinking is nothing");
        assert_eq!(first.held(), GIB / 4);
        let mut second = ledger.half_sent_by(&alice);
        assert_eq!(
            second
                .grow(GIB / 2)
                .expect_err("past her share")
                .to_string(),
            "a half-sent message of 536870912 bytes does not fit tenant token #1's memory \
             budget: its runs hold 536870912 and its half-sent messages 268435456 of \
             memory-budget 1073741824 bytes"
        );
        // What she half sends is memory her runs cannot have.
        assert_eq!(
            refusal(ledger.claim_run(&alice, GIB / 2, 0)),
            "memory 536870912 does not fit tenant token #1's memory budget: its runs hold \
             536870912 and its half-sent messages 268435456 of memory-budget 1073741824 \
             bytes; try again later"
        );
        // bob has his own share; the server's budget holds them together.
        let mut bobs = ledger.half_sent_by(&bob);
        bobs.grow(GIB).expect("bob's share");
        let mut bobs_run = ledger.half_sent_by(&bob);
        assert!(bobs_run.grow(1).is_err(), "bob's share is full");
        assert_eq!(ledger.half_sent(), GIB + GIB / 4);
        // The message ends, or its connection: the bytes go back.
        first.clear();
        drop(bobs);
        assert_eq!(ledger.half_sent(), 0);
        second.grow(GIB / 2).expect("room again");
        drop((second, run, bobs_run));
        let claimed = ledger.claimed();
        assert_eq!((claimed.half_sent, claimed.memory), (0, 0));
        assert!(claimed.tenants.is_empty());
    }

    #[test]
    fn a_revoked_tenant_is_refused_runs_and_loops_and_half_sends_on_the_servers_budget() {
        let mut budget = three_runs();
        budget.memory_budget = 2 * GIB;
        let roster = Arc::new(roster(&Credentials::Tokens(vec!["a".into(), "b".into()])));
        let ledger = Arc::new(Ledger::new(budget, None, Arc::clone(&roster)));
        let alice = roster.accept("a").expect("alice");
        let checked = roster
            .check(crate::identity::Tenants::from_tokens(["b"]))
            .expect("valid");
        roster.replace(
            checked,
            crate::tenants::tests::resolve,
            &runloop_metrics::ServerMetrics::new(),
        );
        let Err((reason, error)) = ledger.claim_run(&alice, 1, 0) else {
            panic!("a revoked tenant's run")
        };
        assert_eq!(reason, RunRefusal::Revoked);
        assert_eq!(error.0["kind"], "policy");
        assert!(
            error.0["error"]
                .as_str()
                .is_some_and(|w| w.contains("was revoked"))
        );
        assert!(refusal(ledger.claim_loop(&alice)).contains("was revoked"));
        let mut half = ledger.half_sent_by(&alice);
        half.grow(GIB + GIB / 2)
            .expect("within the server's budget");
        assert!(half.grow(2 * GIB + 1).is_err(), "past the server's");
        drop(half);
        assert_eq!(ledger.half_sent(), 0);
    }

    #[test]
    fn a_runs_disk_must_fit_the_free_space_less_what_admitted_runs_may_write() {
        let place = std::env::temp_dir();
        let free = filesystem_free(&place).expect("the free space of the temporary directory");
        let budget = RunBudget {
            max_run_disk: u64::MAX,
            disk_budget: u64::MAX,
            ..three_runs()
        };
        let roster = Arc::new(roster(&Credentials::Any));
        let ledger = Arc::new(Ledger::new(budget, Some(place), Arc::clone(&roster)));
        let anyone = roster.accept("").expect("any");
        // Six tenths of the free space, twice: the second cannot fit what
        // the first may still write, though nothing is written yet.
        let disk = free / 10 * 6;
        let first = ledger.claim_run(&anyone, 1, disk).expect("the first fits");
        let Err((reason, error)) = ledger.claim_run(&anyone, 1, disk) else {
            panic!("two disks of 60 % admitted")
        };
        assert_eq!(reason, RunRefusal::Disk);
        let words = error.0["error"].as_str().expect("words").to_owned();
        assert!(
            words.contains("does not fit the free space of the filesystem that holds runs' disks")
                && words.contains(&format!("may still write {disk}")),
            "{words}"
        );
        // No disk asks nothing of the filesystem.
        let none = ledger.claim_run(&anyone, 1, 0).expect("disk 0");
        drop((first, none));
        let again = ledger
            .claim_run(&anyone, 1, disk)
            .expect("its space is back");
        drop(again);
        assert!(ledger.claimed().disks.is_empty());
    }

    #[test]
    fn what_a_disk_file_holds_is_written_not_still_to_be() {
        let dir = std::env::temp_dir().join(format!("runloop-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let file = dir.join("disk.img");
        let sparse = std::fs::File::create(&file).expect("a file");
        sparse.set_len(64 << 20).expect("a sparse 64 MiB");
        let disk = RunDisk {
            size: 64 << 20,
            file: Some(file.clone()),
        };
        assert!(disk.still() > 63 << 20, "sparse: nothing written yet");
        std::fs::write(&file, vec![1u8; 16 << 20]).expect("16 MiB written");
        let still = disk.still();
        assert!(still <= 48 << 20, "{still}");
        std::fs::remove_dir_all(&dir).expect("removed");
        assert_eq!(disk.still(), 64 << 20, "a file gone holds nothing");
    }

    #[test]
    fn mem_total_is_read_in_bytes() {
        let meminfo = "MemTotal:       24684092 kB\nMemFree:         1000 kB\n";
        assert_eq!(mem_total(meminfo), Some(24684092 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total("MemTotal: lots\n"), None);
    }

    #[test]
    fn the_default_budget_is_a_part_of_the_machine() {
        let budget = default_memory_budget();
        assert!(budget >= Limit::MIN_RUN_MEMORY, "{budget}");
        assert_eq!(RunBudget::default().validate(), Ok(()));
    }

    #[test]
    fn a_warm_container_claims_the_servers_budgets_and_no_place_or_share() {
        let ledger = ledger(three_runs(), &Credentials::Tokens(vec!["a".into()]));
        let alice = ledger.tenants.accept("a").expect("a token");
        let warm = ledger
            .claim_reserve(7 * GIB + GIB / 2, 6 * GIB)
            .expect("fits the server's");
        {
            let claimed = ledger.claimed();
            assert_eq!(
                (claimed.runs, claimed.memory, claimed.disk),
                (0, 7 * GIB + GIB / 2, 6 * GIB)
            );
            assert!(claimed.tenants.is_empty(), "no tenant's share");
        }
        // What it holds is not there for runs, nor for more warm ones.
        assert!(ledger.claim_reserve(GIB, 0).is_none());
        assert_eq!(
            refusal(ledger.claim_run(&alice, GIB, GIB)),
            "memory 1073741824 does not fit this server's memory budget: runs hold 8053063680 \
             of memory_budget 8589934592 bytes; try again later"
        );
        drop(warm);
        let claimed = ledger.claimed();
        assert_eq!((claimed.runs, claimed.memory, claimed.disk), (0, 0, 0));
    }
}
