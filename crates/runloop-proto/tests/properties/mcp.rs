//! The MCP types chunks carry: every content block kind, annotations and
//! `_meta` read back as written, in the same bytes, wherever `type` stands.
//!
//! These are runloop-proto's own types (`runloop_proto::mcp`), so nothing
//! outside the crate vouches for their JSON: the golden tests beside them
//! pin known bytes, and these laws hold over arbitrary values.

use proptest::prelude::*;
use runloop_proto::mcp::{Annotations, ContentBlock, Meta};
use serde_json::Value;

use crate::strategy;

/// The members of `value`'s object in reverse order: `type` last.
fn reversed(value: &Value) -> String {
    let Value::Object(members) = value else {
        panic!("not an object: {value}");
    };
    let reversed: serde_json::Map<String, Value> = members
        .iter()
        .rev()
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    serde_json::to_string(&reversed).expect("serializes")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Every block kind reads back equal, writes the same bytes again, and
    /// reads the same with its members in reverse order (`type` last).
    #[test]
    fn content_blocks(block in strategy::content_block()) {
        let text = serde_json::to_string(&block).expect("serializes");
        let type_first = format!("{{\"type\":\"{}\"", block.kind());
        prop_assert!(text.starts_with(&type_first), "{}", text);
        let read: ContentBlock = serde_json::from_str(&text).expect("decodes");
        prop_assert_eq!(&read, &block);
        prop_assert_eq!(serde_json::to_string(&read).expect("serializes"), text.clone());

        let value: Value = serde_json::from_str(&text).expect("JSON");
        let backwards = reversed(&value);
        let read: ContentBlock = serde_json::from_str(&backwards).expect("type last decodes");
        prop_assert_eq!(read, block);
    }

    /// Annotations read back equal and write the same bytes again.
    #[test]
    fn annotations(annotations in strategy::annotations()) {
        let annotations = annotations.unwrap_or_default();
        let text = serde_json::to_string(&annotations).expect("serializes");
        let read: Annotations = serde_json::from_str(&text).expect("decodes");
        prop_assert_eq!(&read, &annotations);
        prop_assert_eq!(serde_json::to_string(&read).expect("serializes"), text);
    }

    /// `_meta` keeps its members in the order they came, however they are
    /// named, and however often it is read and written.
    #[test]
    fn meta_keeps_member_order(
        members in prop::collection::vec((strategy::text(), strategy::json_value()), 0..8),
    ) {
        let object: serde_json::Map<String, Value> = members.into_iter().collect();
        let order: Vec<String> = object.keys().cloned().collect();
        let text = serde_json::to_string(&object).expect("serializes");
        let meta: Meta = serde_json::from_str(&text).expect("decodes");
        let read_order: Vec<String> = meta.keys().cloned().collect();
        prop_assert_eq!(read_order, order);
        prop_assert_eq!(serde_json::to_string(&meta).expect("serializes"), text);
    }
}
