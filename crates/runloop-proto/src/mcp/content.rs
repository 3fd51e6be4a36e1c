//! Content blocks: what a tool response's `content` array holds.
//!
//! A block is a JSON object whose `type` member names one of MCP's five
//! kinds: `text`, `image`, `audio`, `resource_link` (a resource named by its
//! URI) and `resource` (a resource's contents embedded). A block of any other
//! `type` is refused, as MCP's schema refuses it.
//!
//! Blocks are decoded by serde's internally tagged derive, which finds
//! `type` wherever it stands in the object. The chunk decoder's fast path
//! (`run_loop::scan`) reads plain text blocks itself and hands every other
//! block here.

use serde::{Deserialize, Serialize};

use super::{Annotations, Meta, ResourceContents, ResourceLink};

/// One MCP content block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum ContentBlock {
    /// `text`
    Text(TextContent),
    /// `image`
    Image(ImageContent),
    /// `audio`
    Audio(AudioContent),
    /// `resource`: a resource's contents, embedded.
    Resource(EmbeddedResource),
    /// `resource_link`: a resource named by its URI, not its contents.
    ResourceLink(ResourceLink),
}

impl ContentBlock {
    /// A text block with no annotations or `_meta`.
    pub fn text(text: impl Into<String>) -> ContentBlock {
        ContentBlock::Text(TextContent {
            text: text.into(),
            ..TextContent::default()
        })
    }

    /// An image block: base64 `data` of type `mime_type`.
    pub fn image(data: impl Into<String>, mime_type: impl Into<String>) -> ContentBlock {
        ContentBlock::Image(ImageContent {
            data: data.into(),
            mime_type: mime_type.into(),
            ..ImageContent::default()
        })
    }

    /// An audio block: base64 `data` of type `mime_type`.
    pub fn audio(data: impl Into<String>, mime_type: impl Into<String>) -> ContentBlock {
        ContentBlock::Audio(AudioContent {
            data: data.into(),
            mime_type: mime_type.into(),
            ..AudioContent::default()
        })
    }

    /// The block's `type` string.
    pub fn kind(&self) -> &'static str {
        match self {
            ContentBlock::Text(_) => "text",
            ContentBlock::Image(_) => "image",
            ContentBlock::Audio(_) => "audio",
            ContentBlock::Resource(_) => "resource",
            ContentBlock::ResourceLink(_) => "resource_link",
        }
    }

    /// The block's annotations, whatever its kind.
    pub fn annotations(&self) -> Option<&Annotations> {
        match self {
            ContentBlock::Text(c) => c.annotations.as_ref(),
            ContentBlock::Image(c) => c.annotations.as_ref(),
            ContentBlock::Audio(c) => c.annotations.as_ref(),
            ContentBlock::Resource(c) => c.annotations.as_ref(),
            ContentBlock::ResourceLink(c) => c.annotations.as_ref(),
        }
    }
}

/// A `text` block.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TextContent {
    /// The text.
    pub text: String,
    /// MCP `_meta`.
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
    /// MCP annotations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
}

/// An `image` block.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ImageContent {
    /// The image, base64.
    pub data: String,
    /// Its MIME type, such as `image/png`.
    #[serde(rename = "mimeType")]
    pub mime_type: String,
    /// MCP `_meta`.
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
    /// MCP annotations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
}

/// An `audio` block.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AudioContent {
    /// The audio, base64.
    pub data: String,
    /// Its MIME type, such as `audio/wav`.
    #[serde(rename = "mimeType")]
    pub mime_type: String,
    /// MCP `_meta`.
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
    /// MCP annotations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
}

/// A `resource` block: a resource's contents, embedded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EmbeddedResource {
    /// The contents, as text or as a base64 blob.
    pub resource: ResourceContents,
    /// MCP `_meta`.
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
    /// MCP annotations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
}

impl EmbeddedResource {
    /// The block for `resource`, with no annotations or `_meta`.
    pub fn new(resource: ResourceContents) -> EmbeddedResource {
        EmbeddedResource {
            resource,
            meta: None,
            annotations: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::mcp::{Icon, IconTheme, Role};

    fn parse(text: &str) -> Result<ContentBlock, serde_json::Error> {
        serde_json::from_str(text)
    }

    fn meta() -> Option<Meta> {
        Some(
            [("z".to_owned(), json!(1)), ("a".to_owned(), json!([]))]
                .into_iter()
                .collect(),
        )
    }

    fn annotations() -> Option<Annotations> {
        Some(Annotations {
            audience: Some(vec![Role::Assistant]),
            priority: Some(0.25),
            last_modified: Some("2025-01-12T15:00:58Z".into()),
        })
    }

    /// Every kind with every member set, and the exact JSON it is written
    /// as: `type` first, then the members in MCP's order with `_meta`
    /// before `annotations`.
    fn every_kind() -> Vec<(ContentBlock, &'static str)> {
        vec![
            (
                ContentBlock::Text(TextContent {
                    text: "fn main() {}".into(),
                    meta: meta(),
                    annotations: annotations(),
                }),
                r#"{"type":"text","text":"fn main() {}","_meta":{"z":1,"a":[]},"annotations":{"audience":["assistant"],"priority":0.25,"lastModified":"2025-01-12T15:00:58Z"}}"#,
            ),
            (
                ContentBlock::Image(ImageContent {
                    data: "aGk=".into(),
                    mime_type: "image/png".into(),
                    meta: meta(),
                    annotations: annotations(),
                }),
                r#"{"type":"image","data":"aGk=","mimeType":"image/png","_meta":{"z":1,"a":[]},"annotations":{"audience":["assistant"],"priority":0.25,"lastModified":"2025-01-12T15:00:58Z"}}"#,
            ),
            (
                ContentBlock::Audio(AudioContent {
                    data: "UklG".into(),
                    mime_type: "audio/wav".into(),
                    meta: meta(),
                    annotations: annotations(),
                }),
                r#"{"type":"audio","data":"UklG","mimeType":"audio/wav","_meta":{"z":1,"a":[]},"annotations":{"audience":["assistant"],"priority":0.25,"lastModified":"2025-01-12T15:00:58Z"}}"#,
            ),
            (
                ContentBlock::Resource(EmbeddedResource {
                    resource: ResourceContents::Text {
                        uri: "file:///a.rs".into(),
                        mime_type: Some("text/x-rust".into()),
                        text: "fn a() {}".into(),
                        meta: meta(),
                    },
                    meta: meta(),
                    annotations: annotations(),
                }),
                r#"{"type":"resource","resource":{"uri":"file:///a.rs","mimeType":"text/x-rust","text":"fn a() {}","_meta":{"z":1,"a":[]}},"_meta":{"z":1,"a":[]},"annotations":{"audience":["assistant"],"priority":0.25,"lastModified":"2025-01-12T15:00:58Z"}}"#,
            ),
            (
                ContentBlock::Resource(EmbeddedResource::new(ResourceContents::Blob {
                    uri: "file:///a.png".into(),
                    mime_type: None,
                    blob: "iVBO".into(),
                    meta: None,
                })),
                r#"{"type":"resource","resource":{"uri":"file:///a.png","blob":"iVBO"}}"#,
            ),
            (
                ContentBlock::ResourceLink(ResourceLink {
                    uri: "file:///b.md".into(),
                    name: "b.md".into(),
                    title: Some("B".into()),
                    description: Some("the b file".into()),
                    mime_type: Some("text/markdown".into()),
                    size: Some(u64::MAX),
                    icons: Some(vec![Icon {
                        src: "data:image/png;base64,iVBO".into(),
                        mime_type: Some("image/png".into()),
                        sizes: Some(vec!["48x48".into(), "any".into()]),
                        theme: Some(IconTheme::Dark),
                    }]),
                    meta: meta(),
                    annotations: annotations(),
                }),
                r#"{"type":"resource_link","uri":"file:///b.md","name":"b.md","title":"B","description":"the b file","mimeType":"text/markdown","size":18446744073709551615,"icons":[{"src":"data:image/png;base64,iVBO","mimeType":"image/png","sizes":["48x48","any"],"theme":"dark"}],"_meta":{"z":1,"a":[]},"annotations":{"audience":["assistant"],"priority":0.25,"lastModified":"2025-01-12T15:00:58Z"}}"#,
            ),
            (
                ContentBlock::ResourceLink(ResourceLink {
                    uri: "u".into(),
                    name: "n".into(),
                    ..ResourceLink::default()
                }),
                r#"{"type":"resource_link","uri":"u","name":"n"}"#,
            ),
            (ContentBlock::text("t"), r#"{"type":"text","text":"t"}"#),
            (
                ContentBlock::image("d", "image/gif"),
                r#"{"type":"image","data":"d","mimeType":"image/gif"}"#,
            ),
            (
                ContentBlock::audio("d", "audio/ogg"),
                r#"{"type":"audio","data":"d","mimeType":"audio/ogg"}"#,
            ),
        ]
    }

    #[test]
    fn every_kind_is_written_exactly_and_reads_back() {
        for (block, json) in every_kind() {
            assert_eq!(serde_json::to_string(&block).expect("serializes"), json);
            assert_eq!(parse(json).expect(json), block, "{json}");
            assert!(json.starts_with(&format!(r#"{{"type":"{}""#, block.kind())));
        }
    }

    #[test]
    fn type_is_found_wherever_it_stands_and_extra_members_are_ignored() {
        for (block, json) in every_kind() {
            let Value::Object(mut members) = serde_json::from_str(json).expect("an object") else {
                panic!("a block is an object");
            };
            let kind = members.shift_remove("type").expect("a type");
            members.insert("type".into(), kind);
            members.insert("extra".into(), json!({"type": "video", "deep": [null]}));
            let text = serde_json::to_string(&members).expect("serializes");
            assert_eq!(parse(&text).expect(&text), block, "{text}");
        }
    }

    #[test]
    fn annotations_are_reachable_on_every_kind() {
        for (block, _) in every_kind().into_iter().take(4) {
            assert_eq!(block.annotations(), annotations().as_ref(), "{block:?}");
        }
        assert_eq!(ContentBlock::text("t").annotations(), None);
    }

    #[test]
    fn what_mcp_does_not_define_is_refused() {
        let unknown = parse(r#"{"type":"video","data":"d"}"#).expect_err("unknown kind");
        assert!(
            unknown.to_string().starts_with(
                "unknown variant `video`, expected one of `text`, `image`, `audio`, `resource`, `resource_link`"
            ),
            "{unknown}"
        );
        let missing = parse(r#"{"text":"t"}"#).expect_err("no type");
        assert!(
            missing.to_string().contains("missing field `type`"),
            "{missing}"
        );
        for bad in [
            r#"{"type":"text"}"#,
            r#"{"type":"text","text":5}"#,
            r#"{"type":"image","data":"d"}"#,
            r#"{"type":"audio","mimeType":"m"}"#,
            r#"{"type":"resource_link","uri":"u"}"#,
            r#"{"type":"resource_link","uri":"u","name":"n","size":-1}"#,
            r#"{"type":"resource_link","uri":"u","name":"n","icons":[{"src":"s","theme":"blue"}]}"#,
            r#"{"type":"resource"}"#,
            r#"{"type":"text","text":"t","_meta":[]}"#,
            r#"{"type":"text","text":"t","text":"u"}"#,
            r#"{"type":"text","type":"text","text":"t"}"#,
            "null",
            "\"text\"",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn embedded_contents_are_text_when_text_is_there() {
        let both = parse(r#"{"type":"resource","resource":{"uri":"u","blob":"b","text":"t"}}"#)
            .expect("text wins");
        let ContentBlock::Resource(embedded) = both else {
            panic!("a resource block");
        };
        assert!(matches!(&embedded.resource, ResourceContents::Text { text, .. } if text == "t"));
        assert_eq!(embedded.resource.uri(), "u");
        let neither = parse(r#"{"type":"resource","resource":{"uri":"u"}}"#).expect_err("neither");
        assert!(
            neither
                .to_string()
                .starts_with("data did not match any variant of untagged enum ResourceContents"),
            "{neither}"
        );
    }
}
