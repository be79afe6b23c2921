//! HTTP/1.1 strictness at the edge, black-box over raw TCP (each request written byte for byte):
//! `Host` missing or repeated is 400, `chunked` applied twice or with another coding is 400 (or
//! hyper's own bare 400 when `chunked` is not last), a chunk announcing more than the body limit
//! is 413 as soon as its size line arrives, and a compressed body is 415. Every refusal the edge
//! makes is the JSON error with a trace id and closes the connection.
//!
//! The "at once" tests configure a body timeout of 60 s and wait at most 5 s for the answer, the
//! client sending nothing more: a bound on liveness, not a timed assertion.

use std::time::Duration;

use rebate_tests::{TestApp, spawn_app_with};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The embedded app with a body timeout far beyond the tests' own bound.
async fn spawn_strict_app() -> TestApp {
    spawn_app_with(|settings| {
        settings.http.body_read_timeout_ms = 60_000;
    })
    .await
}

/// Writes `request` on a new connection to `address` and returns everything the server sends
/// until it closes the connection, within 5 s (the client's side stays open: nothing more is
/// sent).
async fn exchange(address: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(request).await.unwrap();
    read_until_closed(&mut stream).await
}

async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut bytes = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut bytes))
        .await
        .expect("the server answers and closes without waiting for the body timeout")
        .ok();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The headers of a raw response, lowercased, and its body.
fn split(response: &str) -> (String, &str) {
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of head in {response:?}"));
    (head.to_ascii_lowercase(), body)
}

/// `response` is `status` with the JSON error `code`, its trace id in the body and the header,
/// and says the connection closes.
fn assert_json_refusal(response: &str, status: u16, code: &str) {
    assert!(
        response.starts_with(&format!("HTTP/1.1 {status} ")),
        "{response}"
    );
    let (head, body) = split(response);
    assert!(
        head.contains("content-type: application/json"),
        "{response}"
    );
    assert!(head.contains("connection: close"), "{response}");
    let body: Value = serde_json::from_str(body).unwrap_or_else(|error| panic!("{error}: {body}"));
    assert_eq!(body["error"]["code"], code, "{body}");
    let trace_id = body["trace_id"].as_str().expect("a trace id in the body");
    assert!(
        head.contains(&format!("x-trace-id: {trace_id}")),
        "{response}"
    );
}

const ITEM: &str = "/api/v1/items/taobao/100001/rebate";

#[tokio::test]
async fn host_must_be_present_once_in_http_1_1_and_may_be_absent_in_http_1_0() {
    let app = spawn_strict_app().await;
    // The hot path's kind of request (a GET of one item) and a POST with a body: both refused.
    let missing = exchange(
        app.address,
        format!("GET {ITEM} HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert_json_refusal(&missing, 400, "invalid_host");
    let body = r#"{"items":[{"platform":"taobao","item_id":"100001"}]}"#;
    let missing_with_body = format!(
        "POST /api/v1/items:batch HTTP/1.1\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let missing_with_body = exchange(app.address, missing_with_body.as_bytes()).await;
    assert_json_refusal(&missing_with_body, 400, "invalid_host");

    let twice = format!("GET {ITEM} HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n");
    assert_json_refusal(
        &exchange(app.address, twice.as_bytes()).await,
        400,
        "invalid_host",
    );
    let invalid = format!("GET {ITEM} HTTP/1.1\r\nhost: user@example.com\r\n\r\n");
    assert_json_refusal(
        &exchange(app.address, invalid.as_bytes()).await,
        400,
        "invalid_host",
    );

    // HTTP/1.0 needs no Host; HTTP/1.1 with one (a name and port, an IP literal) is served.
    let old = exchange(
        app.address,
        format!("GET {ITEM} HTTP/1.0\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(old.starts_with("HTTP/1.0 200 "), "{old}");
    for host in ["127.0.0.1:8080", "[::1]:8080", "rebate.example.com"] {
        let request = format!("GET {ITEM} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n");
        let served = exchange(app.address, request.as_bytes()).await;
        assert!(served.starts_with("HTTP/1.1 200 "), "{host}: {served}");
    }
}

/// A chunked POST of the batch route with `transfer_encoding` and a complete small body.
fn chunked_post(transfer_encoding: &str) -> String {
    let body = r#"{"items":[{"platform":"taobao","item_id":"100001"}]}"#;
    format!(
        "POST /api/v1/items:batch HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         {transfer_encoding}\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    )
}

#[tokio::test]
async fn chunked_is_accepted_once_and_last_only() {
    let app = spawn_strict_app().await;
    for (transfer_encoding, what) in [
        (
            "transfer-encoding: chunked, chunked\r\n",
            "chunked twice in one line",
        ),
        (
            "transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n",
            "chunked on two lines",
        ),
        (
            "transfer-encoding: gzip, chunked\r\n",
            "another coding before chunked",
        ),
    ] {
        let response = exchange(app.address, chunked_post(transfer_encoding).as_bytes()).await;
        assert!(response.starts_with("HTTP/1.1 400 "), "{what}: {response}");
        assert_json_refusal(&response, 400, "invalid_transfer_encoding");
    }

    // `chunked` not last: hyper cannot frame the body and answers before the service runs,
    // with a bare 400 (no JSON body, no trace id), then closes.
    let response = exchange(
        app.address,
        chunked_post("transfer-encoding: chunked, gzip\r\n").as_bytes(),
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 400 "), "{response}");
    let (head, body) = split(&response);
    assert!(
        body.is_empty() && !head.contains("x-trace-id"),
        "{response}"
    );
    // So it does for any Transfer-Encoding in an HTTP/1.0 request.
    let old = chunked_post("transfer-encoding: chunked\r\n").replace("HTTP/1.1", "HTTP/1.0");
    let response = exchange(app.address, old.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 400 "), "{response}");
    assert!(!response.contains("x-trace-id"), "{response}");

    // Once, last, in any case: served.
    for transfer_encoding in [
        "transfer-encoding: chunked\r\n",
        "Transfer-Encoding: Chunked\r\n",
    ] {
        let request = chunked_post(transfer_encoding)
            .replace("host: x\r\n", "host: x\r\nconnection: close\r\n");
        let served = exchange(app.address, request.as_bytes()).await;
        assert!(served.starts_with("HTTP/1.1 200 "), "{served}");
    }
}

/// The head of a chunked batch POST.
const CHUNKED_HEAD: &str = "POST /api/v1/items:batch HTTP/1.1\r\nhost: x\r\n\
    content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";

#[tokio::test]
async fn a_chunk_announcing_more_than_the_limit_is_refused_at_once() {
    let app = spawn_strict_app().await;
    let limit = app.state.limits.edge.body_limit_bytes;
    // The largest size a chunk line can carry, and one byte over the limit; the size line in
    // the head's packet or after it, and nothing of the chunk's data sent.
    for size_line in [
        "FFFFFFFFFFFFFFFF\r\n".to_owned(),
        format!("{:x}\r\n", limit + 1),
        format!("{:X};name=value\r\n", limit + 1),
    ] {
        let in_one = exchange(app.address, format!("{CHUNKED_HEAD}{size_line}").as_bytes()).await;
        assert_json_refusal(&in_one, 413, "payload_too_large");

        let mut stream = TcpStream::connect(app.address).await.unwrap();
        stream.write_all(CHUNKED_HEAD.as_bytes()).await.unwrap();
        // The size line's digits in two writes: only all of them pass the limit.
        let (first, rest) = size_line.split_at(3);
        stream.write_all(first.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        stream.write_all(rest.as_bytes()).await.unwrap();
        assert_json_refusal(
            &read_until_closed(&mut stream).await,
            413,
            "payload_too_large",
        );
    }

    // After a served request on the same connection (pipelined in one write): the first is
    // answered, the second refused.
    let pipelined =
        format!("GET {ITEM} HTTP/1.1\r\nhost: x\r\n\r\n{CHUNKED_HEAD}FFFFFFFFFFFFFFFF\r\n");
    let response = exchange(app.address, pipelined.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 200 "), "{response}");
    let second = &response[response
        .find("HTTP/1.1 413 ")
        .unwrap_or_else(|| panic!("{response}"))..];
    assert_json_refusal(second, 413, "payload_too_large");
}

#[tokio::test]
async fn a_chunk_of_exactly_the_limit_is_served() {
    let app = spawn_strict_app().await;
    let limit = app.state.limits.edge.body_limit_bytes;
    let json = r#"{"items":[{"platform":"taobao","item_id":"100001"}]}"#;
    let body = format!("{json}{}", " ".repeat(limit - json.len()));
    let request = format!(
        "POST /api/v1/items:batch HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\nconnection: close\r\n\r\n{limit:x}\r\n{body}\r\n0\r\n\r\n"
    );
    let served = exchange(app.address, request.as_bytes()).await;
    assert!(served.starts_with("HTTP/1.1 200 "), "{served}");
}

#[tokio::test]
async fn the_admin_listener_refuses_an_oversized_chunk_at_once_too() {
    let app = spawn_strict_app().await;
    let admin: std::net::SocketAddr = app.admin_url.trim_start_matches("http://").parse().unwrap();
    let request = "POST /admin/v1/events HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                   transfer-encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\n";
    assert_json_refusal(
        &exchange(admin, request.as_bytes()).await,
        413,
        "payload_too_large",
    );
}

#[tokio::test]
async fn a_compressed_body_is_415_and_the_header_alone_is_harmless() {
    let app = spawn_strict_app().await;
    let body = r#"{"items":[{"platform":"taobao","item_id":"100001"}]}"#;
    let post = |content_encoding: &str| {
        format!(
            "POST /api/v1/items:batch HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-encoding: {content_encoding}\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        )
    };
    for content_encoding in ["gzip", "identity, br", "deflate"] {
        let response = exchange(app.address, post(content_encoding).as_bytes()).await;
        assert_json_refusal(&response, 415, "unsupported_content_encoding");
        assert!(
            split(&response).0.contains("accept-encoding: identity"),
            "{response}"
        );
        assert!(response.contains("plain JSON"), "{response}");
    }
    // A chunked body is a body too.
    let chunked = chunked_post("transfer-encoding: chunked\r\ncontent-encoding: gzip\r\n");
    assert_json_refusal(
        &exchange(app.address, chunked.as_bytes()).await,
        415,
        "unsupported_content_encoding",
    );

    // `identity` changes nothing; on a GET without a body the header describes nothing.
    let identity = exchange(app.address, post("identity").as_bytes()).await;
    assert!(identity.starts_with("HTTP/1.1 200 "), "{identity}");
    let get = format!(
        "GET {ITEM} HTTP/1.1\r\nhost: x\r\ncontent-encoding: gzip\r\nconnection: close\r\n\r\n"
    );
    let served = exchange(app.address, get.as_bytes()).await;
    assert!(served.starts_with("HTTP/1.1 200 "), "{served}");
}
