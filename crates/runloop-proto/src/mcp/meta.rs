//! `_meta`: the member MCP reserves on its objects for data about them.
//!
//! Any JSON object is a valid `_meta`; MCP gives some key prefixes meaning,
//! but the channel only carries the object. Its members keep the order they
//! came in (serde_json's `preserve_order`, which this workspace turns on), so
//! a relayed or re-encoded chunk writes them back as they were read.

use std::ops::{Deref, DerefMut};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// An MCP `_meta` object: its members, in order.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Meta(pub Map<String, Value>);

impl Meta {
    /// An empty `_meta`.
    pub fn new() -> Meta {
        Meta::default()
    }
}

impl Deref for Meta {
    type Target = Map<String, Value>;

    fn deref(&self) -> &Map<String, Value> {
        &self.0
    }
}

impl DerefMut for Meta {
    fn deref_mut(&mut self) -> &mut Map<String, Value> {
        &mut self.0
    }
}

impl From<Map<String, Value>> for Meta {
    fn from(members: Map<String, Value>) -> Meta {
        Meta(members)
    }
}

impl FromIterator<(String, Value)> for Meta {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(members: I) -> Meta {
        Meta(members.into_iter().collect())
    }
}

/// One named definition, so every `_meta` in the schema points at it.
#[cfg(feature = "schema")]
impl schemars::JsonSchema for Meta {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Meta".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "MCP `_meta`: any JSON object, carried as it came.",
            "type": "object",
            "additionalProperties": true,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn members_keep_their_order_both_ways() {
        let text = r#"{"z":1,"a":{"y":2,"b":3},"m":null}"#;
        let meta: Meta = serde_json::from_str(text).expect("an object");
        let keys: Vec<&str> = meta.keys().map(String::as_str).collect();
        assert_eq!(keys, ["z", "a", "m"]);
        assert_eq!(serde_json::to_string(&meta).expect("serializes"), text);
    }

    #[test]
    fn only_an_object_is_a_meta() {
        for not_object in ["[]", "null", "1", "\"a\"", "true"] {
            let error = serde_json::from_str::<Meta>(not_object).expect_err(not_object);
            assert!(error.to_string().contains("expected a map"), "{error}");
        }
        assert_eq!(
            serde_json::from_str::<Meta>("{}").expect("empty"),
            Meta::new()
        );
    }

    #[test]
    fn it_is_its_map() {
        let mut meta = Meta::new();
        meta.insert("seq".into(), json!(3));
        let collected: Meta = [("seq".to_owned(), json!(3))].into_iter().collect();
        assert_eq!(meta, collected);
        assert_eq!(Meta::from(collected.0.clone()), meta);
        assert_eq!(meta.get("seq"), Some(&json!(3)));
    }
}
