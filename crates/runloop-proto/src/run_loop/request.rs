//! The run-loop request: `{"prompt": "<string>"}` (protocol §7).
//!
//! The server checks that the request decodes, then hands the proxy the
//! caller's bytes, not a re-encoding of them: members this version does not
//! know travel on untouched. So a decoded request keeps its JSON text beside
//! the prompt it read from it.

use std::borrow::Cow;

use serde::Deserialize;

use crate::codec::{Decode, Encode, Writer};

/// A run-loop request: its JSON text, and the prompt read from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunLoopRequest<'a> {
    json: Cow<'a, [u8]>,
    prompt: Cow<'a, str>,
}

#[derive(Deserialize)]
struct Shape<'a> {
    #[serde(borrow)]
    prompt: Cow<'a, str>,
}

impl RunLoopRequest<'static> {
    /// A request for `prompt`, encoded as `{"prompt": …}`.
    pub fn new(prompt: impl Into<String>) -> Self {
        let prompt = prompt.into();
        let json = serde_json::to_vec(&serde_json::json!({ "prompt": prompt }))
            .unwrap_or_else(|_| unreachable!("a JSON object of one string always serializes"));
        RunLoopRequest {
            json: Cow::Owned(json),
            prompt: Cow::Owned(prompt),
        }
    }
}

impl<'a> RunLoopRequest<'a> {
    /// The prompt.
    pub fn prompt(&self) -> &str {
        &self.prompt
    }

    /// The request's JSON text, exactly as it was received or built.
    pub fn json(&self) -> &[u8] {
        &self.json
    }

    /// A copy that owns its bytes.
    pub fn into_owned(self) -> RunLoopRequest<'static> {
        RunLoopRequest {
            json: Cow::Owned(self.json.into_owned()),
            prompt: Cow::Owned(self.prompt.into_owned()),
        }
    }
}

impl<'a> Decode<'a> for RunLoopRequest<'a> {
    type Error = serde_json::Error;

    /// A JSON object with a string `prompt`; other members are tolerated
    /// (and relayed).
    fn decode(json: &'a [u8]) -> Result<Self, serde_json::Error> {
        let Shape { prompt } = crate::codec::from_object(json)?;
        Ok(RunLoopRequest {
            json: Cow::Borrowed(json),
            prompt,
        })
    }
}

impl Encode for RunLoopRequest<'_> {
    type Error = std::convert::Infallible;

    fn encode(&self, out: &mut Writer<'_>) -> Result<(), Self::Error> {
        out.extend_from_slice(&self.json);
        Ok(())
    }

    fn size_hint(&self) -> usize {
        self.json.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_builds_the_json() {
        let request = RunLoopRequest::new("say \"hi\"");
        assert_eq!(request.json(), br#"{"prompt":"say \"hi\""}"#);
        assert_eq!(request.prompt(), "say \"hi\"");
        assert_eq!(
            RunLoopRequest::decode(request.json()).expect("decodes"),
            request
        );
    }

    #[test]
    fn decode_keeps_the_bytes_verbatim() {
        let json = br#"{ "prompt" : "x", "model": {"temperature": 0.25} }"#;
        let request = RunLoopRequest::decode(json).expect("decodes");
        assert_eq!(request.prompt(), "x");
        assert_eq!(request.to_vec().expect("infallible"), json);
    }

    #[test]
    fn escaped_prompts_are_unescaped() {
        let request = RunLoopRequest::decode(br#"{"prompt":"a\nb\u00e9"}"#).expect("decodes");
        assert_eq!(request.prompt(), "a\nb\u{e9}");
    }

    #[test]
    fn malformed_requests() {
        for bad in [
            &b""[..],
            b"{}",
            b"{\"prompt\":5}",
            b"{\"prompt\":null}",
            b"[\"prompt\"]",
            b"{\"prompt\":\"x\"} trailing",
            b"\xff",
        ] {
            assert!(
                RunLoopRequest::decode(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
