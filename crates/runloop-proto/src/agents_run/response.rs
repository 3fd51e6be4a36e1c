//! The scope's main stream for `containers::agents::run`.
//!
//! ```text
//! [0x00]{"id":"<string>"}    the container runs; nothing more until the finish
//! [0x01][error JSON]         it will not run; the finish follows
//! ```

use serde::{Deserialize, Serialize};

use crate::codec::{Decode, Encode, Writer};
use crate::error_value::{self, ErrorValue};

/// The tag of the run's id.
const ID: u8 = 0;

/// One response on a run scope's main stream.
#[derive(Debug, Clone, PartialEq)]
pub enum RunResponse {
    /// The run's id: the container is running.
    Id(String),
    /// The run will not happen.
    Error(ErrorValue),
}

#[derive(Serialize, Deserialize)]
struct IdObject<'a> {
    #[serde(borrow)]
    id: std::borrow::Cow<'a, str>,
}

/// A main-stream response that could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunResponseError {
    /// No bytes.
    #[error("run response is empty")]
    Empty,
    /// A tag other than 0 or 1.
    #[error("unknown run response tag {0}")]
    UnknownTag(u8),
    /// Tag 0 without `{"id": "<string>"}`.
    #[error("run id did not parse")]
    Id(#[source] serde_json::Error),
    /// Tag 1 without exactly one JSON value.
    #[error("run error did not parse")]
    Error(#[source] serde_json::Error),
}

impl Decode<'_> for RunResponse {
    type Error = RunResponseError;

    fn decode(payload: &[u8]) -> Result<Self, RunResponseError> {
        let (&tag, rest) = payload.split_first().ok_or(RunResponseError::Empty)?;
        match tag {
            ID => crate::codec::from_object::<IdObject<'_>>(rest)
                .map(|object| RunResponse::Id(object.id.into_owned()))
                .map_err(RunResponseError::Id),
            error_value::TAG => ErrorValue::decode(rest)
                .map(RunResponse::Error)
                .map_err(RunResponseError::Error),
            other => Err(RunResponseError::UnknownTag(other)),
        }
    }
}

impl Encode for RunResponse {
    type Error = serde_json::Error;

    fn encode(&self, out: &mut Writer<'_>) -> Result<(), serde_json::Error> {
        match self {
            RunResponse::Id(id) => {
                out.push(ID);
                serde_json::to_writer(
                    out,
                    &IdObject {
                        id: id.as_str().into(),
                    },
                )
            }
            RunResponse::Error(error) => {
                error.write_tagged(out);
                Ok(())
            }
        }
    }

    fn size_hint(&self) -> usize {
        64
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn golden_id_and_error() {
        let id = RunResponse::decode(b"\x00{\"id\":\"r-1\"}").expect("decodes");
        assert_eq!(id, RunResponse::Id("r-1".into()));
        assert_eq!(id.to_vec().expect("encodes"), b"\x00{\"id\":\"r-1\"}");
        let error = RunResponse::decode(b"\x01{\"kind\":\"policy\"}").expect("decodes");
        assert_eq!(
            error,
            RunResponse::Error(ErrorValue::new(json!({"kind": "policy"})))
        );
        assert_eq!(
            error.to_vec().expect("encodes"),
            b"\x01{\"kind\":\"policy\"}"
        );
    }

    #[test]
    fn errors() {
        assert_eq!(
            RunResponse::decode(b"").expect_err("e").to_string(),
            "run response is empty"
        );
        assert_eq!(
            RunResponse::decode(b"\x02").expect_err("e").to_string(),
            "unknown run response tag 2"
        );
        assert!(matches!(
            RunResponse::decode(b"\x00{\"id\":1}"),
            Err(RunResponseError::Id(_))
        ));
        assert!(matches!(
            RunResponse::decode(b"\x01"),
            Err(RunResponseError::Error(_))
        ));
    }
}
