//! The proxy's claims: one registration in its life, one loop at a time
//! (protocol §10).
//!
//! Each is a claim on shared state that releases itself when dropped, so no
//! exit path of a task can leave the proxy wedged. A registration that
//! failed releases its claim, so it may be tried again; one that succeeded
//! is final.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Registration and the one running loop.
#[derive(Debug, Default)]
pub(super) struct State {
    registration: Mutex<Registration>,
    /// Shared with the claim, which a loop owns wherever it runs (a task of
    /// the proxy's, or the server's relay in the same process).
    running: Arc<AtomicBool>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Registration {
    #[default]
    None,
    Pending,
    Done,
}

/// A claim on the registration; dropped unconfirmed, it is released.
pub(super) struct RegistrationClaim<'a> {
    state: &'a State,
    confirmed: bool,
}

impl RegistrationClaim<'_> {
    pub(super) fn confirm(mut self) {
        self.confirmed = true;
        *self.state.registration() = Registration::Done;
    }
}

impl Drop for RegistrationClaim<'_> {
    fn drop(&mut self) {
        if !self.confirmed {
            *self.state.registration() = Registration::None;
        }
    }
}

/// The claim on the one loop; dropping it frees the proxy for the next.
pub(super) struct LoopClaim(Arc<AtomicBool>);

impl Drop for LoopClaim {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl State {
    fn registration(&self) -> std::sync::MutexGuard<'_, Registration> {
        // The guarded value is a plain enum, valid whatever a panicking
        // holder was doing.
        self.registration
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn claim_registration(&self) -> Result<RegistrationClaim<'_>, &'static str> {
        let mut registration = self.registration();
        match *registration {
            Registration::None => {
                *registration = Registration::Pending;
                Ok(RegistrationClaim {
                    state: self,
                    confirmed: false,
                })
            }
            Registration::Pending => Err("a registration is already under way"),
            Registration::Done => Err("an agent is already registered with this proxy"),
        }
    }

    pub(super) fn claim_loop(&self) -> Result<LoopClaim, &'static str> {
        if *self.registration() != Registration::Done {
            return Err("no agent is registered with this proxy");
        }
        self.running
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| LoopClaim(Arc::clone(&self.running)))
            .map_err(|_| "a loop is already running")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_is_once_and_a_failed_one_is_released() {
        let state = State::default();
        assert_eq!(
            state.claim_loop().err(),
            Some("no agent is registered with this proxy")
        );
        let claim = state.claim_registration().expect("first");
        assert_eq!(
            state.claim_registration().err(),
            Some("a registration is already under way")
        );
        drop(claim);
        let claim = state.claim_registration().expect("released by the failure");
        claim.confirm();
        assert_eq!(
            state.claim_registration().err(),
            Some("an agent is already registered with this proxy")
        );
    }

    #[test]
    fn one_loop_at_a_time() {
        let state = State::default();
        state.claim_registration().expect("first").confirm();
        let running = state.claim_loop().expect("first loop");
        assert_eq!(state.claim_loop().err(), Some("a loop is already running"));
        drop(running);
        assert!(state.claim_loop().is_ok());
    }
}
