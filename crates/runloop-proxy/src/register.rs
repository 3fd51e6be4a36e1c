//! The `/agent/register` path: `{"agent": …}` in, exactly one message out
//! (`[0]` registered, or `[1][error]`), then the close (protocol §10).
//!
//! The ask goes to the agent program's `POST /register` as it came; the
//! proxy only checks that it is an object with an `agent` member, so a
//! malformed ask is refused here with words that say what is wrong. The
//! registration is claimed before the call and confirmed only on a 2xx, so
//! a second registration, or one racing the first, is an error, while a
//! failed one leaves the proxy free to be registered.

use bytes::Bytes;
use runloop_proto::registration::{RegistrationAnswer, RegistrationAsk};
use runloop_proto::{Decode, Encode};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Shared;
use super::path::{End, SHUTTING_DOWN, Ws, ask, end, error_message, left, proxy_error};
use super::upstream::Failure;
use runloop_metrics::Registration;

/// Serves one `/agent/register` path.
pub(super) async fn serve(mut ws: Ws, shared: &Shared, shutdown: &CancellationToken) {
    let ask = match ask(&mut ws, shutdown).await {
        Ok(ask) => ask,
        Err(left) => return end(ws, left, &shared.config).await,
    };
    // Dropping the answer's future (the server left) releases its claim.
    let outcome = tokio::select! {
        left = left(&mut ws) => left,
        answered = answer(shared, ask, shutdown) => answered,
    };
    end(ws, outcome, &shared.config).await;
}

/// The registration `ask` gets, whichever path carries it: its one
/// message, `[0]` or `[1][error]`.
pub(super) async fn answer(shared: &Shared, ask: Bytes, shutdown: &CancellationToken) -> End {
    let counted = &shared.metrics.registrations;
    if let Err(why) = RegistrationAsk::decode(&ask) {
        counted.inc(Registration::Refused);
        return End::Answer(Some(proxy_error(format!(
            "the registration did not parse: {why}"
        ))));
    }
    let claim = match shared.state.claim_registration() {
        Ok(claim) => claim,
        Err(why) => {
            counted.inc(Registration::Refused);
            warn!(why, "registration refused");
            return End::Answer(Some(proxy_error(why)));
        }
    };
    // Dropping the claim on any early return releases it.
    tokio::select! {
        () = shutdown.cancelled() => {
            counted.inc(Registration::Failed);
            End::Answer(Some(proxy_error(SHUTTING_DOWN)))
        }
        registered = shared.upstream.register(ask) => match registered {
            Ok(()) => {
                claim.confirm();
                counted.inc(Registration::Registered);
                info!("agent registered");
                let Ok(registered) = RegistrationAnswer::Registered.to_vec();
                End::Answer(Some(registered.into()))
            }
            Err(Failure(json)) => {
                counted.inc(Registration::Failed);
                warn!(error = %String::from_utf8_lossy(&json), "registration failed");
                End::Answer(Some(error_message(&json)))
            }
        },
    }
}
