//! The error convention over this crate's errors: each says its own layer's
//! sentence and leaves its cause to `source()`, so a chain printer says
//! every link once.

use std::error::Error;

use runloop_proto::agents_run::{RunRequest, RunResponse};
use runloop_proto::authorization::{Authorization, AuthorizationError};
use runloop_proto::channel::{ChannelRequest, ChannelRequestError};
use runloop_proto::connection::{NotServed, Violation};
use runloop_proto::endpoint::EndpointRequestError;
use runloop_proto::error_chain::Chain;
use runloop_proto::observer::{ChannelId, Malformed};
use runloop_proto::registration::RegistrationAsk;
use runloop_proto::run_loop::{Outcome, Reader, Response, Step};
use runloop_proto::{Decode, Undecodable};
use runloop_testkit::errors::assert_cause_said_once;

fn run_request_error() -> runloop_proto::agents_run::RunRequestError {
    RunRequest::decode(b"{").expect_err("not a request")
}

fn channel_request_error() -> ChannelRequestError {
    ChannelRequest::decode(b"\x05{}").expect_err("no prompt")
}

#[test]
fn no_error_says_its_cause_twice() {
    let broken = match Reader::new().response(b"\x00{") {
        Some(Step::End(Outcome::Broken(broken))) => broken,
        other => panic!("an undecodable chunk breaks the channel: {other:?}"),
    };
    let errors: Vec<Box<dyn Error>> = vec![
        Box::new(run_request_error()),
        Box::new(RunResponse::decode(b"\x00{").expect_err("no id")),
        Box::new(RunResponse::decode(b"\x01{} {}").expect_err("two values")),
        Box::new(Undecodable::with_payload(
            RunResponse::decode(b"\x00{").expect_err("no id"),
            b"\x00{",
        )),
        Box::new(channel_request_error()),
        Box::new(Authorization::decode(b"\x00\xff").expect_err("not UTF-8")),
        Box::new(Violation::Rejected(AuthorizationError::UnknownMode(7))),
        Box::new(NotServed::Request(EndpointRequestError::AgentsRun(
            run_request_error(),
        ))),
        Box::new(NotServed::ChannelRequest(channel_request_error())),
        Box::new(Malformed::Authorization(AuthorizationError::UnknownMode(7))),
        Box::new(Malformed::ChannelRequest {
            at: ChannelId {
                scope: 1,
                channel: 2,
            },
            error: channel_request_error(),
        }),
        Box::new(RegistrationAsk::decode(b"[").expect_err("not JSON")),
        Box::new(Response::decode(b"\x00{").expect_err("bad chunk")),
        Box::new(broken),
    ];
    for error in &errors {
        assert_cause_said_once(error.as_ref());
    }
}

#[test]
fn the_chain_says_each_layer_once() {
    let not_served = NotServed::ChannelRequest(channel_request_error());
    assert_eq!(
        Chain(&not_served).to_string(),
        "the channel request did not decode: run-loop request did not parse: \
         missing field `prompt` at line 1 column 2"
    );
    let run = NotServed::Request(EndpointRequestError::AgentsRun(run_request_error()));
    assert_eq!(
        Chain(&run).to_string(),
        "the request did not decode: containers::agents::run request did not parse: \
         EOF while parsing an object at line 1 column 1"
    );
}
