//! TLS to Redis (`rediss://`) against a test-owned `redis-server --tls-port`, with a CA, a
//! server certificate and a client certificate made in the test (rcgen): the tier connects and works
//! with the CA, is refused without it, and against a server that asks for client certificates
//! connects only with one.

use std::path::Path;
use std::time::Duration;

use rebate_cache::SharedTier;

use rebate_redis_tier::{RedisTarget, RedisTier, RedisTierConfig, RedisTls};
use rebate_testkit::redis_server::{REDIS_PROGRAMS, RedisCluster, RedisProcess, ServerTls};
use rebate_testkit::require_programs;
use rebate_testkit::tls::TestPki;

fn server_files(dir: &Path, pki: &TestPki, require_client_certs: bool) -> ServerTls {
    let files = pki.write(dir);
    ServerTls {
        cert_file: files.server_cert,
        key_file: files.server_key,
        ca_file: files.ca,
        require_client_certs,
    }
}

fn config(url: String, tls: RedisTls) -> RedisTierConfig {
    let mut config = RedisTierConfig::new(RedisTarget::Single(url));
    config.prefix = format!("tls-{:08x}", rand::random::<u32>());
    config.connect_timeout = Duration::from_secs(2);
    config.command_timeout = Duration::from_secs(2);
    config.tls = tls;
    config
}

#[tokio::test]
async fn the_tier_speaks_tls_with_the_ca_and_is_refused_without_it() {
    require_programs("redis TLS", &REDIS_PROGRAMS);
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new();
    let server = RedisProcess::start_tls(dir.path(), &server_files(dir.path(), &pki, false)).await;
    let url = server.tls_url().unwrap();

    let with_ca = RedisTls {
        ca_pem: Some(pki.ca.clone().into_bytes()),
        ..RedisTls::default()
    };
    let tier = RedisTier::connect(config(url.clone(), with_ca))
        .await
        .expect("the CA checks the server's certificate");
    tier.ping().await.unwrap();
    let beat = tier
        .heartbeat("tls-instance", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(beat.live, 1);

    // The system's roots do not know the test's CA: the handshake fails, nothing is sent.
    let refused = RedisTier::connect(config(url, RedisTls::default())).await;
    assert!(
        refused.is_err(),
        "a server certificate no root vouches for is refused"
    );
}

#[tokio::test]
async fn a_server_that_asks_for_client_certificates_takes_the_tiers() {
    require_programs("redis TLS", &REDIS_PROGRAMS);
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new();
    let server = RedisProcess::start_tls(dir.path(), &server_files(dir.path(), &pki, true)).await;
    let url = server.tls_url().unwrap();

    let ca_only = RedisTls {
        ca_pem: Some(pki.ca.clone().into_bytes()),
        ..RedisTls::default()
    };
    let without = RedisTier::connect(config(url.clone(), ca_only.clone())).await;
    assert!(without.is_err(), "no client certificate, no connection");

    let with_client = RedisTls {
        client_cert_pem: Some(pki.client_cert.clone().into_bytes()),
        client_key_pem: Some(pki.client_key.clone().into_bytes()),
        ..ca_only
    };
    let tier = RedisTier::connect(config(url, with_client.clone()))
        .await
        .expect("the client certificate is accepted");
    tier.ping().await.unwrap();
    // The key never shows in Debug output.
    let shown = format!("{with_client:?}");
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_serves_the_tier() {
    require_programs("a Redis Cluster with TLS", &REDIS_PROGRAMS);
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new();
    let cluster = RedisCluster::start_tls(3, 0, &server_files(dir.path(), &pki, false)).await;
    let seeds = cluster.tls_urls();
    assert_eq!(seeds.len(), 3);
    let with_ca = RedisTls {
        ca_pem: Some(pki.ca.clone().into_bytes()),
        ..RedisTls::default()
    };
    let mut settings = config(String::new(), with_ca);
    settings.url_or_nodes = RedisTarget::Cluster(seeds.clone());
    let tier = RedisTier::connect(settings.clone())
        .await
        .expect("the cluster's nodes are checked against the CA");
    tier.ping().await.unwrap();
    // Keys on every master: the tier follows the slot map to each node over TLS.
    for instance in ["a", "b", "c", "d", "e", "f"] {
        tier.heartbeat(instance, Duration::from_secs(5))
            .await
            .unwrap();
    }
    settings.tls = RedisTls::default();
    assert!(
        RedisTier::connect(settings).await.is_err(),
        "without the CA the nodes' certificates are refused"
    );
}

#[test]
fn tls_material_needs_rediss_urls_and_whole_client_pairs() {
    let plain = config(
        "redis://127.0.0.1:6379".to_owned(),
        RedisTls {
            ca_pem: Some(b"-----BEGIN CERTIFICATE-----".to_vec()),
            ..RedisTls::default()
        },
    );
    let error = plain.validate().unwrap_err();
    assert!(error.contains("rediss://"), "{error}");
    let half = config(
        "rediss://127.0.0.1:6379".to_owned(),
        RedisTls {
            client_cert_pem: Some(b"cert".to_vec()),
            ..RedisTls::default()
        },
    );
    let error = half.validate().unwrap_err();
    assert!(error.contains("client certificate"), "{error}");
}
