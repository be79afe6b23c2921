//! Certificates for tests that start a server with TLS on: a CA of the test's own, a server
//! certificate for `127.0.0.1` and `localhost`, and a client certificate, all signed by it and
//! written as PEM files into a directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A CA and the certificates it signed, PEM.
#[derive(Debug, Clone)]
pub struct TestPki {
    pub ca: String,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
}

/// Where [`TestPki::write`] put each file.
#[derive(Debug, Clone)]
pub struct PkiFiles {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl TestPki {
    /// A new CA (fresh keys every call) and its server and client certificates.
    pub fn new() -> Self {
        let ca_key = KeyPair::generate().expect("a CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "rebate test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).expect("a self-signed CA");
        let leaf = |names: Vec<String>, usages: Vec<ExtendedKeyUsagePurpose>| {
            let key = KeyPair::generate().expect("a key");
            let mut params = CertificateParams::new(names).expect("certificate parameters");
            params
                .distinguished_name
                .push(DnType::CommonName, "rebate test");
            params.extended_key_usages = usages;
            let cert = params
                .signed_by(&key, &ca_cert, &ca_key)
                .expect("a certificate the CA signed");
            (cert.pem(), key.serialize_pem())
        };
        // A server's certificate serves client connections too: a Redis Cluster node presents
        // it when it connects to the other nodes' bus, and they check it.
        let (server_cert, server_key) = leaf(
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        );
        let (client_cert, client_key) = leaf(
            vec!["rebate-query".to_owned()],
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        );
        Self {
            ca: ca_cert.pem(),
            server_cert,
            server_key,
            client_cert,
            client_key,
        }
    }

    /// Writes every file into `dir` (`ca.pem`, `server.pem`, `server.key`, `client.pem`,
    /// `client.key`).
    pub fn write(&self, dir: &Path) -> PkiFiles {
        let write = |name: &str, pem: &str| {
            let path = dir.join(name);
            std::fs::write(&path, pem).expect("a PEM file written");
            path
        };
        PkiFiles {
            ca: write("ca.pem", &self.ca),
            server_cert: write("server.pem", &self.server_cert),
            server_key: write("server.key", &self.server_key),
            client_cert: write("client.pem", &self.client_cert),
            client_key: write("client.key", &self.client_key),
        }
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}
