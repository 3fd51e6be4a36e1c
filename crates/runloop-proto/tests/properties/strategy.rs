//! Strategies: arbitrary values of every wire type, and the pieces they are
//! built from.
//!
//! Strings are built from arbitrary `char`s (control characters, quotes,
//! backslashes and astral planes included), so every escape path of the JSON
//! encoder and decoder is in play. Floats are finite: JSON has no NaN or
//! infinity, and the protocol's floats (logprobs, priorities) are numbers.

use proptest::prelude::*;
use runloop_proto::agents_run::{
    Container, FuseMount, IdentityMount, Image, ImageRef, RegistryImage, RunRequest, VolumeMount,
};
use runloop_proto::mcp::{
    Annotations, AudioContent, ContentBlock, EmbeddedResource, Icon, IconTheme, ImageContent, Meta,
    ResourceContents, ResourceLink, Role, TextContent,
};
use runloop_proto::run_loop::{
    AgenticLoopChunk, MediaChunk, NotificationChunk, TextChunk, TokenLogprob, ToolCallChunk,
    ToolResponseChunk, TopLogprob, UsageChunk, UserChunk,
};
use serde_json::Value;
use serde_json::value::RawValue;

/// Any string of up to `max` arbitrary characters.
pub fn text_up_to(max: usize) -> impl Strategy<Value = String> + Clone {
    prop::collection::vec(any::<char>(), 0..=max).prop_map(String::from_iter)
}

/// A short arbitrary string.
pub fn text() -> impl Strategy<Value = String> + Clone {
    text_up_to(12)
}

/// Any finite `f64`, of either sign, normal, subnormal or zero.
pub fn finite_f64() -> impl Strategy<Value = f64> + Clone {
    use prop::num::f64::{NEGATIVE, NORMAL, POSITIVE, SUBNORMAL, ZERO};
    POSITIVE | NEGATIVE | NORMAL | SUBNORMAL | ZERO
}

/// Any finite `f32`, of either sign, normal, subnormal or zero.
pub fn finite_f32() -> impl Strategy<Value = f32> + Clone {
    use prop::num::f32::{NEGATIVE, NORMAL, POSITIVE, SUBNORMAL, ZERO};
    POSITIVE | NEGATIVE | NORMAL | SUBNORMAL | ZERO
}

/// Any JSON value, nested a few levels deep.
pub fn json_value() -> impl Strategy<Value = Value> + Clone {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        finite_f64().prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((text(), inner), 0..5)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

/// An MCP `_meta` object, or none.
pub fn meta() -> impl Strategy<Value = Option<Meta>> + Clone {
    prop::option::of(
        prop::collection::vec((text(), json_value()), 0..4)
            .prop_map(|members| members.into_iter().collect()),
    )
}

/// MCP annotations, or none.
pub fn annotations() -> impl Strategy<Value = Option<Annotations>> + Clone {
    let role = prop_oneof![Just(Role::User), Just(Role::Assistant)];
    prop::option::of(
        (
            prop::option::of(prop::collection::vec(role, 0..3)),
            prop::option::of(finite_f32()),
            prop::option::of(text()),
        )
            .prop_map(|(audience, priority, last_modified)| Annotations {
                audience,
                priority,
                last_modified,
            }),
    )
}

/// A thread: the main one, or a sub-agent's.
pub fn parent() -> impl Strategy<Value = Option<String>> + Clone {
    prop::option::of(text())
}

/// Log probabilities of a fragment's tokens, or none.
pub fn logprobs() -> impl Strategy<Value = Option<Vec<TokenLogprob>>> + Clone {
    let bytes = prop::option::of(prop::collection::vec(any::<u8>(), 0..6));
    let top = (text(), bytes.clone(), prop::option::of(finite_f64())).prop_map(
        |(token, bytes, logprob)| TopLogprob {
            token,
            bytes,
            logprob,
        },
    );
    let token = (
        text(),
        bytes,
        finite_f64(),
        prop::collection::vec(top, 0..3),
    )
        .prop_map(|(token, bytes, logprob, top_logprobs)| TokenLogprob {
            token,
            bytes,
            logprob,
            top_logprobs,
        });
    prop::option::of(prop::collection::vec(token, 0..3))
}

/// The members of a reasoning, text or refusal fragment.
pub fn text_chunk() -> impl Strategy<Value = TextChunk> + Clone {
    (text(), annotations(), meta(), parent(), logprobs()).prop_map(
        |(text, annotations, meta, parent_tool_call_id, logprobs)| TextChunk {
            text,
            annotations,
            meta,
            parent_tool_call_id,
            logprobs,
        },
    )
}

/// A tool-call fragment.
pub fn tool_call_chunk() -> impl Strategy<Value = ToolCallChunk> + Clone {
    (text(), text(), prop::option::of(text()), meta(), parent()).prop_map(
        |(id, name, arguments, meta, parent_tool_call_id)| ToolCallChunk {
            id,
            name,
            arguments,
            meta,
            parent_tool_call_id,
        },
    )
}

/// A whole image or audio clip.
pub fn media_chunk() -> impl Strategy<Value = MediaChunk> + Clone {
    (text(), text(), annotations(), meta(), parent()).prop_map(
        |(data, mime_type, annotations, meta, parent_tool_call_id)| MediaChunk {
            data,
            mime_type,
            annotations,
            meta,
            parent_tool_call_id,
        },
    )
}

/// An icon of a resource link.
pub fn icon() -> impl Strategy<Value = Icon> + Clone {
    let theme = prop_oneof![Just(IconTheme::Light), Just(IconTheme::Dark)];
    (
        text(),
        prop::option::of(text()),
        prop::option::of(prop::collection::vec(text(), 0..3)),
        prop::option::of(theme),
    )
        .prop_map(|(src, mime_type, sizes, theme)| Icon {
            src,
            mime_type,
            sizes,
            theme,
        })
}

/// One MCP content block: text, image, audio, embedded resource (text or
/// blob) or resource link.
pub fn content_block() -> BoxedStrategy<ContentBlock> {
    let text_block = (text(), meta(), annotations()).prop_map(|(text, meta, annotations)| {
        ContentBlock::Text(TextContent {
            text,
            meta,
            annotations,
        })
    });
    let image =
        (text(), text(), meta(), annotations()).prop_map(|(data, mime_type, meta, annotations)| {
            ContentBlock::Image(ImageContent {
                data,
                mime_type,
                meta,
                annotations,
            })
        });
    let audio =
        (text(), text(), meta(), annotations()).prop_map(|(data, mime_type, meta, annotations)| {
            ContentBlock::Audio(AudioContent {
                data,
                mime_type,
                meta,
                annotations,
            })
        });
    let contents = prop_oneof![
        (text(), prop::option::of(text()), text(), meta()).prop_map(
            |(uri, mime_type, text, meta)| ResourceContents::Text {
                uri,
                mime_type,
                text,
                meta,
            }
        ),
        (text(), prop::option::of(text()), text(), meta()).prop_map(
            |(uri, mime_type, blob, meta)| ResourceContents::Blob {
                uri,
                mime_type,
                blob,
                meta,
            }
        ),
    ];
    let resource = (contents, meta(), annotations()).prop_map(|(resource, meta, annotations)| {
        ContentBlock::Resource(EmbeddedResource {
            resource,
            meta,
            annotations,
        })
    });
    let link = (
        (text(), text(), prop::option::of(text())),
        (prop::option::of(text()), prop::option::of(text())),
        (
            prop::option::of(any::<u64>()),
            prop::option::of(prop::collection::vec(icon(), 0..3)),
        ),
        (meta(), annotations()),
    )
        .prop_map(
            |((uri, name, title), (description, mime_type), (size, icons), (meta, annotations))| {
                ContentBlock::ResourceLink(ResourceLink {
                    uri,
                    name,
                    title,
                    description,
                    mime_type,
                    size,
                    icons,
                    meta,
                    annotations,
                })
            },
        );
    prop_oneof![
        text_block.boxed(),
        image.boxed(),
        audio.boxed(),
        resource.boxed(),
        link.boxed()
    ]
    .boxed()
}

/// A tool's result.
pub fn tool_response_chunk() -> impl Strategy<Value = ToolResponseChunk> + Clone {
    (
        text(),
        prop::collection::vec(content_block(), 0..4),
        prop::option::of(json_value().prop_filter("null is an absent member", |v| !v.is_null())),
        prop::option::of(any::<bool>()),
        meta(),
        parent(),
    )
        .prop_map(
            |(id, content, structured_content, is_error, meta, parent_tool_call_id)| {
                ToolResponseChunk {
                    id,
                    content,
                    structured_content,
                    is_error,
                    meta,
                    parent_tool_call_id,
                }
            },
        )
}

/// A chunk of any of the ten kinds, with every member arbitrary.
pub fn chunk() -> BoxedStrategy<AgenticLoopChunk> {
    use AgenticLoopChunk as C;
    prop_oneof![
        text_chunk().prop_map(C::AssistantReasoning).boxed(),
        text_chunk().prop_map(C::AssistantTextContent).boxed(),
        text_chunk().prop_map(C::AssistantRefusal).boxed(),
        tool_call_chunk().prop_map(C::AssistantToolCall).boxed(),
        media_chunk().prop_map(C::AssistantImageContent).boxed(),
        media_chunk().prop_map(C::AssistantAudioContent).boxed(),
        tool_response_chunk().prop_map(C::ToolResponse).boxed(),
        (text(), meta())
            .prop_map(|(prompt, meta)| C::User(UserChunk { prompt, meta }))
            .boxed(),
        (any::<u64>(), any::<u64>(), any::<u64>(), meta())
            .prop_map(
                |(completion_tokens, prompt_tokens, total_tokens, meta)| C::Usage(UsageChunk {
                    completion_tokens,
                    prompt_tokens,
                    total_tokens,
                    meta,
                })
            )
            .boxed(),
        (any::<bool>(), json_value(), meta())
            .prop_map(|(is_fatal, message, meta)| {
                C::Notification(NotificationChunk {
                    is_fatal,
                    message,
                    meta,
                })
            })
            .boxed(),
    ]
    .boxed()
}

/// JSON text of any value, compact or pretty (so `agent` carries whitespace
/// that must survive verbatim).
pub fn json_text() -> impl Strategy<Value = String> + Clone {
    (json_value(), any::<bool>()).prop_map(|(value, pretty)| {
        let text = if pretty {
            serde_json::to_string_pretty(&value)
        } else {
            serde_json::to_string(&value)
        };
        text.expect("a Value always serializes")
    })
}

/// One of the three image forms.
pub fn image() -> impl Strategy<Value = Image> + Clone {
    let image_ref = (text(), text()).prop_map(|(name, digest)| ImageRef { name, digest });
    prop_oneof![
        image_ref.clone().prop_map(Image::Client),
        image_ref.prop_map(Image::Server),
        text().prop_map(|reference| Image::Registry(RegistryImage { reference })),
    ]
}

/// A path of arbitrary components (the shape does not check them).
pub fn path() -> impl Strategy<Value = Vec<String>> + Clone {
    prop::collection::vec(text(), 0..3)
}

/// A container with all five mount lists, each possibly empty.
pub fn container() -> impl Strategy<Value = Container> + Clone {
    let volume =
        (text(), path(), path()).prop_map(|(host_name, host_relative_path, container_path)| {
            VolumeMount {
                host_name,
                host_relative_path,
                container_path,
            }
        });
    let identity = (path(), text()).prop_map(|(container_path, identity)| IdentityMount {
        container_path,
        identity,
    });
    let fuse = (path(), any::<u64>(), prop::option::of(any::<bool>())).prop_map(
        |(container_path, id, readonly)| FuseMount {
            container_path,
            id,
            readonly,
        },
    );
    (
        (image(), any::<u64>(), any::<u64>()),
        mounts(volume),
        (mounts(identity.clone()), mounts(identity)),
        (mounts(fuse.clone()), mounts(fuse)),
    )
        .prop_map(
            |(
                (image, memory, disk),
                volumes,
                (identity_files, identity_dirs),
                (fuse_files, fuse_dirs),
            )| {
                let mut container = Container::new(image, memory, disk);
                container.volume_mounts = volumes;
                container.identity_file_mounts = identity_files;
                container.identity_directory_mounts = identity_dirs;
                container.fuse_file_mounts = fuse_files;
                container.fuse_directory_mounts = fuse_dirs;
                container
            },
        )
}

/// Up to two mounts of one list.
fn mounts<S: Strategy>(mount: S) -> prop::collection::VecStrategy<S> {
    prop::collection::vec(mount, 0..3)
}

/// A `containers::agents::run` request with `agent` as arbitrary JSON text.
pub fn run_request() -> BoxedStrategy<RunRequest> {
    (container(), json_text())
        .prop_map(|(container, agent)| {
            let agent = RawValue::from_string(agent).expect("serde_json wrote valid JSON");
            RunRequest::new(container, agent)
        })
        .boxed()
}
