//! Warm pools' claims: what a container kept started for runs to come
//! holds of the ledger, and how the server counts it.
//!
//! A runtime that keeps containers warm ([`Reserve`]) claims each one's
//! memory and disk of the server-wide budgets, not of any tenant's share:
//! no run asked for it yet. The claim is held while the container waits,
//! and given back when it goes — to a run, whose own claim (its tenant's,
//! as for any run) holds it from then on, or away. Warm containers are a
//! gauge of the server's figures; runs served by one, a counter.

use std::sync::Arc;

use runloop_runtime::{Reserve, Reserved};

use super::budget::Claim;
use super::shared::{Held, Shared, Stats};

/// The server's side of its runtimes' warm pools.
#[derive(Debug)]
pub(crate) struct Pools {
    shared: Arc<Shared>,
}

impl Pools {
    pub(crate) fn new(shared: Arc<Shared>) -> Pools {
        Pools { shared }
    }
}

impl Reserve for Pools {
    fn claim(&self, memory: u64, disk: u64) -> Option<Box<dyn Reserved>> {
        let claim = self.shared.ledger.claim_reserve(memory, disk)?;
        Some(Box::new(Warm {
            _claim: claim,
            _held: Held::new(&self.shared, |s: &Stats| &s.warm),
            shared: Arc::clone(&self.shared),
        }))
    }
}

/// One warm container's claim, counted while it is held.
struct Warm {
    _claim: Claim,
    _held: Held,
    shared: Arc<Shared>,
}

impl Reserved for Warm {
    fn used(self: Box<Self>) {
        self.shared.metrics.runs_started_warm.inc();
    }
}
