//! Nothing off the wire panics: every decoder, the reader and the relay are
//! fed arbitrary bytes, and valid encodings with one byte broken.
//!
//! Random bytes rarely get past a tag byte or the first JSON token, so most
//! inputs here start from a valid payload of some type and are then cut,
//! patched or stretched: those reach the deep paths (a chunk's members, a
//! mount list, `validate`) with input that is almost right.

use proptest::prelude::*;
use runloop_proto::agents_run::{Image, RunRequest, RunResponse};
use runloop_proto::authorization::Authorization;
use runloop_proto::channel::ChannelRequest;
use runloop_proto::endpoint::EndpointRequest;
use runloop_proto::frame::{self, ClientFrame, FrameType, ServerFrame};
use runloop_proto::run_loop::{Reader, Relay, Relayed, Response, RunLoopRequest};
use runloop_proto::{Decode, Encode, ErrorValue, Writer};

use crate::{fast_path, strategy};

/// Calls every decoder on `bytes`, and what follows a successful decode
/// (validation, error messages, re-encoding).
fn decode_everything(bytes: &[u8]) {
    let _ = ClientFrame::decode(bytes).map_err(|e| e.to_string());
    let _ = ServerFrame::decode(bytes).map_err(|e| e.to_string());
    let _ = Authorization::decode(bytes).map_err(|e| e.to_string());
    match EndpointRequest::decode(bytes) {
        Ok(EndpointRequest::AgentsRun(request)) => {
            let _ = request.validate().map_err(|e| e.to_string());
        }
        Ok(EndpointRequest::Unserved(_)) => {}
        Err(e) => drop(e.to_string()),
    }
    match RunRequest::decode(bytes) {
        Ok(request) => {
            let _ = request.validate().map_err(|e| e.to_string());
            let _ = request.to_vec();
        }
        Err(e) => drop(e.to_string()),
    }
    let _ = RunResponse::decode(bytes).map_err(|e| e.to_string());
    let _ = ChannelRequest::decode(bytes).map_err(|e| e.to_string());
    let _ = RunLoopRequest::decode(bytes).map_err(|e| e.to_string());
    let _ = ErrorValue::decode(bytes).map(|e| e.to_string());
    match Response::decode(bytes) {
        Ok(frame) => drop(frame.to_vec()),
        Err(e) => drop(e.to_string()),
    }

    let mut reader = Reader::new();
    let _ = reader.response(bytes);
    let _ = reader.response(bytes);
    let _ = reader.finish();

    let mut out = Vec::new();
    match Relay::new().message(bytes, &mut Writer::new(&mut out)) {
        Relayed::Forward(relay, _) => {
            let _ = relay.message(bytes, &mut Writer::new(&mut out));
        }
        Relayed::Last(..) | Relayed::Fault(_) => {}
    }
}

/// A valid payload or message of one of the wire's types.
fn valid_encoding() -> impl Strategy<Value = Vec<u8>> {
    let endpoint = strategy::run_request().prop_map(|r| {
        EndpointRequest::AgentsRun(Box::new(r))
            .to_vec()
            .expect("serializes")
    });
    let chunk = strategy::chunk().prop_map(|c| Response::Chunk(c).to_vec().expect("serializes"));
    let error = strategy::json_value().prop_map(|v| {
        Response::Error(ErrorValue::new(v))
            .to_vec()
            .expect("serializes")
    });
    let run_loop = strategy::text().prop_map(|prompt| {
        ChannelRequest::RunLoop(RunLoopRequest::new(prompt))
            .to_vec()
            .expect("infallible")
    });
    let response =
        strategy::text().prop_map(|id| RunResponse::Id(id).to_vec().expect("serializes"));
    let credential =
        strategy::text().prop_map(|c| Authorization::Unbrokered(&c).to_vec().expect("infallible"));
    let payload = prop_oneof![
        endpoint.clone().boxed(),
        endpoint.prop_map(|bytes| bytes[1..].to_vec()).boxed(),
        chunk.boxed(),
        error.boxed(),
        run_loop.boxed(),
        response.boxed(),
        credential.boxed(),
    ];
    // Some of them inside a frame header.
    (payload, any::<bool>(), any::<u32>()).prop_map(|(payload, framed, scope)| {
        if framed {
            frame::build(FrameType::ChannelResponse, scope, 1, payload.len(), |out| {
                out.extend_from_slice(&payload);
                Ok::<(), ()>(())
            })
            .expect("infallible")
        } else {
            payload
        }
    })
}

/// One small change to a byte string.
#[derive(Debug, Clone)]
enum Mutation {
    Truncate(usize),
    Replace(usize, u8),
    Insert(usize, u8),
    Remove(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Replace(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Remove),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for mutation in mutations {
        let len = bytes.len();
        match *mutation {
            Mutation::Truncate(i) => bytes.truncate(i % (len + 1)),
            Mutation::Replace(i, b) if len > 0 => bytes[i % len] = b,
            Mutation::Insert(i, b) => bytes.insert(i % (len + 1), b),
            Mutation::Remove(i) if len > 0 => {
                bytes.remove(i % len);
            }
            Mutation::Replace(..) | Mutation::Remove(_) => {}
        }
    }
    bytes
}

/// A path component chosen to hit the path rules often.
fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(".".to_owned()),
        Just("..".to_owned()),
        Just("a/b".to_owned()),
        Just("nul\0".to_owned()),
        Just("data".to_owned()),
        Just("src".to_owned()),
        strategy::text(),
    ]
}

fn path() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(component(), 0..3)
}

/// The rules a path must keep, restated from protocol §5 and the mounts module.
fn component_ok(component: &str) -> bool {
    !matches!(component, "" | "." | "..") && !component.contains(['/', '\0'])
}

fn container_path_ok(path: &[String]) -> bool {
    !path.is_empty() && path.iter().all(|c| component_ok(c))
}

/// A run request whose members are mostly near the rules' edges.
fn edgy_request() -> impl Strategy<Value = RunRequest> {
    let name = prop_oneof![
        Just("demo".to_owned()),
        Just("agents/demo".to_owned()),
        Just("Demo".to_owned()),
        Just("registry.io/demo".to_owned()),
        Just(String::new()),
        strategy::text(),
    ];
    let digest = prop_oneof![
        Just(format!("sha256:{}", "0".repeat(64))),
        Just("sha256:00".to_owned()),
        Just("md5".to_owned()),
        strategy::text(),
    ];
    let identity = prop_oneof![
        Just("32:47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU".to_owned()),
        Just("01:47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU".to_owned()),
        strategy::text(),
    ];
    (
        strategy::run_request(),
        (name, digest, 0u64..3),
        (path(), path(), path(), path(), path()),
        (component(), identity),
    )
        .prop_map(
            |(mut request, (name, digest, memory), paths, (host, identity))| {
                let (volume, relative, identity_path, fuse_a, fuse_b) = paths;
                let container = &mut request.container;
                container.memory = memory;
                if let Image::Client(image) | Image::Server(image) = &mut container.image {
                    image.name = name;
                    image.digest = digest;
                }
                if let Some(mount) = container.volume_mounts.first_mut() {
                    mount.container_path = volume;
                    mount.host_relative_path = relative;
                    mount.host_name = host;
                }
                if let Some(mount) = container.identity_file_mounts.first_mut() {
                    mount.container_path = identity_path;
                    mount.identity = identity;
                }
                if let Some(mount) = container.fuse_file_mounts.first_mut() {
                    mount.container_path = fuse_a;
                }
                if let Some(mount) = container.fuse_directory_mounts.first_mut() {
                    mount.container_path = fuse_b;
                }
                request
            },
        )
}

proptest! {
    /// Arbitrary bytes: no decoder panics.
    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        decode_everything(&bytes);
    }

    /// Valid encodings with a few bytes cut, changed, added or removed: no
    /// decoder panics.
    #[test]
    fn broken_encodings(
        bytes in valid_encoding(),
        mutations in prop::collection::vec(mutation(), 0..4),
    ) {
        decode_everything(&mutate(bytes, &mutations));
    }

    /// `Response::decode` reads chunk JSON exactly as serde_json's own byte
    /// decoder does (it takes a faster route for UTF-8): the same chunk, or
    /// an error with the same message.
    #[test]
    fn chunk_decoding_is_serde_jsons(
        bytes in prop_oneof![
            valid_encoding().boxed(),
            prop::collection::vec(any::<u8>(), 0..64).boxed(),
        ],
        mutations in prop::collection::vec(mutation(), 0..3),
    ) {
        let json: Vec<u8> = mutate(bytes, &mutations).into_iter().skip(1).collect();
        fast_path::same_verdict(&json)?;
    }

    /// `validate` after a successful decode never panics, accepts nothing
    /// that breaks a path rule, a zero memory or a shared container path,
    /// and refuses every request that breaks one of those.
    #[test]
    fn validate_after_decode(request in edgy_request()) {
        let bytes = EndpointRequest::AgentsRun(Box::new(request)).to_vec().expect("serializes");
        let EndpointRequest::AgentsRun(request) = EndpointRequest::decode(&bytes).expect("decodes") else {
            panic!("tag 0 is agents::run");
        };
        let verdict = request.validate();
        let c = &request.container;
        let mut container_paths: Vec<&Vec<String>> = Vec::new();
        container_paths.extend(c.volume_mounts.iter().map(|m| &m.container_path));
        container_paths.extend(c.identity_file_mounts.iter().map(|m| &m.container_path));
        container_paths.extend(c.identity_directory_mounts.iter().map(|m| &m.container_path));
        container_paths.extend(c.fuse_file_mounts.iter().map(|m| &m.container_path));
        container_paths.extend(c.fuse_directory_mounts.iter().map(|m| &m.container_path));
        let paths_ok = container_paths.iter().all(|p| container_path_ok(p))
            && c.volume_mounts.iter().all(|m| {
                m.host_relative_path.iter().all(|p| component_ok(p))
                    && !m.host_name.is_empty()
                    && !m.host_name.contains(['/', '\0'])
            });
        let distinct = container_paths
            .iter()
            .enumerate()
            .all(|(i, p)| !container_paths[..i].contains(p));
        if !(paths_ok && distinct && c.memory > 0) {
            prop_assert!(verdict.is_err(), "accepted a request that breaks a rule: {:?}", c);
        }
        if verdict.is_ok() {
            let image_ok = match &c.image {
                Image::Client(image) | Image::Server(image) => {
                    !image.name.is_empty()
                        && !image.name.bytes().any(|b| b.is_ascii_uppercase())
                        && image.digest.contains(':')
                }
                Image::Registry(registry) => !registry.reference.trim().is_empty(),
            };
            prop_assert!(image_ok, "accepted a bad image: {:?}", c.image);
        }
    }
}
