//! Fleet-wide warm jobs on a Redis stream: a job's keys are split into chunks, each chunk one
//! entry of `{<prefix>:warm}:jobs`, read by every instance through one consumer group
//! ([`WARM_GROUP`]), and a job's counters live in the hash `{<prefix>:warm}:job:<id>`.
//!
//! Contract: every operation is one script call under the command timeout (no `BLOCK`: a
//! blocking read on the tier's one multiplexed connection would stall every L2 read queued
//! behind it, so consumers poll instead). The stream and the job hashes share one hash tag, so
//! each script touches one cluster node. A chunk is counted in its job's hash only by the
//! consumer whose `XACK` removed it from the pending list, in the same script: a chunk processed
//! twice (its first consumer slow, the entry claimed by another) is counted once. An acknowledged
//! entry is deleted, so the stream holds only chunks not yet done, and a job is refused when it
//! would take the stream past its bound.

use std::sync::LazyLock;
use std::time::Duration;

use rebate_cache::TierError;
use redis::{Script, Value};

use crate::tier::RedisTier;

/// The consumer group every instance reads warm chunks through.
pub const WARM_GROUP: &str = "warmers";

/// A chunk handed to this consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmChunk {
    /// The stream entry's id, to acknowledge or keep alive.
    pub entry_id: String,
    pub job: String,
    /// The chunk's index within its job (0-based).
    pub index: u32,
    /// The keys, `platform:item_id` separated by spaces, as submitted.
    pub keys: String,
    /// How many times the entry has been delivered, this delivery included.
    pub deliveries: u32,
}

/// What loading one chunk's keys came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WarmTally {
    pub loaded: u32,
    pub not_found: u32,
    pub failed: u32,
}

/// A job's counters as the fleet recorded them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WarmJobCounts {
    pub total_chunks: u64,
    pub total_keys: u64,
    /// Chunks on the stream so far (below `total_chunks` while the submission runs, or when it
    /// failed part way).
    pub queued_chunks: u64,
    pub done_chunks: u64,
    pub loaded: u64,
    pub not_found: u64,
    pub failed: u64,
    /// The submission failed part way: the chunks not queued will never run.
    pub incomplete: bool,
    /// When the job was created, ms since the Unix epoch on Redis's clock.
    pub created_ms: u64,
}

/// Creates a job's hash unless the stream would outgrow its bound: `KEYS[1]` the stream,
/// `KEYS[2]` the job's hash; `ARGV[1]` total chunks, `ARGV[2]` total keys, `ARGV[3]` the most
/// entries the stream may hold, `ARGV[4]` the hash's TTL in ms. Returns `{1, length}` when
/// created, `{0, length}` when refused (`length`: the stream's entries before this job).
const CREATE_JOB: &str = r#"
local length = redis.call('XLEN', KEYS[1])
if length + tonumber(ARGV[1]) > tonumber(ARGV[3]) then
  return {0, length}
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('HSET', KEYS[2], 'total_chunks', ARGV[1], 'total_keys', ARGV[2], 'queued_chunks', 0,
  'done_chunks', 0, 'loaded', 0, 'not_found', 0, 'failed', 0, 'created_ms', now)
redis.call('PEXPIRE', KEYS[2], ARGV[4])
pcall(redis.call, 'XGROUP', 'CREATE', KEYS[1], ARGV[5], '0', 'MKSTREAM')
return {1, length}
"#;

/// Appends chunks of a job: `KEYS[1]` the stream, `KEYS[2]` the job's hash; `ARGV[1]` the job
/// id, `ARGV[2]` the first chunk's index, then one payload per chunk. Returns how many were
/// queued.
const QUEUE_CHUNKS: &str = r#"
local first = tonumber(ARGV[2])
for index = 3, #ARGV do
  redis.call('XADD', KEYS[1], '*', 'job', ARGV[1], 'chunk', first + index - 3, 'keys', ARGV[index])
end
redis.call('HINCRBY', KEYS[2], 'queued_chunks', #ARGV - 2)
return #ARGV - 2
"#;

/// The next undelivered chunk for consumer `ARGV[2]` of group `ARGV[1]` on stream `KEYS[1]`,
/// creating the group when it is missing (a stream deleted or never written). Returns
/// `{id, job, chunk, keys, 1}` or false.
const READ_CHUNK: &str = r#"
local function read()
  return redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS', KEYS[1], '>')
end
local reply = read()
if type(reply) == 'table' and reply.err then
  if string.find(reply.err, 'NOGROUP') then
    redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
    reply = read()
  end
  if type(reply) == 'table' and reply.err then return redis.error_reply(reply.err) end
end
if not reply then return false end
local entry = reply[1][2][1]
if not entry then return false end
local fields = {}
for index = 1, #entry[2], 2 do fields[entry[2][index]] = entry[2][index + 1] end
return {entry[1], fields['job'] or '', fields['chunk'] or '0', fields['keys'] or '', 1}
"#;

/// Claims for consumer `ARGV[2]` one chunk pending in group `ARGV[1]` for at least `ARGV[3]` ms
/// (its consumer died or stalled), scanning the pending list from the start at most 64 steps.
/// First forgets the other consumers that hold nothing and were last seen at least `ARGV[4]` ms
/// ago (every start names a new consumer, so the group's list would otherwise only grow; "at
/// least", so that 0 forgets one seen in this very millisecond too).
/// Returns `{id, job, chunk, keys, deliveries}` or false.
const CLAIM_CHUNK: &str = r#"
local listed, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if listed then
  for _, consumer in ipairs(consumers) do
    local fields = {}
    for index = 1, #consumer, 2 do fields[consumer[index]] = consumer[index + 1] end
    if fields['pending'] == 0 and fields['idle'] >= tonumber(ARGV[4]) and fields['name'] ~= ARGV[2] then
      redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], fields['name'])
    end
  end
end
local cursor = '0-0'
for step = 1, 64 do
  local ok, reply = pcall(redis.call, 'XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], cursor, 'COUNT', 1)
  if not ok then return false end
  local entry = reply[2][1]
  if entry then
    local fields = {}
    for index = 1, #entry[2], 2 do fields[entry[2][index]] = entry[2][index + 1] end
    local pending = redis.call('XPENDING', KEYS[1], ARGV[1], entry[1], entry[1], 1)
    local deliveries = 1
    if pending[1] then deliveries = pending[1][4] end
    return {entry[1], fields['job'] or '', fields['chunk'] or '0', fields['keys'] or '', deliveries}
  end
  cursor = reply[1]
  if cursor == '0-0' then return false end
end
return false
"#;

/// Resets the idle time of entry `ARGV[3]` if consumer `ARGV[2]` still owns it in group
/// `ARGV[1]`, so that a chunk being worked on slowly is not claimed from a live consumer.
/// Returns 1 when still owned, 0 when another consumer claimed it (or it is done).
const TOUCH_CHUNK: &str = r#"
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if pending[1] and pending[1][2] == ARGV[2] then
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
  return 1
end
return 0
"#;

/// Acknowledges entry `ARGV[2]` of group `ARGV[1]` on stream `KEYS[1]`, and only when this
/// acknowledgement removed it from the pending list, deletes it and adds its tally
/// (`ARGV[3..5]`: loaded, not found, failed) to the job's hash `KEYS[2]` (when it has not
/// expired), renewing the hash's TTL (`ARGV[6]` ms). Returns 1 when counted, else 0.
const COMPLETE_CHUNK: &str = r#"
local acked = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if acked ~= 1 then return 0 end
redis.call('XDEL', KEYS[1], ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HINCRBY', KEYS[2], 'done_chunks', 1)
  redis.call('HINCRBY', KEYS[2], 'loaded', ARGV[3])
  redis.call('HINCRBY', KEYS[2], 'not_found', ARGV[4])
  redis.call('HINCRBY', KEYS[2], 'failed', ARGV[5])
  redis.call('PEXPIRE', KEYS[2], ARGV[6])
end
return 1
"#;

static SCRIPTS: LazyLock<[Script; 6]> = LazyLock::new(|| {
    [
        Script::new(CREATE_JOB),
        Script::new(QUEUE_CHUNKS),
        Script::new(READ_CHUNK),
        Script::new(CLAIM_CHUNK),
        Script::new(TOUCH_CHUNK),
        Script::new(COMPLETE_CHUNK),
    ]
});

const CREATE: usize = 0;
const QUEUE: usize = 1;
const READ: usize = 2;
const CLAIM: usize = 3;
const TOUCH: usize = 4;
const COMPLETE: usize = 5;

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX / 4)
        .max(1)
}

impl RedisTier {
    /// `{<prefix>:warm}:jobs`, the stream of chunks.
    pub fn warm_stream_key(&self) -> String {
        format!("{{{}:warm}}:jobs", self.prefix())
    }

    /// `{<prefix>:warm}:job:<id>`, a job's counters.
    pub fn warm_job_key(&self, job: &str) -> String {
        format!("{{{}:warm}}:job:{job}", self.prefix())
    }

    /// Creates job `job`'s counters, unless the stream would then hold more than `max_entries`
    /// chunks: `Ok(Err(length))` says how many it holds.
    pub async fn warm_create_job(
        &self,
        job: &str,
        total_chunks: u64,
        total_keys: u64,
        max_entries: u64,
        ttl: Duration,
    ) -> Result<Result<(), u64>, TierError> {
        let mut invocation = SCRIPTS[CREATE].prepare_invoke();
        invocation
            .key(self.warm_stream_key())
            .key(self.warm_job_key(job))
            .arg(total_chunks)
            .arg(total_keys)
            .arg(max_entries)
            .arg(millis(ttl))
            .arg(WARM_GROUP);
        self.bounded(async {
            match self.invoke(&invocation).await? {
                Value::Array(reply) => match reply.as_slice() {
                    [Value::Int(1), Value::Int(_)] => Ok(Ok(())),
                    [Value::Int(0), Value::Int(length)] => {
                        Ok(Err(u64::try_from(*length).unwrap_or(0)))
                    }
                    _ => Err(self.unexpected("the warm job's creation")),
                },
                _ => Err(self.unexpected("the warm job's creation")),
            }
        })
        .await
    }

    /// Appends `payloads` (chunks `first`, `first + 1`, …) of job `job` to the stream.
    pub async fn warm_queue_chunks(
        &self,
        job: &str,
        first: u32,
        payloads: &[String],
    ) -> Result<(), TierError> {
        let mut invocation = SCRIPTS[QUEUE].prepare_invoke();
        invocation
            .key(self.warm_stream_key())
            .key(self.warm_job_key(job))
            .arg(job)
            .arg(first);
        for payload in payloads {
            invocation.arg(payload);
        }
        self.bounded(async {
            match self.invoke(&invocation).await? {
                Value::Int(queued) if usize::try_from(queued).ok() == Some(payloads.len()) => {
                    Ok(())
                }
                _ => Err(self.unexpected("the warm chunks' queueing")),
            }
        })
        .await
    }

    /// Marks job `job` as incomplete: its submission failed part way.
    pub async fn warm_mark_incomplete(&self, job: &str) -> Result<(), TierError> {
        let mut command = redis::cmd("HSET");
        command.arg(self.warm_job_key(job)).arg("incomplete").arg(1);
        self.bounded(async {
            self.query_any(&command).await?;
            Ok(())
        })
        .await
    }

    /// The next chunk nobody has been given yet, for `consumer`; `None` when the stream is
    /// drained.
    pub async fn warm_next_chunk(&self, consumer: &str) -> Result<Option<WarmChunk>, TierError> {
        let mut invocation = SCRIPTS[READ].prepare_invoke();
        invocation
            .key(self.warm_stream_key())
            .arg(WARM_GROUP)
            .arg(consumer);
        self.bounded(async {
            let reply = self.invoke(&invocation).await?;
            self.chunk_reply(reply)
        })
        .await
    }

    /// A chunk another consumer took and has not touched for `min_idle`, now `consumer`'s;
    /// consumers holding nothing and unseen for `forget_after` are dropped from the group first.
    pub async fn warm_claim_chunk(
        &self,
        consumer: &str,
        min_idle: Duration,
        forget_after: Duration,
    ) -> Result<Option<WarmChunk>, TierError> {
        let mut invocation = SCRIPTS[CLAIM].prepare_invoke();
        invocation
            .key(self.warm_stream_key())
            .arg(WARM_GROUP)
            .arg(consumer)
            // 0 is valid for both: any pending entry may be claimed, any idle consumer forgotten.
            .arg(u64::try_from(min_idle.as_millis()).unwrap_or(u64::MAX / 4))
            .arg(u64::try_from(forget_after.as_millis()).unwrap_or(u64::MAX / 4));
        self.bounded(async {
            let reply = self.invoke(&invocation).await?;
            self.chunk_reply(reply)
        })
        .await
    }

    /// Keeps `entry_id` from being claimed while `consumer` works on it; `false` when another
    /// consumer has claimed it meanwhile (its acknowledgement, not ours, will count).
    pub async fn warm_touch_chunk(
        &self,
        consumer: &str,
        entry_id: &str,
    ) -> Result<bool, TierError> {
        let mut invocation = SCRIPTS[TOUCH].prepare_invoke();
        invocation
            .key(self.warm_stream_key())
            .arg(WARM_GROUP)
            .arg(consumer)
            .arg(entry_id);
        self.bounded(async {
            match self.invoke(&invocation).await? {
                Value::Int(owned) => Ok(owned == 1),
                _ => Err(self.unexpected("the warm chunk's touch")),
            }
        })
        .await
    }

    /// Acknowledges a chunk and adds its tally to its job; `false` when it had already been
    /// acknowledged (by a consumer that claimed it), and nothing was counted.
    pub async fn warm_complete_chunk(
        &self,
        chunk: &WarmChunk,
        tally: WarmTally,
        ttl: Duration,
    ) -> Result<bool, TierError> {
        let mut invocation = SCRIPTS[COMPLETE].prepare_invoke();
        invocation
            .key(self.warm_stream_key())
            .key(self.warm_job_key(&chunk.job))
            .arg(WARM_GROUP)
            .arg(&chunk.entry_id)
            .arg(tally.loaded)
            .arg(tally.not_found)
            .arg(tally.failed)
            .arg(millis(ttl));
        self.bounded(async {
            match self.invoke(&invocation).await? {
                Value::Int(counted) => Ok(counted == 1),
                _ => Err(self.unexpected("the warm chunk's acknowledgement")),
            }
        })
        .await
    }

    /// Job `job`'s counters; `None` when there is no such job (or it expired).
    pub async fn warm_job_counts(&self, job: &str) -> Result<Option<WarmJobCounts>, TierError> {
        let mut command = redis::cmd("HGETALL");
        command.arg(self.warm_job_key(job));
        self.bounded(async {
            let fields = match self.query_any(&command).await? {
                Value::Array(values) => pairs(values),
                Value::Map(entries) => Some(
                    entries
                        .into_iter()
                        .filter_map(|(field, value)| Some((text(&field)?, text(&value)?)))
                        .collect(),
                ),
                _ => None,
            }
            .ok_or_else(|| self.unexpected("HGETALL of a warm job"))?;
            if fields.is_empty() {
                return Ok(None);
            }
            let mut counts = WarmJobCounts::default();
            for (field, value) in fields {
                let number = value.parse::<u64>().unwrap_or(0);
                match field.as_str() {
                    "total_chunks" => counts.total_chunks = number,
                    "total_keys" => counts.total_keys = number,
                    "queued_chunks" => counts.queued_chunks = number,
                    "done_chunks" => counts.done_chunks = number,
                    "loaded" => counts.loaded = number,
                    "not_found" => counts.not_found = number,
                    "failed" => counts.failed = number,
                    "incomplete" => counts.incomplete = number == 1,
                    "created_ms" => counts.created_ms = number,
                    _ => {}
                }
            }
            Ok(Some(counts))
        })
        .await
    }

    fn chunk_reply(&self, reply: Value) -> Result<Option<WarmChunk>, TierError> {
        match reply {
            Value::Nil => Ok(None),
            Value::Array(fields) => match fields.as_slice() {
                [id, job, index, keys, deliveries] => {
                    let chunk = (|| {
                        Some(WarmChunk {
                            entry_id: text(id)?,
                            job: text(job)?,
                            index: text(index)?.parse().ok()?,
                            keys: text(keys)?,
                            deliveries: match deliveries {
                                Value::Int(count) => u32::try_from(*count).ok()?,
                                other => text(other)?.parse().ok()?,
                            },
                        })
                    })();
                    chunk
                        .map(Some)
                        .ok_or_else(|| self.unexpected("a warm chunk"))
                }
                _ => Err(self.unexpected("a warm chunk")),
            },
            _ => Err(self.unexpected("a warm chunk")),
        }
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        Value::Int(number) => Some(number.to_string()),
        _ => None,
    }
}

fn pairs(values: Vec<Value>) -> Option<Vec<(String, String)>> {
    if !values.len().is_multiple_of(2) {
        return None;
    }
    values
        .chunks(2)
        .map(|pair| Some((text(&pair[0])?, text(&pair[1])?)))
        .collect()
}
