//! `annotations`: hints for whoever shows or uses a piece of content.
//!
//! MCP defines three, all optional: who the content is for (`audience`),
//! how much it matters (`priority`, a number MCP means to lie in 0 to 1),
//! and when it last changed (`lastModified`, an ISO 8601 string). None of
//! them is checked here beyond its JSON type: they are hints, carried as
//! they came.

use serde::{Deserialize, Deserializer, Serialize};

/// MCP annotations.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Annotations {
    /// Who the content is meant for; both roles when it serves both.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audience: Option<Vec<Role>>,
    /// How important the content is, from 0 (not at all) to 1 (required).
    ///
    /// Kept as a 32-bit float, as runloop always has, so a priority is
    /// written back with the digits it was read as a 32-bit float.
    #[serde(
        default,
        deserialize_with = "priority",
        skip_serializing_if = "Option::is_none"
    )]
    pub priority: Option<f32>,
    /// When the content last changed, as ISO 8601 text (not checked).
    #[serde(rename = "lastModified", skip_serializing_if = "Option::is_none")]
    pub last_modified: Option<String>,
}

/// Reads a priority as any JSON number (an integer too) or `null`, then
/// narrows it to `f32`.
///
/// The number is read as serde_json's `Number`, whatever serde buffers it
/// as: a content block is read through serde's buffer (its `type` may come
/// last), and `Number` reads the same from it as from the text. A number
/// beyond `f32`'s range narrows to an infinity, which the chunk decoder
/// refuses (see `run_loop::chunk::check_priorities`).
fn priority<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<f32>, D::Error> {
    let Some(number) = Option::<serde_json::Number>::deserialize(deserializer)? else {
        return Ok(None);
    };
    let wide = number
        .as_f64()
        .ok_or_else(|| serde::de::Error::custom(format_args!("number out of range: {number}")))?;
    // Narrowing is the point: MCP's number held as a 32-bit float.
    #[allow(clippy::cast_possible_truncation)]
    Ok(Some(wide as f32))
}

/// Who a message or piece of content is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Role {
    /// `user`: the person, or the program, on the caller's side.
    User,
    /// `assistant`: the model.
    Assistant,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(text: &str) -> Result<Annotations, serde_json::Error> {
        serde_json::from_str(text)
    }

    #[test]
    fn every_member_round_trips_in_order() {
        let text = r#"{"audience":["user","assistant"],"priority":0.8,"lastModified":"2025-01-12T15:00:58Z"}"#;
        let annotations = parse(text).expect("parses");
        assert_eq!(
            annotations,
            Annotations {
                audience: Some(vec![Role::User, Role::Assistant]),
                priority: Some(0.8),
                last_modified: Some("2025-01-12T15:00:58Z".into()),
            }
        );
        assert_eq!(
            serde_json::to_string(&annotations).expect("serializes"),
            text
        );
    }

    #[test]
    fn absent_and_null_members_are_none_and_not_written() {
        for text in [
            "{}",
            r#"{"audience":null,"priority":null,"lastModified":null}"#,
        ] {
            let annotations = parse(text).expect(text);
            assert_eq!(annotations, Annotations::default());
            assert_eq!(
                serde_json::to_string(&annotations).expect("serializes"),
                "{}"
            );
        }
    }

    #[test]
    fn a_priority_is_any_number_narrowed_to_f32() {
        for (text, expected) in [
            ("1", 1.0f32),
            ("0", 0.0),
            ("0.60", 0.6),
            ("6e-1", 0.6),
            ("-3", -3.0),
            ("0.123456789", 0.123_456_79),
        ] {
            let annotations = parse(&format!(r#"{{"priority":{text}}}"#)).expect(text);
            assert_eq!(annotations.priority, Some(expected), "{text}");
        }
        // Written with the digits of the 32-bit float.
        let narrowed = parse(r#"{"priority":0.123456789}"#).expect("parses");
        assert_eq!(
            serde_json::to_string(&narrowed).expect("serializes"),
            r#"{"priority":0.12345679}"#
        );
        // Beyond f32 it is an infinity, which the chunk decoder refuses.
        let huge = parse(r#"{"priority":1e40}"#).expect("parses");
        assert_eq!(huge.priority, Some(f32::INFINITY));
        // Read the same through serde's buffer, as a content block reads it.
        let buffered: Annotations =
            serde_json::from_value(json!({"priority": 1})).expect("from a Value");
        assert_eq!(buffered.priority, Some(1.0));
    }

    #[test]
    fn members_of_the_wrong_shape_are_refused() {
        for bad in [
            r#"{"priority":"high"}"#,
            r#"{"audience":["user","system"]}"#,
            r#"{"audience":"user"}"#,
            r#"{"lastModified":5}"#,
            "[]",
            "null",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let role = parse(r#"{"audience":["owner"]}"#).expect_err("unknown role");
        assert!(
            role.to_string()
                .contains("unknown variant `owner`, expected `user` or `assistant`"),
            "{role}"
        );
    }

    #[test]
    fn unknown_members_are_tolerated() {
        let annotations =
            parse(r#"{"priority":1,"title":"x","audience":[]}"#).expect("an extra member");
        assert_eq!(annotations.audience, Some(vec![]));
        assert_eq!(annotations.priority, Some(1.0));
    }
}
