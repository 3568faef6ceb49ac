//! Plain HTTP/1.1 probes of a service's admin port (`/healthz`, `/readyz`,
//! `/metrics`), blocking or async.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// `GET path` on 127.0.0.1:port; the raw response, or `None` if nothing
/// listens.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// `GET path` on 127.0.0.1:port from async code; the raw response.
pub async fn fetch(port: u16, path: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

/// Polls `GET path` until it answers 200, for at most `timeout`.
pub fn wait_ready(port: u16, path: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        if http_get(port, path).is_some_and(|answer| answer.starts_with("HTTP/1.1 200")) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "127.0.0.1:{port}{path} was not ready within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `GET path` until it answers, for at most `timeout`.
pub fn wait_for_http(port: u16, path: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(answer) = http_get(port, path) {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "nothing answered on 127.0.0.1:{port}{path} within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
