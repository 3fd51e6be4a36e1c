//! The server's logs never hold a credential: every event of this test
//! binary, at TRACE, is written into a buffer while connections authorize,
//! are refused, and break the rules with distinctive tokens, and neither
//! token may appear in it — as text or as hex.
//!
//! This covers every `tracing` event of the server and the crates it runs
//! on. Records of crates that log through `log` instead (tungstenite writes
//! every message it reads at trace) only reach a subscriber through a
//! bridge; `runloop serve` caps that bridge below trace, and the CLI's own
//! test checks the whole command at `RUST_LOG=trace`.

use runloop::client::Client;
use runloop::runtime::Catalog;
use runloop::server::{Credentials, Server, ServerConfig};
use runloop_proto::frame::ClientFrame;
use runloop_proto::run_loop::Outcome;
use runloop_testkit::caller::RawClient;
use runloop_testkit::logs::Logs;
use runloop_testkit::server::{released, run_request};

const ACCEPTED: &str = "tok-ACCEPTED-7f3a9c";
const REFUSED: &str = "tok-REFUSED-91c2d4";

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credential_reaches_the_logs_even_at_trace() {
    let logs = Logs::global(tracing::Level::TRACE);

    let config = ServerConfig::new(Credentials::Tokens(vec![ACCEPTED.into()]), Catalog::demo());
    let server = Server::bind("127.0.0.1:0", config).await.expect("bind");
    let (server, _task) = server.spawn();

    // Accepted, and a whole loop through the builtin demo.
    let client = Client::connect(&server.url(), ACCEPTED)
        .await
        .expect("connect");
    let run = client.start(run_request()).await.expect("run starts");
    let outcome = run.run_loop("count these words").outcome().await;
    assert_eq!(outcome, Outcome::Finished { fatal: false });
    run.stop().await;
    client.close().await;

    // Refused: a wrong credential, the right one in a reserved mode, and a
    // second authorization after a good one.
    let mut wrong = RawClient::authorized(&server.url(), REFUSED).await;
    assert_eq!(wrong.next_frame().await, None);
    let mut reserved = RawClient::connect(&server.url()).await;
    let payload = [b"\x01", ACCEPTED.as_bytes()].concat();
    reserved
        .send_frame(&ClientFrame::Authorization { payload: &payload })
        .await;
    assert_eq!(reserved.next_frame().await, None);
    let mut twice = RawClient::authorized(&server.url(), ACCEPTED).await;
    let payload = [b"\x00", REFUSED.as_bytes()].concat();
    twice
        .send_frame(&ClientFrame::Authorization { payload: &payload })
        .await;
    assert_eq!(twice.next_frame().await, None);
    released(&server).await;

    let text = logs.text();
    // The logs are there, at trace, and say what happened...
    for expected in [
        "TRACE",
        "authorized",
        "authorization refused",
        "the credential is not accepted",
        "authorization mode 1 (brokered) is reserved",
        "a second authorization frame",
    ] {
        assert!(text.contains(expected), "{expected:?} is logged");
    }
    // ...and never with what the credentials were.
    for token in [ACCEPTED, REFUSED] {
        for form in [token.to_owned(), hex(token)] {
            let line = text.lines().find(|line| line.contains(&form));
            assert!(line.is_none(), "{form} is in the logs: {line:?}");
        }
    }
}
