//! Where the tier connects and how long it may wait; secrets never leave through `Debug`.

use std::fmt;
use std::time::Duration;

/// A single server (behind a reconnecting multiplexed connection) or a Redis Cluster.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// `redis://[user][:password@]host[:port][/db]` (or `rediss://`, `redis+unix://`).
    Single(String),
    /// Seed nodes of the cluster; the rest of the topology is discovered from them.
    Cluster(Vec<String>),
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisTarget::Single(url) => formatter
                .debug_tuple("Single")
                .field(&redact_url(url))
                .finish(),
            RedisTarget::Cluster(nodes) => formatter
                .debug_tuple("Cluster")
                .field(&nodes.iter().map(|url| redact_url(url)).collect::<Vec<_>>())
                .finish(),
        }
    }
}

/// How to reach Redis and how long each step may take.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisTierConfig {
    pub url_or_nodes: RedisTarget,
    /// Namespaces every key (`{prefix}:v1:…`) so that environments and tests can share a server.
    pub prefix: String,
    /// Bound on every operation, retries and redirects included: the tier is an optimisation, and
    /// a request would rather miss it than wait on it.
    pub command_timeout: Duration,
    /// Bound on the connection made by [`crate::RedisTier::connect`]; also each reconnect attempt.
    pub connect_timeout: Duration,
    /// TLS material for `rediss://` targets; without it a `rediss://` target trusts the
    /// system's roots.
    pub tls: RedisTls,
}

/// The CA a `rediss://` target's certificate is checked against, and a client certificate for
/// servers that ask for one, all PEM. `Debug` says which are set, never what they hold.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    pub ca_pem: Option<Vec<u8>>,
    pub client_cert_pem: Option<Vec<u8>>,
    pub client_key_pem: Option<Vec<u8>>,
}

impl RedisTls {
    pub fn is_set(&self) -> bool {
        self.ca_pem.is_some() || self.client_cert_pem.is_some() || self.client_key_pem.is_some()
    }

    /// The redis crate's form, when anything is set.
    pub(crate) fn certificates(&self) -> Option<redis::TlsCertificates> {
        if !self.is_set() {
            return None;
        }
        let client_tls = match (&self.client_cert_pem, &self.client_key_pem) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
            _ => None,
        };
        Some(redis::TlsCertificates {
            client_tls,
            root_cert: self.ca_pem.clone(),
        })
    }
}

impl fmt::Debug for RedisTls {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("RedisTls")
            .field("ca", &self.ca_pem.is_some())
            .field("client_cert", &self.client_cert_pem.is_some())
            .field("client_key", &self.client_key_pem.as_ref().map(|_| MASK))
            .finish()
    }
}

impl RedisTierConfig {
    pub const DEFAULT_PREFIX: &'static str = "rebate";
    pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_millis(100);
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

    /// Defaults for `target`: prefix `rebate`, 100 ms per command, 1 s to connect.
    pub fn new(url_or_nodes: RedisTarget) -> Self {
        Self {
            url_or_nodes,
            prefix: Self::DEFAULT_PREFIX.to_owned(),
            command_timeout: Self::DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            tls: RedisTls::default(),
        }
    }

    /// Explains the first thing that is wrong; [`crate::RedisTier::connect`] calls it.
    pub fn validate(&self) -> Result<(), String> {
        if self.prefix.is_empty() {
            return Err("redis tier prefix must not be empty".to_owned());
        }
        if self.prefix.contains(['{', '}']) {
            return Err(format!(
                "redis tier prefix {:?} must not contain '{{' or '}}': a hash tag would put \
                 every key into one cluster slot",
                self.prefix
            ));
        }
        if self
            .prefix
            .chars()
            .any(|character| character.is_whitespace() || character.is_control())
        {
            return Err(format!(
                "redis tier prefix {:?} must not contain whitespace or control characters",
                self.prefix
            ));
        }
        if self.command_timeout.is_zero() {
            return Err("redis tier command_timeout must be greater than zero".to_owned());
        }
        if self.connect_timeout.is_zero() {
            return Err("redis tier connect_timeout must be greater than zero".to_owned());
        }
        if self.tls.client_cert_pem.is_some() != self.tls.client_key_pem.is_some() {
            return Err(
                "redis tls: a client certificate needs its key, and a key its certificate"
                    .to_owned(),
            );
        }
        let urls: Vec<&String> = match &self.url_or_nodes {
            RedisTarget::Single(url) if url.trim().is_empty() => {
                return Err("redis tier url must not be empty".to_owned());
            }
            RedisTarget::Cluster(nodes) if nodes.is_empty() => {
                return Err("redis tier cluster needs at least one seed node".to_owned());
            }
            RedisTarget::Single(url) => vec![url],
            RedisTarget::Cluster(nodes) => nodes.iter().collect(),
        };
        if self.tls.is_set()
            && let Some(plain) = urls.iter().find(|url| !url.starts_with("rediss://"))
        {
            return Err(format!(
                "redis tls is configured but {} is not a rediss:// URL: the certificates would \
                 not be used",
                redact_url(plain)
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for RedisTierConfig {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("RedisTierConfig")
            .field("url_or_nodes", &self.url_or_nodes)
            .field("prefix", &self.prefix)
            .field("command_timeout", &self.command_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

const MASK: &str = "***";

/// `url` with its password (and, without a `:`, the whole user-info) replaced by `***`; also
/// masks `pass=`/`password=` query parameters, which `redis+unix://` URLs use.
pub(crate) fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let (scheme, rest) = url.split_at(scheme_end + 3);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rfind('@') {
        None => authority.to_owned(),
        Some(at) => {
            let (user_info, host) = authority.split_at(at);
            match user_info.split_once(':') {
                Some((user, _password)) => format!("{user}:{MASK}{host}"),
                None => format!("{MASK}{host}"),
            }
        }
    };
    format!("{scheme}{authority}{}", redact_query(tail))
}

/// The passwords written in `url` (still percent-encoded): the user-info's, else all of it when
/// it has no `:`, and `pass=`/`password=` query values.
pub(crate) fn url_passwords(url: &str) -> Vec<&str> {
    let Some((_, rest)) = url.split_once("://") else {
        return Vec::new();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let mut passwords = Vec::new();
    if let Some(at) = authority.rfind('@') {
        let user_info = &authority[..at];
        passwords.push(
            user_info
                .split_once(':')
                .map_or(user_info, |(_, password)| password),
        );
    }
    if let Some((_, query)) = tail.split_once('?') {
        for pair in query.split('&') {
            if let Some(("pass" | "password", value)) = pair.split_once('=') {
                passwords.push(value);
            }
        }
    }
    passwords
}

fn redact_query(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_owned();
    };
    let query = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if matches!(name, "pass" | "password") => format!("{name}={MASK}"),
            _ => pair.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&");
    format!("{path}?{query}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("redis://:s3cret@cache:6379/0"),
            "redis://:***@cache:6379/0"
        );
        assert_eq!(
            redact_url("rediss://app:s3cret@cache:6380"),
            "rediss://app:***@cache:6380"
        );
        assert_eq!(redact_url("redis://s3cret@cache"), "redis://***@cache");
        assert_eq!(
            redact_url("redis+unix:///run/redis.sock?db=1&pass=s3cret"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn finds_written_passwords() {
        assert_eq!(url_passwords("redis://:s3cret@cache"), vec!["s3cret"]);
        assert_eq!(url_passwords("redis://app:s3cret@cache/0"), vec!["s3cret"]);
        assert_eq!(url_passwords("redis://s3cret@cache"), vec!["s3cret"]);
        assert_eq!(
            url_passwords("redis+unix:///run/redis.sock?pass=s3cret"),
            vec!["s3cret"]
        );
        assert!(url_passwords("redis://cache:6379").is_empty());
    }

    #[test]
    fn debug_never_shows_the_password() {
        let single = RedisTierConfig::new(RedisTarget::Single(
            "redis://:hunter2@cache:6379".to_owned(),
        ));
        let cluster = RedisTierConfig::new(RedisTarget::Cluster(vec![
            "redis://u:hunter2@a:1".to_owned(),
            "redis://u:hunter2@b:2".to_owned(),
        ]));
        for settings in [single, cluster] {
            let shown = format!("{settings:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
    }

    #[test]
    fn validation_explains() {
        let good = RedisTierConfig::new(RedisTarget::Single("redis://127.0.0.1".to_owned()));
        assert_eq!(good.validate(), Ok(()));
        let mut tagged = good.clone();
        tagged.prefix = "{rebate}".to_owned();
        assert!(tagged.validate().unwrap_err().contains("hash tag"));
        let mut empty = good.clone();
        empty.prefix.clear();
        assert!(empty.validate().is_err());
        let mut instant = good.clone();
        instant.command_timeout = Duration::ZERO;
        assert!(instant.validate().unwrap_err().contains("command_timeout"));
        let no_nodes = RedisTierConfig::new(RedisTarget::Cluster(Vec::new()));
        assert!(no_nodes.validate().unwrap_err().contains("seed node"));
    }
}
