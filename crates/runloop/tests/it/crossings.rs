//! No run ever reaches another run's agent program: many exec runs start
//! at once, for two tokens, each with a nonce of its own as its `agent`
//! value; each agent program (`fixtures/identity_agent.py`) takes one
//! registration and answers every loop with the nonce it was registered
//! with. A run whose registration reached an agent that already had one
//! (409 "already registered"), or whose loop is answered with another
//! nonce, is a crossing.
//!
//! Short by default (2 rounds of 2 × 25 starts); the load version, 20
//! rounds of 2 × 50 starts at once (2,000 in all), runs with
//! `RUNLOOP_CROSSINGS=full cargo test --release -p runloop --test crossings -- --nocapture`.
//! Crossings must be none in either. On a small machine the load version
//! overloads the server (hundreds of programs starting on two cores), and
//! a run may then fail for that (a proxy handshake past its deadline): it
//! prints such failures and counts them; the short version allows none.

use std::sync::Arc;

use runloop::client::Client;
use runloop::proto::Decode;
use runloop::proto::agents_run::RunRequest;
use runloop::proto::run_loop::{AgenticLoopChunk, Outcome};
use runloop::runtime::{AgentSpec, Catalog, DiskPolicy, ExecConfig};
use runloop::server::{Credentials, Server, ServerConfig};

const TOKENS: [&str; 2] = ["alice", "bob"];

/// How one run went.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Run {
    /// Its own agent answered.
    Own,
    /// Another run's agent answered, or had its registration.
    Crossed(String),
    /// It failed otherwise.
    Failed(String),
}

fn request(nonce: &str) -> RunRequest {
    let json = format!(
        r#"{{"image":{{"server":{{"name":"id","digest":"sha256:{}"}}}},"memory":268435456,"disk":0,"agent":{{"nonce":"{nonce}"}}}}"#,
        "0".repeat(64)
    );
    RunRequest::decode(json.as_bytes()).expect("a request")
}

async fn one_run(client: Arc<Client>, nonce: String) -> Run {
    let run = match client.start(request(&nonce)).await {
        Ok(run) => run,
        Err(error) => {
            let error = error.to_string();
            return if error.contains("already registered") {
                Run::Crossed(error)
            } else {
                Run::Failed(error)
            };
        }
    };
    let (chunks, outcome) = run.run_loop("who are you?").collect_chunks().await;
    run.stop().await;
    match (chunks.as_slice(), outcome) {
        ([AgenticLoopChunk::AssistantTextContent(text)], Outcome::Finished { .. }) => {
            if text.text == nonce {
                Run::Own
            } else {
                Run::Crossed(format!("{nonce} was answered by {}", text.text))
            }
        }
        (chunks, outcome) => Run::Failed(format!("{chunks:?} {outcome:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_exec_starts_across_two_tokens_never_cross() {
    let full = std::env::var("RUNLOOP_CROSSINGS").is_ok_and(|mode| mode == "full");
    let (rounds, per_token) = if full { (20, 50) } else { (2, 25) };
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/identity_agent.py"
    );
    let mut catalog = Catalog::new().with_exec(ExecConfig {
        disk: DiskPolicy::Unenforced,
        ..ExecConfig::default()
    });
    catalog
        .add(
            format!("id=exec:python3 {fixture}")
                .parse::<AgentSpec>()
                .expect("a spec"),
        )
        .expect("added");
    let config = ServerConfig::new(
        Credentials::Tokens(TOKENS.iter().map(|t| (*t).to_owned()).collect()),
        catalog,
    );
    let server = Server::bind("127.0.0.1:0", config).await.expect("bind");
    let (handle, _task) = server.spawn();

    let mut own = 0;
    let mut crossed = Vec::new();
    let mut failed = Vec::new();
    for round in 0..rounds {
        let mut runs = Vec::new();
        for token in TOKENS {
            let client = Arc::new(
                Client::connect(&handle.url(), token)
                    .await
                    .expect("connects"),
            );
            for n in 0..per_token {
                let nonce = format!("{token}-{round}-{n}");
                runs.push(tokio::spawn(one_run(Arc::clone(&client), nonce)));
            }
        }
        for run in runs {
            match run.await.expect("a run task") {
                Run::Own => own += 1,
                Run::Crossed(how) => crossed.push(how),
                Run::Failed(how) => failed.push(how),
            }
        }
    }
    let starts = rounds * TOKENS.len() * per_token;
    println!(
        "{starts} exec starts ({rounds} rounds of {} at once, two tokens): {own} served by their own \
         agent, {} crossings, {} other failures",
        TOKENS.len() * per_token,
        crossed.len(),
        failed.len()
    );
    for failure in &failed {
        println!("failed: {failure}");
    }
    assert_eq!(crossed, Vec::<String>::new(), "crossings");
    if !full {
        assert_eq!(failed, Vec::<String>::new(), "failures");
    }
    assert_eq!(own + failed.len(), starts);
}
