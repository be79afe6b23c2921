//! [`RedisTier`]: the [`SharedTier`] contract on one Redis server or a Redis Cluster.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use rebate_cache::{FenceOutcome, SharedTier, TierEntry, TierError, TierKey};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    AsyncConnectionConfig, Client, Cmd, IntoConnectionInfo, RedisError, ScriptInvocation,
    ServerError, ServerErrorKind, Value,
};

use crate::codec;
use crate::scripts::Scripts;
use crate::settings::{RedisTarget, RedisTierConfig, redact_url, url_passwords};
use crate::slots::{SlotMap, key_slot};
use crate::stats::{Counters, RedisTierStats};

/// The shared tier on Redis. Cheap to clone: clones share one multiplexed connection (or one
/// cluster connection) and one set of counters.
#[derive(Clone)]
pub struct RedisTier {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    prefix: String,
    command_timeout: Duration,
    connect_timeout: Duration,
    /// The target with passwords masked, for `Debug` and error messages.
    target: String,
    /// Passwords as written and as decoded, scrubbed from every error message we pass on.
    secrets: Vec<String>,
    scripts: Scripts,
    counters: Counters,
}

enum Backend {
    /// Reconnects on its own after the server drops the connection.
    Single(ConnectionManager),
    Cluster(ClusterBackend),
}

struct ClusterBackend {
    /// Routes commands, follows `MOVED`/`ASK` and keeps one multiplexed connection per node.
    connection: ClusterConnection,
    /// Our copy of the slot owners, used only to group a batch by node.
    slots: RwLock<Arc<SlotMap>>,
    /// Set while a refresh runs, so a burst of redirects starts one refresh, not one per batch.
    refreshing: AtomicBool,
}

impl ClusterBackend {
    fn new(connection: ClusterConnection, map: SlotMap) -> Self {
        Self {
            connection,
            slots: RwLock::new(Arc::new(map)),
            refreshing: AtomicBool::new(false),
        }
    }

    fn slot_map(&self) -> Arc<SlotMap> {
        Arc::clone(&self.slots.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn store_slot_map(&self, map: SlotMap) {
        *self.slots.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(map);
    }
}

/// What Redis answered for one key of a batch.
enum KeyReply {
    Value(Value),
    /// The key holds another type; for reads that is a corrupt entry, not a failure.
    WrongType,
}

/// The per-key command of a batch.
#[derive(Debug, Clone, Copy)]
enum BatchCommand {
    Get,
    Delete,
}

impl BatchCommand {
    fn for_key(self, name: &str) -> Cmd {
        let mut command = match self {
            BatchCommand::Get => redis::cmd("GET"),
            BatchCommand::Delete => redis::cmd("DEL"),
        };
        command.arg(name);
        command
    }
}

impl RedisTier {
    /// The fenced `SET` script; `keep_equal` also keeps an entry at the same version.
    async fn fenced_set(
        &self,
        key: TierKey,
        entry: &TierEntry,
        ttl: Duration,
        keep_equal: bool,
    ) -> Result<FenceOutcome, TierError> {
        let name = self.key_name(key);
        let mut invocation = self.inner.scripts.fenced_set.prepare_invoke();
        invocation
            .key(&name)
            .arg(entry.version.to_string())
            .arg(codec::encode(entry))
            .arg(ttl_millis(ttl))
            .arg(if keep_equal { "1" } else { "0" });

        let outcome = self
            .bounded(async {
                match self.invoke(&invocation).await? {
                    Value::Int(1) => Ok(FenceOutcome::Written),
                    Value::BulkString(digits) => codec::parse_canonical_version(&digits)
                        .map(|current| FenceOutcome::Stale { current })
                        .ok_or_else(|| self.unexpected("the fenced write")),
                    _ => Err(self.unexpected("the fenced write")),
                }
            })
            .await?;
        let counters = &self.inner.counters;
        match outcome {
            FenceOutcome::Written => Counters::add(&counters.fenced_writes, 1),
            FenceOutcome::Stale { .. } => Counters::add(&counters.stale_writes_refused, 1),
        }
        Ok(outcome)
    }

    /// Connects and proves the server answers, within `settings.connect_timeout`.
    ///
    /// Fails with [`TierError::Backend`] (a message naming the target, never its password) when
    /// the settings are invalid or Redis cannot be reached: the caller decides whether to run
    /// without the shared tier. Once connected, lost connections are re-established on their own.
    pub async fn connect(settings: RedisTierConfig) -> Result<Self, TierError> {
        settings.validate().map_err(|reason| {
            TierError::Backend(format!("invalid redis tier settings: {reason}"))
        })?;
        let target = describe_target(&settings.url_or_nodes);
        let secrets = collect_secrets(&settings.url_or_nodes);
        let connecting = async {
            match &settings.url_or_nodes {
                RedisTarget::Single(url) => connect_single(url, &settings).await,
                RedisTarget::Cluster(nodes) => connect_cluster(nodes, &settings).await,
            }
        };
        let backend = match tokio::time::timeout(settings.connect_timeout, connecting).await {
            Ok(Ok(backend)) => backend,
            Ok(Err(error)) => {
                return Err(TierError::Backend(scrub(
                    format!("cannot connect to redis at {target}: {error}"),
                    &secrets,
                )));
            }
            Err(_elapsed) => {
                return Err(TierError::Backend(format!(
                    "cannot connect to redis at {target}: no answer within {:?}",
                    settings.connect_timeout
                )));
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                backend,
                prefix: settings.prefix,
                command_timeout: settings.command_timeout,
                connect_timeout: settings.connect_timeout,
                target,
                secrets,
                scripts: Scripts::new(),
                counters: Counters::default(),
            }),
        })
    }

    /// The Redis key of `key`: `{prefix}:v1:{platform}:{item_id}:{part}`, e.g.
    /// `rebate:v1:taobao:100001:coupons`. `v1` names the storage format so that a future format
    /// can live beside this one during a rolling deploy.
    pub fn key_name(&self, key: TierKey) -> String {
        entry_key(&self.inner.prefix, key)
    }

    /// The prefix every key of this tier starts with.
    pub(crate) fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    pub(crate) fn scripts(&self) -> &Scripts {
        &self.inner.scripts
    }

    /// The key of `key`'s rebuild lease; a separate key so a lease never disturbs the value.
    fn lease_key_name(&self, key: TierKey) -> String {
        format!("{}:lease", self.key_name(key))
    }

    /// Deletes the entries of `keys` (not their leases) in one round trip per node and returns
    /// how many existed. For invalidation; a missing key is not an error.
    pub async fn delete(&self, keys: &[TierKey]) -> Result<u64, TierError> {
        if keys.is_empty() {
            return Ok(0);
        }
        let names: Vec<String> = keys.iter().map(|&key| self.key_name(key)).collect();
        self.bounded(async {
            let replies = match &self.inner.backend {
                Backend::Single(manager) => {
                    let mut command = redis::cmd("DEL");
                    command.arg(&names);
                    let removed = self.query(manager, &command).await?;
                    vec![KeyReply::Value(removed)]
                }
                Backend::Cluster(cluster) => {
                    self.per_node(cluster, &names, BatchCommand::Delete).await?
                }
            };
            let mut removed = 0u64;
            for reply in replies {
                match reply {
                    KeyReply::Value(Value::Int(count)) => {
                        removed += u64::try_from(count).unwrap_or(0);
                    }
                    _ => return Err(self.unexpected("DEL")),
                }
            }
            Ok(removed)
        })
        .await
    }

    /// Totals since [`RedisTier::connect`].
    pub fn stats(&self) -> RedisTierStats {
        self.inner.counters.snapshot()
    }

    /// Runs `operation` under the command timeout and counts how it failed, in one place.
    pub(crate) async fn bounded<T>(
        &self,
        operation: impl Future<Output = Result<T, TierError>>,
    ) -> Result<T, TierError> {
        let outcome = match tokio::time::timeout(self.inner.command_timeout, operation).await {
            Ok(outcome) => outcome,
            Err(_elapsed) => Err(TierError::Timeout(self.inner.command_timeout)),
        };
        match &outcome {
            Err(TierError::Timeout(_)) => Counters::add(&self.inner.counters.timeouts, 1),
            Err(TierError::Backend(_)) => Counters::add(&self.inner.counters.errors, 1),
            Ok(_) => {}
        }
        outcome
    }

    fn count_round_trip(&self) {
        Counters::add(&self.inner.counters.round_trips, 1);
    }

    /// One command on the backend's connection, whatever the backend.
    pub(crate) async fn query_any(&self, command: &Cmd) -> Result<Value, TierError> {
        match &self.inner.backend {
            Backend::Single(manager) => self.query(manager, command).await,
            Backend::Cluster(cluster) => {
                self.count_round_trip();
                command
                    .query_async(&mut cluster.connection.clone())
                    .await
                    .map_err(|error| self.redis_error(&error))
            }
        }
    }

    async fn query(&self, manager: &ConnectionManager, command: &Cmd) -> Result<Value, TierError> {
        self.count_round_trip();
        command
            .query_async(&mut manager.clone())
            .await
            .map_err(|error| self.redis_error(&error))
    }

    /// One script call, routed by its key on a cluster.
    pub(crate) async fn invoke(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<Value, TierError> {
        self.count_round_trip();
        let answer = match &self.inner.backend {
            Backend::Single(manager) => invocation.invoke_async(&mut manager.clone()).await,
            Backend::Cluster(cluster) => {
                invocation
                    .invoke_async(&mut cluster.connection.clone())
                    .await
            }
        };
        answer.map_err(|error| self.redis_error(&error))
    }

    /// The values of `names`, in order, in one round trip on a single server (`MGET`).
    async fn fetch(&self, names: &[String]) -> Result<Vec<KeyReply>, TierError> {
        match &self.inner.backend {
            Backend::Single(manager) => {
                let mut command = redis::cmd("MGET");
                command.arg(names);
                match self.query(manager, &command).await? {
                    Value::Array(values) if values.len() == names.len() => {
                        Ok(values.into_iter().map(KeyReply::Value).collect())
                    }
                    _ => Err(self.unexpected("MGET")),
                }
            }
            Backend::Cluster(cluster) => self.per_node(cluster, names, BatchCommand::Get).await,
        }
    }

    /// Runs `command` for every name on a cluster with one pipeline per node, all in parallel.
    ///
    /// Keys whose owner our slot map does not know, or of a node whose pipeline failed with
    /// `MOVED`/`ASK`/`TRYAGAIN`/`CLUSTERDOWN` (a resharding or failover in progress), are sent
    /// one by one through the client, which follows redirects; that also starts a refresh of
    /// the slot map. While a slot is being migrated (`ASK`), batches with a key in it pay this
    /// price for that key's node until the migration ends.
    async fn per_node(
        &self,
        cluster: &ClusterBackend,
        names: &[String],
        command: BatchCommand,
    ) -> Result<Vec<KeyReply>, TierError> {
        let map = cluster.slot_map();
        let slots: Vec<u16> = names.iter().map(|name| key_slot(name.as_bytes())).collect();
        let mut by_node: Vec<Vec<usize>> = vec![Vec::new(); map.node_count()];
        let mut one_by_one: Vec<usize> = Vec::new();
        for (index, &slot) in slots.iter().enumerate() {
            match map.owner_of(slot) {
                Some(node) => by_node[usize::from(node)].push(index),
                None => one_by_one.push(index),
            }
        }
        let mut topology_changed = !one_by_one.is_empty();

        let pipelines = by_node
            .into_iter()
            .filter(|indices| !indices.is_empty())
            .map(|indices| {
                let mut pipeline = redis::pipe();
                for &index in &indices {
                    pipeline.add_command(command.for_key(&names[index]));
                }
                // Any slot of the group routes the pipeline to the node that owns them all.
                let route = Route::new(slots[indices[0]], SlotAddr::Master);
                let mut connection = cluster.connection.clone();
                self.count_round_trip();
                async move {
                    let count = indices.len();
                    let answer = connection
                        .route_pipeline(
                            pipeline,
                            0,
                            count,
                            SingleNodeRoutingInfo::SpecificNode(route),
                        )
                        .await;
                    (indices, answer)
                }
            });
        let answers = join_all(pipelines).await;

        let mut replies: Vec<Option<KeyReply>> = names.iter().map(|_| None).collect();
        for (indices, answer) in answers {
            match answer {
                Ok(values) if values.len() == indices.len() => {
                    for (index, value) in indices.into_iter().zip(values) {
                        match value {
                            Value::ServerError(error) if is_redirect(&error) => {
                                one_by_one.push(index);
                                topology_changed = true;
                            }
                            Value::ServerError(error) if error.code() == "WRONGTYPE" => {
                                replies[index] = Some(KeyReply::WrongType);
                            }
                            Value::ServerError(error) => {
                                return Err(self.backend_error(&error.to_string()));
                            }
                            value => replies[index] = Some(KeyReply::Value(value)),
                        }
                    }
                }
                Ok(_) => return Err(self.unexpected("a cluster pipeline")),
                Err(error) if error.is_cluster_error() => {
                    // The client chases a redirect with the whole pipeline, so a pipeline with
                    // one moved key bounces until its retries run out; finish it key by key.
                    one_by_one.extend(indices);
                    topology_changed = true;
                }
                Err(error) => return Err(self.redis_error(&error)),
            }
        }
        if topology_changed {
            self.refresh_slots_in_background();
        }

        let singles = one_by_one.into_iter().map(|index| {
            let single = command.for_key(&names[index]);
            let mut connection = cluster.connection.clone();
            self.count_round_trip();
            async move { (index, single.query_async::<Value>(&mut connection).await) }
        });
        for (index, answer) in join_all(singles).await {
            replies[index] = Some(match answer {
                Ok(value) => KeyReply::Value(value),
                Err(error) if error.code() == Some("WRONGTYPE") => KeyReply::WrongType,
                Err(error) => return Err(self.redis_error(&error)),
            });
        }

        replies
            .into_iter()
            .map(|reply| reply.ok_or_else(|| self.unexpected("a cluster batch")))
            .collect()
    }

    /// Starts one background refresh of the slot map unless one is running.
    fn refresh_slots_in_background(&self) {
        let Backend::Cluster(cluster) = &self.inner.backend else {
            return;
        };
        if cluster.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let tier = self.clone();
        tokio::spawn(async move {
            let Backend::Cluster(cluster) = &tier.inner.backend else {
                return;
            };
            let fetched = tokio::time::timeout(
                tier.inner.connect_timeout,
                fetch_slot_map(&cluster.connection),
            )
            .await;
            match fetched {
                Ok(Ok(map)) => cluster.store_slot_map(map),
                Ok(Err(error)) => tracing::warn!(
                    redis = %tier.inner.target,
                    error = %scrub(error.to_string(), &tier.inner.secrets),
                    "redis cluster slot map refresh failed; moved keys go one by one until a refresh succeeds"
                ),
                Err(_elapsed) => tracing::warn!(
                    redis = %tier.inner.target,
                    "redis cluster slot map refresh timed out; moved keys go one by one until a refresh succeeds"
                ),
            }
            cluster.refreshing.store(false, Ordering::Release);
        });
    }

    /// Decodes one reply of a read; anything that is not an entry we wrote counts as corrupt and
    /// reads as absent, because a bad value must never fail a request.
    fn decode(&self, name: &str, reply: KeyReply) -> Option<TierEntry> {
        let counters = &self.inner.counters;
        let entry = match reply {
            KeyReply::Value(Value::Nil) => {
                Counters::add(&counters.misses, 1);
                return None;
            }
            KeyReply::Value(Value::BulkString(stored)) => codec::decode(&stored),
            KeyReply::Value(_) | KeyReply::WrongType => None,
        };
        match entry {
            Some(entry) => {
                Counters::add(&counters.hits, 1);
                Some(entry)
            }
            None => {
                Counters::add(&counters.misses, 1);
                Counters::add(&counters.corrupt, 1);
                tracing::warn!(key = name, "corrupt shared-tier entry read as absent");
                None
            }
        }
    }

    fn redis_error(&self, error: &RedisError) -> TierError {
        if error.is_timeout() {
            return TierError::Timeout(self.inner.command_timeout);
        }
        self.backend_error(&error.to_string())
    }

    fn backend_error(&self, message: &str) -> TierError {
        TierError::Backend(scrub(message.to_owned(), &self.inner.secrets))
    }

    pub(crate) fn unexpected(&self, what: &str) -> TierError {
        TierError::Backend(format!("redis answered {what} with an unexpected reply"))
    }
}

#[async_trait]
impl SharedTier for RedisTier {
    async fn get_many(&self, keys: &[TierKey]) -> Result<Vec<Option<TierEntry>>, TierError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<String> = keys.iter().map(|&key| self.key_name(key)).collect();
        Counters::add(&self.inner.counters.gets, names.len() as u64);
        let replies = self.bounded(self.fetch(&names)).await?;
        Ok(names
            .iter()
            .zip(replies)
            .map(|(name, reply)| self.decode(name, reply))
            .collect())
    }

    async fn put_fenced(
        &self,
        key: TierKey,
        entry: &TierEntry,
        ttl: Duration,
    ) -> Result<FenceOutcome, TierError> {
        self.fenced_set(key, entry, ttl, false).await
    }

    async fn put_fence(
        &self,
        key: TierKey,
        entry: &TierEntry,
        ttl: Duration,
    ) -> Result<FenceOutcome, TierError> {
        self.fenced_set(key, entry, ttl, true).await
    }

    async fn try_lease(&self, key: TierKey, token: u64, ttl: Duration) -> Result<bool, TierError> {
        let mut command = redis::cmd("SET");
        command
            .arg(self.lease_key_name(key))
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_millis(ttl));
        self.bounded(async {
            match self.query_any(&command).await? {
                Value::Okay => Ok(true),
                Value::SimpleString(status) if status == "OK" => Ok(true),
                Value::Nil => Ok(false),
                _ => Err(self.unexpected("SET NX")),
            }
        })
        .await
    }

    async fn release_lease(&self, key: TierKey, token: u64) -> Result<(), TierError> {
        let name = self.lease_key_name(key);
        let mut invocation = self.inner.scripts.release_lease.prepare_invoke();
        invocation.key(&name).arg(token);
        self.bounded(async {
            match self.invoke(&invocation).await? {
                Value::Int(_) => Ok(()),
                _ => Err(self.unexpected("the lease release")),
            }
        })
        .await
    }

    /// On a single server, one round trip: a pipeline the server runs in order, the lease's
    /// `SET NX` and then the entry's `GET`. On a cluster the two keys live in different slots:
    /// the trait's default, one command after the other.
    async fn lease_and_read(
        &self,
        key: TierKey,
        token: u64,
        ttl: Duration,
    ) -> Result<(bool, Option<TierEntry>), TierError> {
        let Backend::Single(manager) = &self.inner.backend else {
            return rebate_cache::lease_then_read(self, key, token, ttl).await;
        };
        let name = self.key_name(key);
        let mut pipeline = redis::pipe();
        // A key of another type answers GET with an error: a corrupt entry, as in `get_many`.
        pipeline
            .ignore_errors()
            .cmd("SET")
            .arg(self.lease_key_name(key))
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_millis(ttl))
            .cmd("GET")
            .arg(&name);
        Counters::add(&self.inner.counters.gets, 1);
        self.bounded(async {
            self.count_round_trip();
            let replies: Vec<Value> = pipeline
                .query_async(&mut manager.clone())
                .await
                .map_err(|error| self.redis_error(&error))?;
            let [lease, entry] =
                <[Value; 2]>::try_from(replies).map_err(|_| self.unexpected("SET NX + GET"))?;
            let won = match lease {
                Value::Okay => true,
                Value::SimpleString(status) if status == "OK" => true,
                Value::Nil => false,
                _ => return Err(self.unexpected("SET NX")),
            };
            let entry = match entry {
                Value::ServerError(_) => KeyReply::WrongType,
                other => KeyReply::Value(other),
            };
            Ok((won, self.decode(&name, entry)))
        })
        .await
    }

    async fn ping(&self) -> Result<(), TierError> {
        self.bounded(async {
            self.query_any(&redis::cmd("PING")).await?;
            Ok(())
        })
        .await
    }
}

impl fmt::Debug for RedisTier {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.inner.backend {
            Backend::Single(_) => "single",
            Backend::Cluster(_) => "cluster",
        };
        formatter
            .debug_struct("RedisTier")
            .field("target", &self.inner.target)
            .field("mode", &mode)
            .field("prefix", &self.inner.prefix)
            .field("command_timeout", &self.inner.command_timeout)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

async fn connect_single(url: &str, settings: &RedisTierConfig) -> Result<Backend, RedisError> {
    let client = match settings.tls.certificates() {
        Some(certificates) => Client::build_with_tls(url, certificates)?,
        None => Client::open(url)?,
    };
    // Probe with a plain connection first: the manager retries a failed first connection with
    // backoff, which would turn "connection refused" into an unexplained timeout.
    let probe_config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.connect_timeout));
    let mut probe = client
        .get_multiplexed_async_connection_with_config(&probe_config)
        .await?;
    redis::cmd("PING").query_async::<()>(&mut probe).await?;
    drop(probe);

    let manager_config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.command_timeout))
        .set_max_delay(Duration::from_secs(1));
    let manager = ConnectionManager::new_with_config(client, manager_config).await?;
    Ok(Backend::Single(manager))
}

async fn connect_cluster(
    nodes: &[String],
    settings: &RedisTierConfig,
) -> Result<Backend, RedisError> {
    let mut builder = ClusterClientBuilder::new(nodes.iter().map(String::as_str));
    if let Some(certificates) = settings.tls.certificates() {
        builder = builder.certs(certificates);
    }
    let client = builder
        .connection_timeout(settings.connect_timeout)
        .response_timeout(settings.command_timeout)
        // Redirects count as retries; waits stay far below the command timeout.
        .retries(3)
        .min_retry_wait(5)
        .max_retry_wait(50)
        .build()?;
    let connection = client.get_async_connection().await?;
    let map = fetch_slot_map(&connection).await?;
    Ok(Backend::Cluster(ClusterBackend::new(connection, map)))
}

async fn fetch_slot_map(connection: &ClusterConnection) -> Result<SlotMap, RedisError> {
    let mut command = redis::cmd("CLUSTER");
    command.arg("SLOTS");
    let reply = connection
        .clone()
        .route_command(
            command,
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await?;
    SlotMap::from_cluster_slots(&reply).map_err(|reason| {
        RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "bad CLUSTER SLOTS",
            reason,
        ))
    })
}

fn entry_key(prefix: &str, key: TierKey) -> String {
    format!("{prefix}:v1:{}:{}", key.item, key.part.as_str())
}

fn is_redirect(error: &ServerError) -> bool {
    matches!(
        error.kind(),
        Some(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
        )
    )
}

/// A TTL in whole milliseconds for `PX`: at least 1 (Redis refuses `PX 0`) and far below the
/// overflow Redis checks for.
fn ttl_millis(ttl: Duration) -> u64 {
    const FAR_FUTURE_MS: u64 = i64::MAX as u64 / 4;
    u64::try_from(ttl.as_millis())
        .unwrap_or(FAR_FUTURE_MS)
        .clamp(1, FAR_FUTURE_MS)
}

fn describe_target(target: &RedisTarget) -> String {
    match target {
        RedisTarget::Single(url) => redact_url(url),
        RedisTarget::Cluster(nodes) => {
            let nodes: Vec<String> = nodes.iter().map(|url| redact_url(url)).collect();
            format!("cluster [{}]", nodes.join(", "))
        }
    }
}

fn collect_secrets(target: &RedisTarget) -> Vec<String> {
    let urls: Vec<&str> = match target {
        RedisTarget::Single(url) => vec![url.as_str()],
        RedisTarget::Cluster(nodes) => nodes.iter().map(String::as_str).collect(),
    };
    let mut secrets = Vec::new();
    for url in urls {
        secrets.extend(url_passwords(url).into_iter().map(str::to_owned));
        let decoded = url
            .into_connection_info()
            .ok()
            .and_then(|info| info.redis_settings().password().map(str::to_owned));
        secrets.extend(decoded);
    }
    secrets.retain(|secret| !secret.is_empty());
    secrets.sort();
    secrets.dedup();
    secrets
}

/// `message` with every known password replaced by `***`.
fn scrub(mut message: String, secrets: &[String]) -> String {
    for secret in secrets {
        if message.contains(secret.as_str()) {
            message = message.replace(secret.as_str(), "***");
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebate_domain::{ItemKey, PartKind};

    #[test]
    fn key_scheme_matches_the_issue() {
        let key = TierKey {
            item: ItemKey::parse("taobao", "100001").unwrap(),
            part: PartKind::Coupons,
        };
        assert_eq!(entry_key("rebate", key), "rebate:v1:taobao:100001:coupons");
        let key = TierKey {
            item: ItemKey::parse("jd", "007").unwrap(),
            part: PartKind::Rate,
        };
        assert_eq!(entry_key("staging", key), "staging:v1:jd:007:rate");
    }

    #[test]
    fn ttl_is_at_least_one_millisecond() {
        assert_eq!(ttl_millis(Duration::ZERO), 1);
        assert_eq!(ttl_millis(Duration::from_micros(999)), 1);
        assert_eq!(ttl_millis(Duration::from_millis(1500)), 1500);
        assert!(ttl_millis(Duration::MAX) < i64::MAX as u64);
    }

    #[test]
    fn secrets_are_collected_and_scrubbed() {
        let target = RedisTarget::Cluster(vec![
            "redis://:p%40ss@a:1".to_owned(),
            "redis://user:hunter2@b:2".to_owned(),
        ]);
        let secrets = collect_secrets(&target);
        assert!(secrets.contains(&"p%40ss".to_owned()), "{secrets:?}");
        assert!(secrets.contains(&"p@ss".to_owned()), "{secrets:?}");
        assert!(secrets.contains(&"hunter2".to_owned()), "{secrets:?}");
        let message = scrub("auth failed for hunter2 and p@ss".to_owned(), &secrets);
        assert_eq!(message, "auth failed for *** and ***");
        assert!(!describe_target(&target).contains("hunter2"));
    }
}
