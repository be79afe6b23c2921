//! TLS to Redis (`rediss://`) against a test-owned `redis-server --tls-port`, with a CA, a
//! server certificate and a client certificate made here (rcgen): the tier connects and works
//! with the CA, is refused without it, and against a server that asks for client certificates
//! connects only with one.

use std::path::Path;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rebate_cache::SharedTier;
use rebate_redis_tier::{RedisTarget, RedisTier, RedisTierConfig, RedisTls};
use rebate_testkit::redis_server::{REDIS_PROGRAMS, RedisProcess, ServerTls};
use rebate_testkit::require_programs;

/// A CA, and a server and a client certificate it signed, as PEM.
struct Pki {
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
}

fn pki() -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "rebate test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names).unwrap();
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &ca_cert, &ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(
        vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_cert, client_key) = leaf(
        vec!["rebate-query".to_owned()],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    Pki {
        ca: ca_cert.pem(),
        server_cert,
        server_key,
        client_cert,
        client_key,
    }
}

fn server_files(dir: &Path, pki: &Pki, require_client_certs: bool) -> ServerTls {
    let write = |name: &str, pem: &str| {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    ServerTls {
        cert_file: write("server.pem", &pki.server_cert),
        key_file: write("server.key", &pki.server_key),
        ca_file: write("ca.pem", &pki.ca),
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
    let pki = pki();
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
    let pki = pki();
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
