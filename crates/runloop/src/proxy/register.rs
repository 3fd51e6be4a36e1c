//! The `/agent/register` path: `{"agent": …}` in, exactly one message out
//! (`[0]` registered, or `[1][error]`), then the close (protocol §10).
//!
//! The ask goes to the agent program's `POST /register` as it came; the
//! proxy only checks that it is an object with an `agent` member, so a
//! malformed ask is refused here with words that say what is wrong. The
//! registration is claimed before the call and confirmed only on a 2xx, so
//! a second registration, or one racing the first, is an error, while a
//! failed one leaves the proxy free to be registered.

use std::borrow::Cow;
use std::collections::BTreeMap;

use bytes::Bytes;
use runloop_proto::run_loop::CHUNK;
use serde_json::value::RawValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::upstream::Failure;
use super::{End, SHUTTING_DOWN, Shared, Ws, ask, end, error_message, left, proxy_error};
use crate::metrics::Registration;

/// Serves one `/agent/register` path.
pub(super) async fn serve(mut ws: Ws, shared: &Shared, shutdown: &CancellationToken) {
    let ask = match ask(&mut ws, shutdown).await {
        Ok(ask) => ask,
        Err(left) => return end(ws, left, &shared.config).await,
    };
    let outcome = register(&mut ws, shared, ask, shutdown).await;
    end(ws, outcome, &shared.config).await;
}

async fn register(ws: &mut Ws, shared: &Shared, ask: Bytes, shutdown: &CancellationToken) -> End {
    let counted = &shared.metrics.registrations;
    if let Err(why) = check(&ask) {
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
        left = left(ws) => left,
        registered = shared.upstream.register(ask) => match registered {
            Ok(()) => {
                claim.confirm();
                counted.inc(Registration::Registered);
                info!("agent registered");
                End::Answer(Some(Message::Binary(Bytes::from_static(&[CHUNK]))))
            }
            Err(Failure(json)) => {
                counted.inc(Registration::Failed);
                warn!(error = %String::from_utf8_lossy(&json), "registration failed");
                End::Answer(Some(error_message(&json)))
            }
        },
    }
}

/// Whether the ask is a JSON object with an `agent` member (of any value).
fn check(ask: &[u8]) -> Result<(), String> {
    let members: BTreeMap<Cow<'_, str>, &RawValue> =
        serde_json::from_slice(ask).map_err(|error| error.to_string())?;
    if members.contains_key("agent") {
        Ok(())
    } else {
        Err("it has no `agent` member".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ask_is_an_object_with_an_agent() {
        assert_eq!(check(br#"{"agent":null}"#), Ok(()));
        assert_eq!(check(br#" {"x":1, "agent": {"a": [1]}} "#), Ok(()));
        assert_eq!(
            check(br#"{"x":1}"#),
            Err("it has no `agent` member".to_owned())
        );
        assert!(check(br#"["agent"]"#).is_err());
        assert!(check(br#"{"agent":1} x"#).is_err());
        assert!(check(b"").is_err());
    }
}
