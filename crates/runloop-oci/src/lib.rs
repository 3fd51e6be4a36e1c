//! Agents in OCI containers: the `oci` runtime of runloop.
//!
//! A provider's server runs someone else's agent image. This crate takes an
//! image — from an OCI image layout on disk (`NAME=oci:DIR` in the
//! catalog) or pulled from a registry the operator allowed — checks every
//! byte of it against its digest, unpacks it without letting any entry land
//! outside its root, and runs it with runc in its own namespaces, with the
//! run's `memory` as a cgroup limit and its `disk` as the size of a file
//! system made for the run.
//!
//! ```text
//! layout / registry ──digests checked──▶ store (blobs, unpacked images)
//!                                            │ overlay: image (lower) + run's ext4 (upper, /tmp)
//!                                            ▼
//! server ──in process──▶ proxy (host) ──link: a socket made in the run's netns──▶ agent program on 127.0.0.1:$PORT
//!                                              (runc: pid, mount, ipc, uts, net namespaces — the net one has lo only,
//!                                               and a NAT'd veth out with `--container-egress`;
//!                                               memory and pids cgroup limits)
//! ```
//!
//! The modules, in the order an image meets them: [`digest`], [`layout`],
//! [`image`], [`unpack`], [`store`] (bounded by [`gc`]) — and for `registry` images
//! [`registry`] before them; then a run: [`host`] (what runs
//! share, checked at startup), [`container`] (one container's life, [`run`] what the
//! server holds of it; its [`pool`] of warm ones), and
//! the parts it is made of — [`disk`] (with [`loopdev`]), [`network`], [`egress`] (with
//! [`conntrack`]), [`user`], [`bundle`],
//! [`runc`] (with [`filter`], the syscall filter made once), [`cgroup`],
//! [`link`], [`command`].

pub mod bundle;
pub mod cgroup;
pub mod command;
pub mod conntrack;
pub mod container;
pub mod digest;
pub mod disk;
pub mod distribution;
pub mod egress;
pub mod filter;
pub mod gc;
pub mod host;
pub mod image;
pub mod init;
pub mod layout;
pub mod link;
pub mod loopdev;
pub mod network;
pub mod pool;
pub mod registry;
pub mod run;
pub mod runc;
pub mod seccomp;
pub mod store;
pub mod teardown;
pub mod unpack;
pub mod user;

pub use container::OciRuntime;
pub use host::{Host, HostConfig, HostError};
/// The OCI spec types this crate's API speaks (media types, descriptors).
pub use oci_spec;
pub use pool::PoolConfig;
pub use run::{OciContainer, OciRun};

/// A random name for a temporary file or a run: 12 lowercase hex digits
/// (48 bits), short enough for an interface name.
pub fn random_name() -> String {
    let mut bytes = [0u8; 6];
    // Without randomness the process id and a counter still keep names
    // apart within this host.
    if getrandom::fill(&mut bytes).is_err() {
        use std::sync::atomic::{AtomicU32, Ordering};
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        bytes[..4].copy_from_slice(&std::process::id().to_be_bytes());
        bytes[4..].copy_from_slice(&count.to_be_bytes()[2..]);
    }
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
