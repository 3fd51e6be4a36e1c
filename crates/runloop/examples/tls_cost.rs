//! What TLS costs a provider server, measured against the same server
//! without it, in one process: connections per second (each a TCP
//! connection, the TLS handshake, the WebSocket handshake, the
//! authorization and the close handshake), and chunks per second through
//! whole loops (the built-in demo agent, its proxy and the relay; TLS only
//! on the caller's hop, as in production).
//!
//! ```sh
//! cargo run --release -p runloop --example tls_cost -- [CONNECTIONS] [LOOPS] [CHUNKS] [SIZE] [ROUNDS]
//! ```
//!
//! Defaults: 300 connections, 8 loops at once of 5000 chunks of 200 bytes,
//! 5 rounds. The two servers take turns, in an order that turns around
//! every round, and each ratio is the median of the rounds' ratios, so a
//! machine that speeds up or slows down during the run weighs on both
//! alike. The certificate is made here (rcgen), for `localhost`.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use runloop::client::{Client, ClientConfig, Event};
use runloop::proto::agents_run::{Container, Image, ImageRef, RunRequest};
use runloop::proto::run_loop::Outcome;
use runloop::runtime::Catalog;
use runloop::server::{Credentials, Server, ServerConfig};
use runloop::tls::{ClientTls, ServerTls};
use serde_json::value::RawValue;

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// One side under test: where it listens and whom its clients trust.
struct Side {
    name: &'static str,
    url: String,
    tls: Option<ClientTls>,
}

fn request() -> Result<RunRequest, Failure> {
    let image = Image::Server(ImageRef {
        name: "demo".to_owned(),
        digest: format!("sha256:{}", "0".repeat(64)),
    });
    let agent = RawValue::from_string("{}".to_owned())?;
    Ok(RunRequest::new(Container::new(image, 1 << 30, 0), agent))
}

fn config(side: &Side) -> ClientConfig {
    let mut config = ClientConfig::default();
    config.tls = side.tls.clone();
    config
}

/// Connections per second: `count` of them, one after another.
async fn connections(side: &Side, count: usize) -> Result<f64, Failure> {
    let started = Instant::now();
    for _ in 0..count {
        let client = Client::connect_with(&side.url, "", config(side)).await?;
        client.close().await;
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

/// Chunks per second: `loops` loops at once, each on a connection of its
/// own, of `chunks` chunks of `size` bytes.
async fn throughput(side: &Side, loops: usize, chunks: u64, size: usize) -> Result<f64, Failure> {
    let prompt = format!("demo:load={chunks}x{size}");
    let mut opened = Vec::new();
    for _ in 0..loops {
        let client = Client::connect_with(&side.url, "", config(side)).await?;
        let run = client.start(request()?).await?;
        opened.push((client, run));
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (client, run) in opened {
        let prompt = prompt.clone();
        tasks.spawn(async move {
            let mut run_loop = run.run_loop(prompt);
            let mut got = 0u64;
            let mut outcome = None;
            while let Some(event) = run_loop.next().await {
                match event {
                    Event::Chunk { .. } => got += 1,
                    Event::End(end) => outcome = Some(end),
                    Event::Error(_) => {}
                }
            }
            drop(run_loop);
            run.stop().await;
            client.close().await;
            (got, outcome)
        });
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        let (got, outcome) = done?;
        if outcome != Some(Outcome::Finished { fatal: false }) || got != chunks {
            return Err(format!("a loop ended {outcome:?} after {got} of {chunks} chunks").into());
        }
        total += got;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn argument<T: std::str::FromStr>(n: usize, default: T) -> Result<T, Failure> {
    match std::env::args().nth(n) {
        Some(text) => text
            .parse()
            .map_err(|_| format!("argument {n}: {text:?} is not a number").into()),
        None => Ok(default),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Failure> {
    let count: usize = argument(1, 300)?;
    let loops: usize = argument(2, 8)?;
    let chunks: u64 = argument(3, 5000)?;
    let size: usize = argument(4, 200)?;
    let rounds: usize = argument(5, 5)?.max(1);
    if cfg!(debug_assertions) {
        eprintln!("a debug build: the figures measure the optimiser's absence");
    }

    let scratch = tempfile::tempdir()?;
    let authority_key = rcgen::KeyPair::generate()?;
    let mut authority = rcgen::CertificateParams::new(Vec::<String>::new())?;
    authority.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let authority_cert = authority.self_signed(&authority_key)?;
    let issuer = rcgen::Issuer::new(authority, authority_key);
    let key = rcgen::KeyPair::generate()?;
    let cert =
        rcgen::CertificateParams::new(vec!["localhost".to_owned()])?.signed_by(&key, &issuer)?;
    let (ca, cert_path, key_path) = (
        scratch.path().join("ca.pem"),
        scratch.path().join("cert.pem"),
        scratch.path().join("key.pem"),
    );
    std::fs::write(&ca, authority_cert.pem())?;
    std::fs::write(&cert_path, cert.pem())?;
    std::fs::write(&key_path, key.serialize_pem())?;

    let plain = Server::bind(
        "127.0.0.1:0",
        ServerConfig::new(Credentials::Any, Catalog::demo()),
    )
    .await?
    .spawn()
    .0;
    let mut with_tls = ServerConfig::new(Credentials::Any, Catalog::demo());
    with_tls.tls = Some(ServerTls::load(&cert_path, &key_path)?);
    let secure = Server::bind("127.0.0.1:0", with_tls).await?.spawn().0;
    let sides = [
        Side {
            name: "ws://",
            url: plain.url(),
            tls: None,
        },
        Side {
            name: "wss://",
            url: format!("wss://localhost:{}", secure.local_addr().port()),
            tls: Some(ClientTls::new(&[ca])?),
        },
    ];

    // Warm-up: the first connections pay for lazy set-up on both sides.
    for side in &sides {
        connections(side, 10).await?;
    }
    let mut figures = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    let mut ratios = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        let mut this = [[0.0; 2]; 2];
        for &i in &order {
            this[i][0] = connections(&sides[i], count).await?;
            this[i][1] = throughput(&sides[i], loops, chunks, size).await?;
        }
        for i in 0..2 {
            figures[i][0].push(this[i][0]);
            figures[i][1].push(this[i][1]);
        }
        ratios[0].push(this[1][0] / this[0][0]);
        ratios[1].push(this[1][1] / this[0][1]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (side, [conns, chunks_per_s]) in sides.iter().zip(figures) {
        println!(
            "{:7} {:8.0} connections/s   {:10.0} chunks/s   (medians of {rounds} rounds)",
            side.name,
            median(conns),
            median(chunks_per_s)
        );
    }
    println!(
        "TLS / plain: connections/s {:.3}, chunks/s {:.3} ({count} connections in a row; \
         {loops} loops at once of {chunks} chunks of {size} bytes)",
        median(ratios[0].clone()),
        median(ratios[1].clone())
    );
    plain.shutdown();
    secure.shutdown();
    Ok(())
}
