//! The server-side scripts. Each touches exactly one key, so each runs on the node that owns
//! that key in Redis Cluster and stays atomic there. The fleet's scripts read the server's
//! clock (`TIME`; Redis 5 and later replicate a script's effects, not the script).

use redis::Script;

/// Version-fenced `SET`.
///
/// `KEYS[1]` the entry key; `ARGV[1]` the new version (canonical decimal); `ARGV[2]` the value
/// to store (`{version}:{bytes}`); `ARGV[3]` the TTL in milliseconds; `ARGV[4]` `1` to keep an
/// entry at the same version too (an invalidation fence), absent or `0` to replace it.
///
/// Returns the stored version (a string) when it is newer (or equal, with `ARGV[4]` = `1`) and
/// nothing was written, else `1`.
///
/// Versions are compared as canonical decimal strings (longer is larger, then byte order)
/// because Lua numbers are doubles and would round versions above 2^53. A stored value whose
/// prefix is not a canonical version is corrupt and simply overwritten; so is a key of another
/// type (`redis.pcall` turns WRONGTYPE into a table instead of aborting the script).
const FENCED_SET: &str = r#"
local stored = redis.pcall('GET', KEYS[1])
if type(stored) == 'string' then
  local current = string.match(string.sub(stored, 1, 21), '^(%d+):')
  if current and (#current == 1 or string.byte(current, 1) ~= 48) then
    local incoming = ARGV[1]
    if #current > #incoming or (#current == #incoming and current > incoming)
       or (ARGV[4] == '1' and current == incoming) then
      return current
    end
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"#;

/// Compare-and-delete of a lease: `KEYS[1]` the lease key, `ARGV[1]` the holder's token.
/// Returns the number of keys deleted (0 when someone else holds it or it expired).
const RELEASE_LEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// Takes up to `ARGV[3]` tokens from a fleet-wide token bucket, the same GCRA as the service's
/// local `TokenBucket`: `KEYS[1]` holds the bucket's theoretical arrival time (microseconds on
/// the server's clock, so instances need no synchronised clocks); `ARGV[1]` is the interval
/// between tokens and `ARGV[2]` the tolerance (interval × burst), both in microseconds.
///
/// Returns `{granted, retry_after_us}`: tokens are granted one by one while the next stays
/// within the tolerance; `retry_after_us` is how long until the next one would be (0 when all
/// were granted). The key expires once the bucket would be full again. One script, one key: the
/// grant is atomic on the node that owns the bucket.
const TAKE_TOKENS: &str = r#"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if tat < now then tat = now end
local granted = 0
while granted < want and tat + interval - now <= tolerance do
  tat = tat + interval
  granted = granted + 1
end
local retry_after = 0
if granted < want then retry_after = tat + interval - now - tolerance end
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
return {granted, math.ceil(retry_after)}
"#;

/// The instance registry: `KEYS[1]` a sorted set of instance names scored by their last
/// heartbeat (milliseconds on the server's clock). Records `ARGV[1]`, drops names not heard of
/// for `ARGV[2]` milliseconds, and returns how many remain (this instance included) and this
/// instance's place among their names in byte order (from 0): its turns in a share.
const HEARTBEAT: &str = r#"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local expire_after = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - expire_after)
redis.call('PEXPIRE', KEYS[1], expire_after)
local names = redis.call('ZRANGE', KEYS[1], 0, -1)
local rank = 0
for _, name in ipairs(names) do
  if name < ARGV[1] then rank = rank + 1 end
end
return {#names, rank}
"#;

/// Replaces one instance's hot keys in the fleet's view: `KEYS[1]` the instance's sorted set
/// (member: a key, score: its count), `KEYS[2]` the sorted set of instance sets scored by when
/// they last published (both under one hash tag, so one cluster node holds them). `ARGV[1]` is
/// how long a list counts without being renewed, in milliseconds; then member, count pairs.
const PUBLISH_HOT_KEYS: &str = r#"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local ttl = tonumber(ARGV[1])
redis.call('DEL', KEYS[1])
for index = 2, #ARGV, 2 do
  redis.call('ZADD', KEYS[1], ARGV[index + 1], ARGV[index])
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], now, KEYS[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
"#;

/// Change capture's lease (`capture`), all its keys under one hash tag. Takes the lease when
/// nobody holds it: `KEYS[1]` the lease, `KEYS[2]` the fencing counter; `ARGV[1]` the instance, `ARGV[2]` the lease's life in milliseconds. Returns `{token, ''}`
/// when taken, `{0, holder}` when someone holds it.
const CAPTURE_TAKE: &str = r#"
local holder = redis.call('GET', KEYS[1])
if holder then return {0, holder} end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. '|' .. ARGV[1], 'PX', ARGV[2])
return {token, ''}
"#;

/// Extends the lease if `ARGV[1]` (`token|instance`) still holds it, by `ARGV[2]` ms. Returns
/// 1 when extended, 0 when lost.
const CAPTURE_RENEW: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"#;

/// Writes `ARGV[2]` to `KEYS[2]` (no expiry) if `ARGV[1]` still holds the lease `KEYS[1]`.
/// Returns 1 when written, 0 when the lease is someone else's or gone.
const CAPTURE_WRITE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2])
  return 1
end
return 0
"#;

/// Gives the lease up if `ARGV[1]` still holds it.
const CAPTURE_RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// The scripts with their SHA1 computed once; `invoke_async` sends `EVALSHA` and falls back to
/// loading the script when a server answers `NOSCRIPT` (after a restart or on a new node).
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) fenced_set: Script,
    pub(crate) release_lease: Script,
    pub(crate) take_tokens: Script,
    pub(crate) heartbeat: Script,
    pub(crate) publish_hot_keys: Script,
    pub(crate) capture_take: Script,
    pub(crate) capture_renew: Script,
    pub(crate) capture_write: Script,
    pub(crate) capture_release: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            fenced_set: Script::new(FENCED_SET),
            release_lease: Script::new(RELEASE_LEASE),
            take_tokens: Script::new(TAKE_TOKENS),
            heartbeat: Script::new(HEARTBEAT),
            publish_hot_keys: Script::new(PUBLISH_HOT_KEYS),
            capture_take: Script::new(CAPTURE_TAKE),
            capture_renew: Script::new(CAPTURE_RENEW),
            capture_write: Script::new(CAPTURE_WRITE),
            capture_release: Script::new(CAPTURE_RELEASE),
        }
    }
}
