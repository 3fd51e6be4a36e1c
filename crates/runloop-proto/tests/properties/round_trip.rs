//! Encode then decode is the identity, for every payload type of the wire.
//!
//! Each property builds an arbitrary value, writes it with its `Encode`,
//! reads the bytes back with its `Decode` and requires the same value. Where
//! the layout is fixed by the protocol (headers, authorization, tags), the
//! bytes themselves are checked too, so a symmetric mistake in encoder and
//! decoder cannot pass.

use proptest::prelude::*;
use runloop_proto::agents_run::{RunRequest, RunResponse};
use runloop_proto::authorization::Authorization;
use runloop_proto::channel::ChannelRequest;
use runloop_proto::endpoint::EndpointRequest;
use runloop_proto::frame::{self, ClientFrame, FrameType, HEADER_LEN, ServerFrame};
use runloop_proto::run_loop::{AgenticLoopChunk, CHUNK, ERROR, Response, RunLoopRequest};
use runloop_proto::{Decode, Encode, ErrorValue};
use serde_json::Value;

use crate::strategy;

/// The parts an arbitrary frame is built from: which variant, both header
/// numbers, and a payload.
fn frame_parts() -> impl Strategy<Value = (u8, u32, u32, Vec<u8>)> {
    (
        0u8..6,
        any::<u32>(),
        any::<u32>(),
        prop::collection::vec(any::<u8>(), 0..48),
    )
}

fn client_frame(variant: u8, scope: u32, channel: u32, payload: &[u8]) -> ClientFrame<'_> {
    match variant % 5 {
        0 => ClientFrame::Authorization { payload },
        1 => ClientFrame::Request { scope, payload },
        2 => ClientFrame::ChannelRequest {
            scope,
            channel,
            payload,
        },
        3 => ClientFrame::ChannelResponse {
            scope,
            channel,
            payload,
        },
        _ => ClientFrame::ChannelResponseFinish { scope, channel },
    }
}

fn server_frame(variant: u8, scope: u32, channel: u32, payload: &[u8]) -> ServerFrame<'_> {
    match variant {
        0 => ServerFrame::Authorization { payload },
        1 => ServerFrame::Response { scope, payload },
        2 => ServerFrame::ResponseFinish { scope },
        3 => ServerFrame::ChannelRequest {
            scope,
            channel,
            payload,
        },
        4 => ServerFrame::ChannelResponse {
            scope,
            channel,
            payload,
        },
        _ => ServerFrame::ChannelResponseFinish { scope, channel },
    }
}

/// What the header of a frame must hold: its type byte, the scope where the
/// kind reads it (else 0), the channel where the kind reads it (else 0).
fn expected_header(frame_type: FrameType, scope: u32, channel: u32) -> [u8; HEADER_LEN] {
    let (scope, channel) = match frame_type {
        FrameType::Authorization => (0, 0),
        FrameType::Request | FrameType::Response | FrameType::ResponseFinish => (scope, 0),
        FrameType::ChannelRequest
        | FrameType::ChannelResponse
        | FrameType::ChannelResponseFinish => (scope, channel),
    };
    let mut header = [0; HEADER_LEN];
    header[0] = frame_type as u8;
    header[1..5].copy_from_slice(&scope.to_be_bytes());
    header[5..].copy_from_slice(&channel.to_be_bytes());
    header
}

fn has_payload(frame_type: FrameType) -> bool {
    !matches!(
        frame_type,
        FrameType::ResponseFinish | FrameType::ChannelResponseFinish
    )
}

/// Serializes a chunk the way a peer that puts `type` last would.
fn type_last(chunk: &AgenticLoopChunk) -> Vec<u8> {
    let Value::Object(mut object) = serde_json::to_value(chunk).expect("a chunk serializes") else {
        panic!("a chunk is a JSON object");
    };
    let kind = object.shift_remove("type").expect("a chunk has a type");
    object.insert("type".to_owned(), kind);
    let mut payload = vec![CHUNK];
    serde_json::to_writer(&mut payload, &object).expect("a map serializes");
    payload
}

proptest! {
    /// Every client frame variant, with any numbers and payload, comes back
    /// as itself, and its bytes are the header the protocol fixes followed
    /// by the payload.
    #[test]
    fn client_frames((variant, scope, channel, payload) in frame_parts()) {
        let frame = client_frame(variant, scope, channel, &payload);
        let message = frame::to_message(&frame);
        prop_assert_eq!(ClientFrame::decode(&message), Ok(frame));
        let frame_type = frame.frame_type();
        prop_assert_eq!(&message[..HEADER_LEN], &expected_header(frame_type, scope, channel)[..]);
        let body: &[u8] = if has_payload(frame_type) { &payload } else { &[] };
        prop_assert_eq!(&message[HEADER_LEN..], body);
    }

    /// The same for every server frame variant.
    #[test]
    fn server_frames((variant, scope, channel, payload) in frame_parts()) {
        let frame = server_frame(variant, scope, channel, &payload);
        let message = frame::to_message(&frame);
        prop_assert_eq!(ServerFrame::decode(&message), Ok(frame));
        let frame_type = frame.frame_type();
        prop_assert_eq!(&message[..HEADER_LEN], &expected_header(frame_type, scope, channel)[..]);
        let body: &[u8] = if has_payload(frame_type) { &payload } else { &[] };
        prop_assert_eq!(&message[HEADER_LEN..], body);
    }

    /// Any message that decodes re-encodes to a message that decodes to the
    /// same frame: ignored fields are zeroed, nothing read is lost.
    #[test]
    fn decoded_frames_are_stable(message in prop::collection::vec(any::<u8>(), HEADER_LEN..40)) {
        if let Ok(frame) = ClientFrame::decode(&message) {
            let again = frame::to_message(&frame);
            prop_assert_eq!(ClientFrame::decode(&again), Ok(frame));
        }
        if let Ok(frame) = ServerFrame::decode(&message) {
            let again = frame::to_message(&frame);
            prop_assert_eq!(ServerFrame::decode(&again), Ok(frame));
        }
    }

    /// An unbrokered credential is mode 0 and its UTF-8 bytes, and back.
    #[test]
    fn authorization(credential in strategy::text_up_to(40)) {
        let authorization = Authorization::Unbrokered(&credential);
        let bytes = authorization.to_vec().expect("infallible");
        prop_assert_eq!(bytes[0], 0);
        prop_assert_eq!(&bytes[1..], credential.as_bytes());
        prop_assert_eq!(Authorization::decode(&bytes), Ok(authorization));
    }

    /// A run request, through the endpoint tag: the container (three image
    /// forms, five mount lists) and the agent's JSON text, byte for byte.
    #[test]
    fn run_request(request in strategy::run_request()) {
        let endpoint = EndpointRequest::AgentsRun(Box::new(request.clone()));
        let bytes = endpoint.to_vec().expect("serializes");
        prop_assert_eq!(bytes[0], 0);
        let decoded = EndpointRequest::decode(&bytes).expect("decodes");
        let EndpointRequest::AgentsRun(decoded) = decoded else {
            panic!("tag 0 is agents::run");
        };
        prop_assert_eq!(decoded.agent.get(), request.agent.get());
        // And without the tag, through the request's own codec.
        prop_assert_eq!(&RunRequest::decode(&bytes[1..]).expect("decodes"), &*decoded);
        prop_assert_eq!(*decoded, request);
    }

    /// Every endpoint tag but 0 is kept as an unserved request.
    #[test]
    fn unserved_endpoints(tag in 1u8..) {
        let bytes = EndpointRequest::Unserved(tag).to_vec().expect("infallible");
        prop_assert_eq!(&bytes[..], &[tag][..]);
        prop_assert_eq!(EndpointRequest::decode(&bytes).expect("decodes"), EndpointRequest::Unserved(tag));
    }

    /// The run scope's main stream: an id, or an error of any JSON type.
    #[test]
    fn run_response(id in strategy::text_up_to(40), error in strategy::json_value(), pick_id in any::<bool>()) {
        let response = if pick_id {
            RunResponse::Id(id)
        } else {
            RunResponse::Error(ErrorValue::new(error))
        };
        let bytes = response.to_vec().expect("serializes");
        prop_assert_eq!(bytes[0], u8::from(!pick_id));
        prop_assert_eq!(RunResponse::decode(&bytes).expect("decodes"), response);
    }

    /// A run-loop request keeps its bytes and its prompt, whatever other
    /// members and whitespace it carries; through the channel tag too.
    #[test]
    fn run_loop_request(
        prompt in strategy::text_up_to(40),
        extra in prop::collection::vec((strategy::text(), strategy::json_value()), 0..3),
        pretty in any::<bool>(),
    ) {
        let mut object = serde_json::Map::new();
        object.insert("prompt".to_owned(), Value::String(prompt.clone()));
        for (key, value) in extra {
            if key != "prompt" {
                object.insert(key, value);
            }
        }
        let json = if pretty {
            serde_json::to_vec_pretty(&object)
        } else {
            serde_json::to_vec(&object)
        }
        .expect("serializes");
        let request = RunLoopRequest::decode(&json).expect("decodes");
        prop_assert_eq!(request.prompt(), prompt.as_str());
        prop_assert_eq!(request.to_vec().expect("infallible"), json.clone());

        let channel = ChannelRequest::RunLoop(request);
        let bytes = channel.to_vec().expect("infallible");
        prop_assert_eq!(bytes[0], 5);
        prop_assert_eq!(&bytes[1..], &json[..]);
        prop_assert_eq!(ChannelRequest::decode(&bytes).expect("decodes"), channel);

        let built = RunLoopRequest::new(prompt.clone());
        let decoded = RunLoopRequest::decode(built.json()).expect("decodes");
        prop_assert_eq!(decoded.prompt(), prompt.as_str());
    }

    /// Stop and every unserved channel tag come back as themselves.
    #[test]
    fn channel_requests(tag in any::<u8>()) {
        let request = match tag {
            0 => ChannelRequest::Stop,
            5 => ChannelRequest::RunLoop(RunLoopRequest::new("")),
            other => ChannelRequest::Unserved(other),
        };
        let bytes = request.to_vec().expect("infallible");
        prop_assert_eq!(bytes[0], tag);
        prop_assert_eq!(ChannelRequest::decode(&bytes).expect("decodes"), request);
    }

    /// A chunk of any kind, with every MCP member, survives a frame: tag 0,
    /// the JSON, and back to an equal chunk. `type` comes first on the wire.
    #[test]
    fn chunk_frames(chunk in strategy::chunk()) {
        let frame = Response::Chunk(chunk.clone());
        let bytes = frame.to_vec().expect("serializes");
        prop_assert_eq!(bytes[0], CHUNK);
        let type_first = format!("{{\"type\":\"{}\"", chunk.kind());
        prop_assert!(bytes[1..].starts_with(type_first.as_bytes()));
        prop_assert_eq!(Response::decode(&bytes).expect("decodes"), frame);
    }

    /// A chunk whose `type` member comes last decodes to the same chunk (the
    /// decoder's second path).
    #[test]
    fn chunk_frames_with_type_last(chunk in strategy::chunk()) {
        let bytes = type_last(&chunk);
        prop_assert_eq!(Response::decode(&bytes).expect("decodes"), Response::Chunk(chunk));
    }

    /// Whatever number an annotation priority holds on the wire, a chunk
    /// that decodes comes back the same through its own encoding: a number
    /// beyond the 32-bit range is refused rather than kept as infinity.
    #[test]
    fn any_priority_decodes_stably(priority in strategy::finite_f64()) {
        let json = serde_json::json!({
            "type": "assistant_text_content",
            "text": "a",
            "annotations": { "priority": priority },
        });
        let mut payload = vec![CHUNK];
        serde_json::to_writer(&mut payload, &json).expect("serializes");
        match Response::decode(&payload) {
            Ok(frame) => {
                prop_assert!(priority.abs() <= f64::from(f32::MAX) * (1.0 + 1e-7));
                let again = frame.to_vec().expect("serializes");
                prop_assert_eq!(Response::decode(&again).expect("decodes again"), frame);
            }
            Err(error) => {
                prop_assert!(priority.abs() > f64::from(f32::MAX), "{}", error);
                prop_assert!(error.to_string().contains("priority"), "{}", error);
            }
        }
    }

    /// An error of any JSON type survives a frame and the error value codec.
    #[test]
    fn error_frames(value in strategy::json_value()) {
        let error = ErrorValue::new(value);
        let bytes = error.to_vec().expect("serializes");
        prop_assert_eq!(ErrorValue::decode(&bytes).expect("decodes"), error.clone());
        let frame = Response::Error(error);
        let bytes = frame.to_vec().expect("serializes");
        prop_assert_eq!(bytes[0], ERROR);
        prop_assert_eq!(Response::decode(&bytes).expect("decodes"), frame);
    }
}
