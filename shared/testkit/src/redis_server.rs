//! Private `redis-server` processes for tests against a real Redis: a single server or one node
//! of a cluster ([`RedisProcess`]), and a Redis Cluster of masters with replicas
//! ([`RedisCluster`]) that can fail a master over. Each runs on free loopback ports with its
//! files in a scratch directory and nothing persisted, and is killed and reaped when its guard
//! drops — also when the test panics. Every wait is bounded.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tempfile::TempDir;
use tokio::time::Instant;

use crate::{WAIT_LIMIT, free_ports, wait_until_true};

/// How long a cluster node waits for a silent peer before counting it as failing (Redis's
/// default is 15 s): short, so that a test's failover or outage plays out in seconds.
pub const CLUSTER_NODE_TIMEOUT_MS: u64 = 2_000;

/// How long a started server may take to answer `PING`.
const START_LIMIT: Duration = Duration::from_secs(5);
/// A port found free can be taken before the server binds it: one more try on other ports.
const START_ATTEMPTS: usize = 2;
/// Any one command or connection attempt of the helpers; a node that does not answer within it
/// counts as not answering.
const COMMAND_LIMIT: Duration = Duration::from_secs(2);
const POLL_EVERY: Duration = Duration::from_millis(20);

/// The programs these helpers run: a test that starts a server or a cluster checks them first
/// with [`crate::programs_available`].
pub const REDIS_PROGRAMS: [&str; 2] = ["redis-server", "redis-cli"];

/// What a started server is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Standalone,
    /// `--cluster-enabled yes`, with its cluster bus on a free port of its own
    /// (`--cluster-port`) and [`CLUSTER_NODE_TIMEOUT_MS`].
    ClusterNode,
}

/// A server's TLS files: its certificate and key, and the CA it checks clients against.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert_file: std::path::PathBuf,
    pub key_file: std::path::PathBuf,
    pub ca_file: std::path::PathBuf,
    /// `--tls-auth-clients yes`: clients must show a certificate the CA signed.
    pub require_client_certs: bool,
}

/// A `redis-server` child process, killed and reaped on drop so a failing test leaks nothing.
#[derive(Debug)]
pub struct RedisProcess {
    port: u16,
    /// With [`RedisProcess::start_tls`]: the TLS port beside the plain one.
    tls_port: Option<u16>,
    child: Child,
}

impl RedisProcess {
    /// Starts a server with its files in `dir` on a free port and waits (bounded) until it
    /// answers `PING`; tries other ports once if it does not come up.
    pub async fn start(dir: &Path, mode: Mode) -> Self {
        Self::start_with(dir, mode, None).await
    }

    /// A standalone server that also listens for TLS on a port of its own (`--tls-port`,
    /// [`RedisProcess::tls_url`]); its plain port stays for the helpers' own checks.
    pub async fn start_tls(dir: &Path, tls: &ServerTls) -> Self {
        Self::start_with(dir, Mode::Standalone, Some(tls)).await
    }

    async fn start_with(dir: &Path, mode: Mode, tls: Option<&ServerTls>) -> Self {
        let mut failures = Vec::new();
        for _attempt in 0..START_ATTEMPTS {
            let [port, bus_port, tls_port] = free_ports();
            let log = dir.join(format!("redis-{port}.log"));
            let mut command = Command::new("redis-server");
            command
                .arg("--port")
                .arg(port.to_string())
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--daemonize", "no", "--protected-mode", "no"])
                .arg("--dir")
                .arg(dir)
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if mode == Mode::ClusterNode {
                command
                    .args(["--cluster-enabled", "yes", "--cluster-config-file"])
                    .arg(format!("nodes-{port}.conf"))
                    .arg("--cluster-port")
                    .arg(bus_port.to_string())
                    .arg("--cluster-node-timeout")
                    .arg(CLUSTER_NODE_TIMEOUT_MS.to_string());
            }
            if let Some(tls) = tls {
                command
                    .arg("--tls-port")
                    .arg(tls_port.to_string())
                    .arg("--tls-cert-file")
                    .arg(&tls.cert_file)
                    .arg("--tls-key-file")
                    .arg(&tls.key_file)
                    .arg("--tls-ca-cert-file")
                    .arg(&tls.ca_file)
                    .arg("--tls-auth-clients")
                    .arg(if tls.require_client_certs {
                        "yes"
                    } else {
                        "no"
                    });
                if mode == Mode::ClusterNode {
                    // The bus and replication over TLS too; clients that connect over TLS
                    // are told the nodes' TLS ports.
                    command.args(["--tls-cluster", "yes", "--tls-replication", "yes"]);
                }
            }
            let child = command
                .spawn()
                .expect("redis-server starts (check programs_available(…, &REDIS_PROGRAMS) first)");
            let mut server = Self {
                port,
                tls_port: tls.map(|_| tls_port),
                child,
            };
            match server.wait_until_answering().await {
                Ok(()) => return server,
                Err(reason) => {
                    let log_tail = std::fs::read_to_string(&log).unwrap_or_default();
                    let last_lines: Vec<&str> = log_tail.lines().rev().take(3).collect();
                    failures.push(format!("port {port}: {reason} ({last_lines:?})"));
                }
            }
        }
        panic!(
            "redis-server did not start in {START_ATTEMPTS} attempts: {}",
            failures.join("; ")
        );
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `rediss://127.0.0.1:<tls port>` of a server started with [`RedisProcess::start_tls`].
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port
            .map(|port| format!("rediss://127.0.0.1:{port}"))
    }

    /// A plain connection to this server alone: a cluster node answers `MOVED` for keys it does
    /// not serve.
    pub async fn connection(&self) -> MultiplexedConnection {
        self.try_connection()
            .await
            .unwrap_or_else(|error| panic!("redis-server on port {}: {error}", self.port))
    }

    async fn try_connection(&self) -> Result<MultiplexedConnection, String> {
        let client = redis::Client::open(self.url()).map_err(|error| error.to_string())?;
        match tokio::time::timeout(COMMAND_LIMIT, client.get_multiplexed_async_connection()).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_elapsed) => Err(format!("no connection within {COMMAND_LIMIT:?}")),
        }
    }

    /// One command on a fresh connection, `None` when the server did not answer it in time or
    /// answered an error (a cluster node's `MOVED` among them).
    pub async fn query<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> Option<T> {
        let mut connection = self.try_connection().await.ok()?;
        tokio::time::timeout(COMMAND_LIMIT, command.query_async(&mut connection))
            .await
            .ok()?
            .ok()
    }

    async fn wait_until_answering(&mut self) -> Result<(), String> {
        let give_up = Instant::now() + START_LIMIT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited ({status})"));
            }
            if self
                .query::<String>(&redis::cmd("PING"))
                .await
                .is_some_and(|pong| pong == "PONG")
            {
                return Ok(());
            }
            if Instant::now() >= give_up {
                return Err(format!("no answer to PING within {START_LIMIT:?}"));
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `INFO replication` says a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Master,
    Replica {
        /// The port of the master it replicates.
        master_port: u16,
        /// `master_link_status:up`: it is connected to its master and in sync.
        link_up: bool,
    },
}

impl Role {
    fn parse(info: &str) -> Option<Self> {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
        };
        match field("role")? {
            "master" => Some(Self::Master),
            "slave" => Some(Self::Replica {
                master_port: field("master_port")?.parse().ok()?,
                link_up: field("master_link_status") == Some("up"),
            }),
            _ => None,
        }
    }
}

/// A Redis Cluster of private nodes in a scratch directory; the processes die with it.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisProcess>,
    masters: usize,
    replicas: usize,
    /// Holds the nodes' config and log files; removed after the nodes (fields drop in order).
    _dir: TempDir,
}

impl RedisCluster {
    /// Starts `masters` masters (at least 3, as `redis-cli --cluster create` demands) with
    /// `replicas` replicas each, creates the cluster with `redis-cli`, and waits (bounded) until
    /// every node reports `cluster_state:ok` and knows every other, and every replica's link to
    /// its master is up.
    pub async fn start(masters: usize, replicas: usize) -> Self {
        Self::start_with(masters, replicas, None).await
    }

    /// As [`RedisCluster::start`], every node also on a TLS port, with the cluster bus and
    /// replication over TLS ([`RedisCluster::tls_urls`]); the plain ports stay for the helpers.
    pub async fn start_tls(masters: usize, replicas: usize, tls: &ServerTls) -> Self {
        Self::start_with(masters, replicas, Some(tls)).await
    }

    async fn start_with(masters: usize, replicas: usize, tls: Option<&ServerTls>) -> Self {
        assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        let dir = tempfile::tempdir().expect("a scratch directory for the cluster");
        let mut nodes = Vec::new();
        for _ in 0..masters * (1 + replicas) {
            nodes.push(RedisProcess::start_with(dir.path(), Mode::ClusterNode, tls).await);
        }
        let cluster = Self {
            nodes,
            masters,
            replicas,
            _dir: dir,
        };
        cluster.create(tls).await;
        cluster.wait_until_formed().await;
        cluster
    }

    /// `redis-cli --cluster create`; with TLS over the nodes' TLS ports, since their bus speaks
    /// TLS and they announce those ports.
    async fn create(&self, tls: Option<&ServerTls>) {
        let mut command = tokio::process::Command::new("redis-cli");
        if let Some(tls) = tls {
            command.arg("--tls").arg("--cacert").arg(&tls.ca_file);
        }
        command.arg("--cluster").arg("create");
        for node in &self.nodes {
            let port = match tls {
                Some(_) => node.tls_port.unwrap_or(node.port),
                None => node.port,
            };
            command.arg(format!("127.0.0.1:{port}"));
        }
        command
            .arg("--cluster-replicas")
            .arg(self.replicas.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let output = tokio::time::timeout(WAIT_LIMIT, command.output())
            .await
            .expect("redis-cli --cluster create finishes in time")
            .expect("redis-cli runs");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    async fn wait_until_formed(&self) {
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        wait_until_true(
            "every cluster node reports cluster_state:ok and knows every node",
            || async {
                for node in &self.nodes {
                    let info: Option<String> = node.query(redis::cmd("CLUSTER").arg("INFO")).await;
                    let formed = info.is_some_and(|info| {
                        info.contains("cluster_state:ok") && info.contains(&known)
                    });
                    if !formed {
                        return false;
                    }
                }
                true
            },
        )
        .await;
        wait_until_true("every replica's link to its master is up", || async {
            let mut masters = 0;
            let mut linked_replicas = 0;
            for index in 0..self.nodes.len() {
                match self.role(index).await {
                    Some(Role::Master) => masters += 1,
                    Some(Role::Replica { link_up: true, .. }) => linked_replicas += 1,
                    Some(Role::Replica { link_up: false, .. }) | None => {}
                }
            }
            masters == self.masters && linked_replicas == self.masters * self.replicas
        })
        .await;
    }

    /// Every node, masters and replicas, in start order (the roles move on a failover).
    pub fn nodes(&self) -> &[RedisProcess] {
        &self.nodes
    }

    /// Every node's URL: seed nodes for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisProcess::url).collect()
    }

    /// Every node's `rediss://` URL, for a cluster started with [`RedisCluster::start_tls`].
    pub fn tls_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter_map(RedisProcess::tls_url)
            .collect()
    }

    /// What node `index` says it is now; `None` when it does not answer.
    pub async fn role(&self, index: usize) -> Option<Role> {
        let info: String = self.nodes[index]
            .query(redis::cmd("INFO").arg("replication"))
            .await?;
        Role::parse(&info)
    }

    /// The nodes that replicate node `master` now.
    pub async fn replicas_of(&self, master: usize) -> Vec<usize> {
        let master_port = self.nodes[master].port;
        let mut replicas = Vec::new();
        for index in 0..self.nodes.len() {
            if let Some(Role::Replica {
                master_port: port, ..
            }) = self.role(index).await
                && port == master_port
            {
                replicas.push(index);
            }
        }
        replicas
    }

    /// The node that serves `key` now: the one master that answers for it (every other node,
    /// replicas included, answers `MOVED`).
    pub async fn owner_of(&self, key: &str) -> usize {
        for (index, node) in self.nodes.iter().enumerate() {
            let answer: Option<i64> = node.query(redis::cmd("EXISTS").arg(key)).await;
            if answer.is_some() {
                return index;
            }
        }
        panic!("no cluster node serves {key}");
    }

    /// A manual failover: `CLUSTER FAILOVER` on `replica`, which takes its master's slots over
    /// once it has caught up with it (no write is lost), then waits (bounded) until it reports
    /// itself a master. Returns how long that took.
    pub async fn fail_over(&self, replica: usize) -> Duration {
        assert!(
            matches!(self.role(replica).await, Some(Role::Replica { .. })),
            "node {replica} is not a replica"
        );
        let started = Instant::now();
        let answer: Option<String> = self.nodes[replica]
            .query(redis::cmd("CLUSTER").arg("FAILOVER"))
            .await;
        assert_eq!(
            answer.as_deref(),
            Some("OK"),
            "CLUSTER FAILOVER refused by node {replica}"
        );
        wait_until_true(
            "the replica reports role:master after CLUSTER FAILOVER",
            || async { self.role(replica).await == Some(Role::Master) },
        )
        .await;
        started.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_read_from_info_replication() {
        assert_eq!(
            Role::parse("# Replication\r\nrole:master\r\nconnected_slaves:1\r\n"),
            Some(Role::Master)
        );
        assert_eq!(
            Role::parse(
                "role:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:41234\r\nmaster_link_status:up\r\n"
            ),
            Some(Role::Replica {
                master_port: 41234,
                link_up: true
            })
        );
        assert_eq!(
            Role::parse("role:slave\r\nmaster_port:41234\r\nmaster_link_status:down\r\n"),
            Some(Role::Replica {
                master_port: 41234,
                link_up: false
            })
        );
        assert_eq!(Role::parse("loading:1\r\n"), None);
    }
}
