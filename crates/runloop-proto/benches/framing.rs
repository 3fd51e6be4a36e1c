//! Framing costs: the 9-byte header, and framing a relayed chunk, each
//! beside the least a hand-written version could do.
//!
//! `header`: writing a header with `frame::write_header` and reading one
//! with `ServerFrame::decode`, against pushing a byte and two
//! `u32::to_be_bytes` / reading a byte and two `u32::from_be_bytes` by hand.
//!
//! `relay_framing`: the relay's path for one proxy message — `frame::build`
//! with `encode_raw_chunk` into a channel-response frame — for chunks of
//! 100 B, 2 KiB and 16 KiB, against a bare `Vec::with_capacity` and
//! `extend_from_slice` of the same bytes (an allocation and a memcpy).
//!
//! `cargo bench -p runloop-proto --bench framing` runs both groups, then
//! prints how many times the baseline's time each of ours takes, from an
//! interleaved timing loop in the same process.

use std::convert::Infallible;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use runloop_proto::frame::{self, FrameType, HEADER_LEN, ServerFrame};
use runloop_proto::run_loop::response::encode_raw_chunk;
use runloop_proto::{Decode, Writer};

const SCOPE: u32 = 0x0102_0304;
const CHANNEL: u32 = 7;
const SIZES: [usize; 3] = [100, 2048, 16 * 1024];

/// Ours: the crate's header writer, into a reused buffer.
fn encode_ours(buf: &mut Vec<u8>) {
    buf.clear();
    frame::write_header(
        &mut Writer::new(buf),
        FrameType::ChannelResponse,
        black_box(SCOPE),
        black_box(CHANNEL),
    );
}

/// Baseline: the type byte and two big-endian numbers, pushed by hand.
fn encode_by_hand(buf: &mut Vec<u8>) {
    buf.clear();
    buf.push(FrameType::ChannelResponse as u8);
    buf.extend_from_slice(&black_box(SCOPE).to_be_bytes());
    buf.extend_from_slice(&black_box(CHANNEL).to_be_bytes());
}

/// Ours: a whole server frame decoded from its message.
fn decode_ours(message: &[u8]) -> Option<(u32, u32)> {
    match ServerFrame::decode(message) {
        Ok(ServerFrame::ChannelResponse { scope, channel, .. }) => Some((scope, channel)),
        _ => None,
    }
}

/// Baseline: the length check, the type byte and two big-endian numbers,
/// read by hand.
fn decode_by_hand(message: &[u8]) -> Option<(u32, u32)> {
    let header: &[u8; HEADER_LEN] = message.get(..HEADER_LEN)?.try_into().ok()?;
    if header[0] != FrameType::ChannelResponse as u8 {
        return None;
    }
    let scope = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    let channel = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
    Some((scope, channel))
}

/// A chunk's JSON of exactly `size` bytes.
fn chunk_json(size: usize) -> Vec<u8> {
    let head = br#"{"type":"assistant_text_content","text":""#;
    let tail = br#""}"#;
    let mut json = head.to_vec();
    json.resize(size - tail.len(), b'a');
    json.extend_from_slice(tail);
    assert_eq!(json.len(), size);
    json
}

/// Ours: the relay's framing of one proxy chunk.
fn frame_ours(json: &[u8]) -> Vec<u8> {
    let framed = frame::build(
        FrameType::ChannelResponse,
        SCOPE,
        CHANNEL,
        1 + json.len(),
        |out| {
            encode_raw_chunk(json, out);
            Ok::<(), Infallible>(())
        },
    );
    match framed {
        Ok(message) => message,
        Err(never) => match never {},
    }
}

/// Baseline: one allocation of the frame's size and a copy of the bytes.
fn frame_by_memcpy(json: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(HEADER_LEN + 1 + json.len());
    message.extend_from_slice(json);
    message
}

/// The framed message must be what the relay owes the caller.
fn assert_framing_is_right() {
    let json = chunk_json(100);
    let message = frame_ours(&json);
    assert_eq!(
        ServerFrame::decode(&message),
        Ok(ServerFrame::ChannelResponse {
            scope: SCOPE,
            channel: CHANNEL,
            payload: &[&[0][..], &json[..]].concat(),
        })
    );
    assert_eq!(message.capacity(), message.len(), "one exact allocation");
    let (mut ours, mut by_hand) = (Vec::new(), Vec::new());
    encode_ours(&mut ours);
    encode_by_hand(&mut by_hand);
    assert_eq!(ours, by_hand);
    assert_eq!(decode_ours(&message), decode_by_hand(&message));
    assert_eq!(decode_ours(&message), Some((SCOPE, CHANNEL)));
}

/// Runs `ours` and `baseline` in turns for a while; the best time of each.
fn best_of(mut ours: impl FnMut(), mut baseline: impl FnMut(), rounds: u32) -> (f64, f64) {
    let mut best = [Duration::MAX; 2];
    let deadline = Instant::now() + Duration::from_millis(800);
    while Instant::now() < deadline {
        let start = Instant::now();
        for _ in 0..rounds {
            ours();
        }
        best[0] = best[0].min(start.elapsed());
        let start = Instant::now();
        for _ in 0..rounds {
            baseline();
        }
        best[1] = best[1].min(start.elapsed());
    }
    let per_op = |d: Duration| d.as_secs_f64() * 1e9 / f64::from(rounds);
    (per_op(best[0]), per_op(best[1]))
}

fn print_ratio(what: &str, (ours, baseline): (f64, f64)) {
    println!(
        "  {what:<28} ours {ours:>9.2} ns   baseline {baseline:>9.2} ns   ours/baseline time = {:.2}x",
        ours / baseline
    );
}

fn ratios(message: &[u8]) {
    println!();
    println!("framing: time per operation, best of interleaved rounds");
    let mut buf = Vec::with_capacity(64);
    let mut buf2 = Vec::with_capacity(64);
    print_ratio(
        "header encode",
        best_of(
            || encode_ours(black_box(&mut buf)),
            || encode_by_hand(black_box(&mut buf2)),
            100_000,
        ),
    );
    print_ratio(
        "header decode",
        best_of(
            || {
                black_box(decode_ours(black_box(message)));
            },
            || {
                black_box(decode_by_hand(black_box(message)));
            },
            100_000,
        ),
    );
    for size in SIZES {
        let json = chunk_json(size);
        print_ratio(
            &format!("relay framing {size} B"),
            best_of(
                || drop(black_box(frame_ours(black_box(&json)))),
                || drop(black_box(frame_by_memcpy(black_box(&json)))),
                10_000,
            ),
        );
    }
}

fn main() {
    assert_framing_is_right();
    let message = frame_ours(&chunk_json(100));

    let mut criterion = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1500))
        .configure_from_args();
    {
        let mut group = criterion.benchmark_group("header");
        let mut buf = Vec::with_capacity(64);
        group.bench_function("encode/ours", |b| b.iter(|| encode_ours(&mut buf)));
        group.bench_function("encode/by_hand", |b| b.iter(|| encode_by_hand(&mut buf)));
        group.bench_function("decode/ours", |b| {
            b.iter(|| decode_ours(black_box(&message)))
        });
        group.bench_function("decode/by_hand", |b| {
            b.iter(|| decode_by_hand(black_box(&message)))
        });
        group.finish();
    }
    {
        let mut group = criterion.benchmark_group("relay_framing");
        for size in SIZES {
            let json = chunk_json(size);
            group.throughput(Throughput::Bytes(u64::try_from(size).expect("fits in u64")));
            group.bench_with_input(BenchmarkId::new("ours", size), &json, |b, json| {
                b.iter(|| frame_ours(black_box(json)))
            });
            group.bench_with_input(BenchmarkId::new("memcpy", size), &json, |b, json| {
                b.iter(|| frame_by_memcpy(black_box(json)))
            });
        }
        group.finish();
    }
    criterion.final_summary();

    // As in run_loop_decode: only a real `cargo bench` run prints ratios.
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("--bench") && !has("--test") && !has("--list") && !has("--profile-time") {
        ratios(&message);
    }
}
