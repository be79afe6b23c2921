//! Idle keep-alive connections cannot close a listener (issue #40): a listener full of them from
//! several loopback addresses closes its oldest idle one for each new client, and the admin
//! listener answers its probes with every connection taken. Raw TCP from 127.0.0.x source
//! addresses (any of them reaches the loopback listener on Linux).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use rebate_tests::spawn_app_with;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const ITEM: &str = "/api/v1/items/jd/100001/rebate";

/// A connection to `target` from the loopback address 127.0.0.`last`.
async fn connect_from(last: u8, target: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)),
            0,
        ))
        .unwrap();
    socket.connect(target).await.unwrap()
}

/// One keep-alive `GET path` on `stream`: the status, or `None` when the server closed the
/// connection instead of answering.
async fn get(stream: &mut TcpStream, path: &str) -> Option<u16> {
    let request = format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut received = Vec::new();
    let mut buffer = [0_u8; 4096];
    loop {
        if let Some(end) = received.windows(4).position(|window| window == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&received[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .map_or(0, |value| value.trim().parse().unwrap());
            if received.len() >= end + 4 + length {
                return head.get(9..12)?.parse().ok();
            }
        }
        let read = stream.read(&mut buffer).await.ok()?;
        if read == 0 {
            return None;
        }
        received.extend_from_slice(&buffer[..read]);
    }
}

/// Whether the server has closed `stream` (reads end of stream or a reset).
async fn closed(stream: &mut TcpStream) -> bool {
    let mut buffer = [0_u8; 64];
    matches!(stream.read(&mut buffer).await, Ok(0) | Err(_))
}

#[tokio::test]
async fn a_listener_full_of_idle_connections_still_serves_new_clients() {
    let app = spawn_app_with(|settings| {
        settings.http.max_connections = 20;
        settings.http.max_connections_per_peer = 8;
        // Only the eviction is under test here: idle timeouts stay as configured.
        settings.http.idle_shrink_from = 1.0;
    })
    .await;
    // 20 idle keep-alive connections from five addresses, four each, oldest first.
    let mut hoarders = Vec::new();
    for index in 0..20_u8 {
        let mut stream = connect_from(2 + index / 4, app.address).await;
        assert_eq!(get(&mut stream, ITEM).await, Some(200));
        hoarders.push(stream);
    }
    // Five new clients from another address, each keeping its own connection.
    let mut newcomers = Vec::new();
    for _ in 0..5 {
        let mut stream = connect_from(10, app.address).await;
        for _ in 0..3 {
            assert_eq!(get(&mut stream, ITEM).await, Some(200));
        }
        newcomers.push(stream);
    }
    // Each took the place of the connection idle longest: the five first hoarders.
    for stream in &mut hoarders[..5] {
        assert!(closed(stream).await);
    }
    for stream in &mut hoarders[5..] {
        assert_eq!(get(stream, ITEM).await, Some(200));
    }
    let status: Value = app
        .admin_get("/admin/v1/status")
        .await
        .json()
        .await
        .unwrap();
    let connections = &status["connections"];
    assert_eq!(connections["open"], 20, "{connections}");
    assert_eq!(
        connections["idle_closes"]["evicted_for_new"], 5,
        "{connections}"
    );
    assert_eq!(connections["refused_listener_full"], 0, "{connections}");
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains(r#"rebate_http_idle_closes_total{reason="evicted_for_new"} 5"#),
        "{metrics}"
    );
    app.stop().await;
}

#[tokio::test]
async fn the_admin_probes_answer_with_every_admin_connection_taken() {
    let app = spawn_app_with(|settings| {
        settings.admin.max_connections = 64;
        settings.admin.probe_connections = 4;
    })
    .await;
    let admin: SocketAddr = app.admin_url.trim_start_matches("http://").parse().unwrap();
    // The issue's 70 idle connections: the last six take the places of the oldest six.
    let mut idle = Vec::new();
    for index in 0..70_u8 {
        let mut stream = connect_from(2 + index % 7, admin).await;
        assert_eq!(get(&mut stream, "/healthz").await, Some(200));
        idle.push(stream);
    }
    for path in ["/readyz", "/healthz"].repeat(8) {
        let mut probe = connect_from(20, admin).await;
        assert_eq!(get(&mut probe, path).await, Some(200), "{path}");
    }
    // Every connection mid-request (heads trickling in): the probes get the probe slots.
    drop(idle);
    let mut trickling = Vec::new();
    for index in 0..64_u8 {
        let mut stream = connect_from(2 + index % 7, admin).await;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nho")
            .await
            .unwrap();
        trickling.push(stream);
    }
    for path in ["/readyz", "/healthz"].repeat(4) {
        let mut probe = connect_from(20, admin).await;
        assert_eq!(get(&mut probe, path).await, Some(200), "{path}");
    }
    let mut not_a_probe = connect_from(20, admin).await;
    assert_eq!(get(&mut not_a_probe, "/metrics").await, Some(503));
    app.stop().await;
}
