//! The bare messages of a proxy path (protocol §10): `[0]` + a chunk's
//! JSON, `[1]` + an error value, as the scripted proxies of several test
//! suites send them.

/// A chunk message: `[0]` + a text chunk's JSON.
pub fn chunk(text: &str) -> Vec<u8> {
    let mut message = vec![0];
    message.extend_from_slice(
        serde_json::json!({"type": "assistant_text_content", "text": text})
            .to_string()
            .as_bytes(),
    );
    message
}

/// An error message: `[1]` + the JSON.
pub fn error(value: serde_json::Value) -> Vec<u8> {
    let mut message = vec![1];
    message.extend_from_slice(value.to_string().as_bytes());
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_and_an_error_are_their_tag_and_their_json() {
        assert_eq!(
            chunk("hi"),
            b"\x00{\"type\":\"assistant_text_content\",\"text\":\"hi\"}"
        );
        assert_eq!(error(serde_json::json!("no")), b"\x01\"no\"");
    }
}
