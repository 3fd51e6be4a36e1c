//! A real Prometheus (the Debian package's binary) scraping admin
//! listeners every second, on a loopback port, with its data in a scratch
//! directory; and `promtool check metrics`.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use runloop_testkit::Part;
use runloop_testkit::process::KillOnDrop;
use serde_json::Value;

use crate::http;

/// A running Prometheus, stopped when dropped.
pub struct Prometheus {
    _child: KillOnDrop,
    _dir: tempfile::TempDir,
    /// Its HTTP API.
    pub addr: SocketAddr,
}

/// Prometheus and promtool (both from the Debian package), as a test
/// asks for them before it starts anything.
pub const PARTS: &[Part] = &[
    Part::program("prometheus", "prometheus"),
    Part::program("promtool", "prometheus"),
];

impl Prometheus {
    /// Starts Prometheus scraping `targets` (admin listeners) every second.
    pub fn start(targets: &[SocketAddr]) -> Prometheus {
        let dir = tempfile::tempdir().expect("scratch");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: runloop\n    scrape_interval: 1s\n    \
             scrape_timeout: 1s\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        let path = dir.path().join("prometheus.yml");
        std::fs::write(&path, config).expect("the configuration");
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let mut child = Command::new("prometheus")
                .arg(format!("--config.file={}", path.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .arg("--log.level=warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("prometheus starts");
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(20) {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if std::net::TcpStream::connect(addr).is_ok()
                    && http::get(addr, "/-/ready").0 == 200
                {
                    return Prometheus {
                        _child: KillOnDrop(child),
                        _dir: dir,
                        addr,
                    };
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("prometheus did not start");
    }

    /// The instant vector of `query`: each series' labels and its value.
    pub fn query(&self, query: &str) -> Vec<(Value, f64, f64)> {
        let (status, body) = http::get(
            self.addr,
            &format!("/api/v1/query?query={}", http::encode(query)),
        );
        assert_eq!(status, 200, "{query}: {body}");
        let answer: Value = serde_json::from_str(&body).expect("JSON");
        answer["data"]["result"]
            .as_array()
            .unwrap_or_else(|| panic!("{query}: {answer}"))
            .iter()
            .map(|series| {
                let time = series["value"][0].as_f64().expect("a time");
                let value = series["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .expect("a value");
                (series["metric"].clone(), time, value)
            })
            .collect()
    }
}

/// `promtool check metrics` has nothing to say of `exposition`.
pub fn promtool_passes(exposition: &str) {
    promtool_check(exposition).unwrap_or_else(|said| panic!("promtool: {said}\n{exposition}"));
}

/// What `promtool check metrics` says of `exposition`: `Ok` when it has
/// nothing to say.
fn promtool_check(exposition: &str) -> Result<(), String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(exposition.as_bytes())
        .expect("the exposition");
    let output = child.wait_with_output().expect("promtool ends");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(said)
    }
}
