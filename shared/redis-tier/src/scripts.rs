//! The server-side scripts. Each touches exactly one key, so each runs on the node that owns
//! that key in Redis Cluster and stays atomic there.

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

/// The scripts with their SHA1 computed once; `invoke_async` sends `EVALSHA` and falls back to
/// loading the script when a server answers `NOSCRIPT` (after a restart or on a new node).
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) fenced_set: Script,
    pub(crate) release_lease: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            fenced_set: Script::new(FENCED_SET),
            release_lease: Script::new(RELEASE_LEASE),
        }
    }
}
