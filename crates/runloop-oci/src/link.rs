//! The agent link: how the host-side proxy reaches the agent program
//! inside the container's network namespace, and what a connection lost
//! on the way means.
//!
//! ```text
//! proxy ──each call: a socket made in the run's netns (Link::connect)──▶ agent (127.0.0.1:PORT)
//!   connection lost before the answer's end ──▶ Link::lost: out of memory? end the container
//! ```
//!
//! Every connection to the agent is made with [`Netns::connect`], so it can
//! reach nothing but the run's own loopback (module
//! [`network`](crate::network)); the proxy reads and writes it itself,
//! with nothing copying between. A dial that fails (the agent stopped
//! listening, the container is gone) is said by the proxy as `cannot
//! reach the agent program on 127.0.0.1:PORT in the run's network
//! namespace runloop-KEY: …`, or as the container's end when its
//! supervisor reports one first; a registration sent to a run that is
//! over fails, and is never sent anywhere else.
//!
//! When a call's connection is lost before its answer ended (refused,
//! closed, reset), the proxy asks the link ([`Dial::lost`]), and the link
//! reads the container's OOM count. If the kernel killed something for
//! memory, the link tells the supervisor (which kills the whole container:
//! a container that ran out of memory is over) and the proxy waits for the
//! words of that end, which name memory, instead of the moment it waits
//! for an exit otherwise: the loop's error is that reason, not "the
//! stream broke".

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use runloop_runtime::netns::Dialer;
use runloop_runtime::{Dial, Dialing};

use crate::network::Netns;

/// What the link asks of the container's supervisor.
pub trait Watch: Send + Sync + 'static {
    /// Whether the kernel has OOM-killed a process of the container.
    fn out_of_memory(&self) -> bool;
    /// Asks for the container to be ended because it ran out of memory.
    fn end_for_memory(&self);
}

/// The proxy's dial to the agent program: the runtime's dial to a port of
/// the run's namespace ([`Dialer`], exec's too), the namespace's name for
/// the words, and the container's supervisor to tell of a memory death.
#[derive(Clone)]
pub struct Link {
    dialer: Dialer,
    namespace: Arc<str>,
    watch: Arc<dyn Watch>,
}

impl Link {
    /// The link to the agent program on `port` in `netns`, whose
    /// supervisor `watch` is.
    pub fn new(netns: &Netns, port: u16, watch: Arc<dyn Watch>) -> Link {
        Link {
            dialer: netns.dialer(port),
            namespace: Arc::from(netns.name()),
            watch,
        }
    }
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("dialer", &self.dialer)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.dialer, self.namespace)
    }
}

impl Dial for Link {
    fn address(&self) -> SocketAddr {
        self.dialer.address()
    }

    fn connect(&self) -> Dialing<'_> {
        self.dialer.connect()
    }

    /// Out of memory: the container is ended for it, and its end will
    /// say so.
    fn lost(&self) -> bool {
        if !self.watch.out_of_memory() {
            return false;
        }
        self.watch.end_for_memory();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A supervisor of a test's own: out of memory or not, and whether it
    /// was asked to end the container.
    #[derive(Default)]
    struct Fake {
        out_of_memory: AtomicBool,
        ended: AtomicBool,
    }

    impl Watch for Fake {
        fn out_of_memory(&self) -> bool {
            self.out_of_memory.load(Ordering::SeqCst)
        }

        fn end_for_memory(&self) {
            self.ended.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_lost_connection_ends_the_container_only_when_its_memory_ran_out() {
        if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
            return;
        }
        let key = format!("linktest{}", std::process::id());
        let netns = crate::network::create(&key).await.expect("a namespace");
        // Unbound however the test ends, so a failed run leaves nothing.
        let _unbound = Unbound(crate::network::namespace_path(&key));
        let fake = Arc::new(Fake::default());
        let link = Link::new(&netns, 8080, Arc::clone(&fake) as Arc<dyn Watch>);
        assert_eq!(
            link.to_string(),
            format!(
                "127.0.0.1:8080 in the run's network namespace {}",
                netns.name()
            )
        );
        assert_eq!(
            link.address(),
            SocketAddr::from((Ipv4Addr::LOCALHOST, 8080))
        );
        // Nothing listens there (whatever the host has on 8080).
        let refused = link.connect().await.expect_err("nothing listens");
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        assert!(!link.lost(), "not out of memory: nothing is ending");
        assert!(!fake.ended.load(Ordering::SeqCst));
        fake.out_of_memory.store(true, Ordering::SeqCst);
        assert!(link.lost(), "out of memory: the container is ending");
        assert!(fake.ended.load(Ordering::SeqCst));
        drop(link);
        drop(netns);
        crate::network::remove(&key).await.expect("removed");
        assert!(!crate::network::namespace_path(&key).exists());
    }

    /// Unbinds the namespace bound at its path when dropped.
    struct Unbound(std::path::PathBuf);

    impl Drop for Unbound {
        fn drop(&mut self) {
            let _ = runloop_runtime::netns::remove_at(&self.0);
        }
    }
}
