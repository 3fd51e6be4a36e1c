//! A fake internet for the egress tests: a network namespace of the
//! test's own behind a veth from the host, at 198.51.100.(4·slot+2)
//! (TEST-NET-2, which no real host is), with no route back to the runs'
//! network, so a reply reaches a run only through the host's NAT. The
//! test puts its own service in it ([`Uplink::path`]); the namespace and
//! its veth go when the [`Uplink`] is dropped.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// The namespace, its name and both ends' addresses.
#[derive(Debug)]
pub struct Uplink {
    /// The namespace's name (`ip netns`).
    pub name: String,
    /// The host's end of the veth.
    pub host: Ipv4Addr,
    /// The namespace's end (its `eth0`): the internet's address.
    pub far: Ipv4Addr,
}

impl Uplink {
    /// Makes the namespace for `slot` (each test its own, so tests that
    /// run at once do not share a /30), its veth, both addresses, its
    /// links up (loopback too).
    pub fn new(slot: u8) -> Uplink {
        static MADE: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "{:05x}{:03x}",
            std::process::id() & 0xf_ffff,
            MADE.fetch_add(1, Ordering::Relaxed) & 0xfff
        );
        let name = format!("rlt-inet-{tag}");
        let link = format!("rlti{tag}");
        let host = Ipv4Addr::new(198, 51, 100, 4 * slot + 1);
        let far = Ipv4Addr::new(198, 51, 100, 4 * slot + 2);
        ip(&["netns", "add", &name]);
        let uplink = Uplink { name, host, far };
        ip(&[
            "link",
            "add",
            &link,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &uplink.name,
        ]);
        ip(&["addr", "add", &format!("{host}/30"), "dev", &link]);
        ip(&["link", "set", &link, "up"]);
        let inside = ["-n", uplink.name.as_str()];
        let far_cidr = format!("{far}/30");
        ip(&[&inside[..], &["addr", "add", &far_cidr, "dev", "eth0"]].concat());
        ip(&[&inside[..], &["link", "set", "eth0", "up"]].concat());
        ip(&[&inside[..], &["link", "set", "lo", "up"]].concat());
        uplink
    }

    /// The namespace's path, to enter it (`nsenter --net=`, `setns`).
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }
}

impl Drop for Uplink {
    fn drop(&mut self) {
        // The veth goes with the namespace.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Runs `ip ARGS…`; a failure fails the test.
pub fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("ip runs");
    assert!(status.success(), "ip {args:?}");
}
