//! The real `rebate-query` binary: configuration from a file and the environment, the address it
//! logs, serving, `seed`, refusing bad configuration, and a clean stop on SIGTERM.
#![allow(
    clippy::disallowed_methods,
    reason = "the binary under test runs on the wall clock"
)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BINARY: &str = env!("CARGO_BIN_EXE_rebate-query");

fn command(database: &std::path::Path) -> Command {
    let mut command = Command::new(BINARY);
    command
        .env("REBATE__STORE__SQLITE__PATH", database)
        .env("REBATE__LOG__FORMAT", "json")
        .env("REBATE__ADMIN__LISTEN", "127.0.0.1:0")
        .env(
            "REBATE__ADMIN__TOKEN_FILE",
            database.with_file_name("admin-token"),
        )
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Reads the JSON log lines until the one announcing the API address.
fn wait_for_listen_address(child: &mut Child) -> String {
    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if event["message"] == "rebate query service listening" {
                let _ = sender.send(event["address"].as_str().unwrap_or_default().to_owned());
            }
        }
    });
    receiver
        .recv_timeout(Duration::from_secs(60))
        .expect("the service logs its address")
}

fn terminate(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

fn wait_with_timeout(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait works") {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn serves_from_file_and_environment_config_and_stops_on_sigterm() {
    let directory = tempfile::tempdir().unwrap();
    let database = directory.path().join("nested/dir/catalogue.sqlite");
    let config = directory.path().join("rebate.toml");
    std::fs::write(&config, "[timeouts]\nnormal_ms = 400\n").unwrap();

    let mut child = command(&database)
        .args([
            "--config",
            config.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .spawn()
        .unwrap();
    let address = wait_for_listen_address(&mut child);
    assert!(
        database.is_file(),
        "the database file is created on first start"
    );

    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!(
            "http://{address}/api/v1/items/taobao/100001/rebate"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["item"]["item_id"], "100001");
    assert_eq!(body["degraded"], false);

    terminate(&child);
    let status = wait_with_timeout(&mut child, Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
}

#[test]
fn seed_loads_the_demo_catalogue_and_is_idempotent() {
    let directory = tempfile::tempdir().unwrap();
    let database = directory.path().join("catalogue.sqlite");
    // The first run inserts the whole catalogue; the second finds every row present.
    for expected_new_products in [30_000, 0] {
        let output = command(&database).arg("seed").output().unwrap();
        assert!(output.status.success(), "{output:?}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("demo catalogue loaded"), "{stdout}");
        assert!(
            stdout.contains(&format!("\"products\":{expected_new_products},")),
            "{stdout}"
        );
    }
}

#[test]
fn bad_configuration_is_refused_with_the_key_named() {
    let directory = tempfile::tempdir().unwrap();
    let database = directory.path().join("catalogue.sqlite");
    let output = command(&database)
        .env("REBATE__TIMEOUTS__CORE_MS", "0")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("timeouts.core_ms"), "{stderr}");

    let output = command(&database)
        .args(["--config", "/nonexistent/rebate.toml"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent/rebate.toml"));

    let output = command(&database)
        .args(["--listen", "not-an-address"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--listen"));
    assert!(
        !database.exists(),
        "nothing is created when the configuration is refused"
    );
}
