//! A bare HTTP/1.0 GET, for the admin listener, nginx and Prometheus's
//! API: the tests need the status and the body, nothing more.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// `GET path` on `addr`: the status code and the body.
pub fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("GET {path} on {addr}: {e}"));
    tcp.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(tcp, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("the request");
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).expect("the answer");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("GET {path} on {addr}: no status in {head:?}"));
    (status, body.to_owned())
}

/// The exposition an admin listener at `admin` answers `/metrics` with.
pub fn metrics(admin: SocketAddr) -> String {
    let (status, text) = get(admin, "/metrics");
    assert_eq!(status, 200, "GET /metrics: {text}");
    text
}

/// `text` for a URL's query, percent-encoded.
pub fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
