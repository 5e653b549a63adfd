//! The Lua scripts that run on the Redis server: each is one round trip,
//! atomic, and reads the server's clock (`TIME`), so that no client clock
//! ever dates a lease.

use std::sync::LazyLock;

/// Takes a lease if fewer than the limit are held.
///
/// `KEYS[1]`: the sorted set of leases (member: a token, score: the lease's
/// deadline in milliseconds of the server's clock). `ARGV`: the limit, the
/// lease in milliseconds, the token, then the tokens of leases this replica
/// is giving back.
///
/// Removes the leases given back first (so that a caller's next call does not
/// find its own last lease still held), then, if the limit is reached,
/// the expired ones (they are reclaimed slots, and counted), then admits or
/// refuses. Replies
/// `{admitted, held, reclaimed, hint, released}`: `held` counts the leases
/// after the decision, `hint` is how long until the earliest lease held
/// runs out (0 when admitted), `released` a 1 or a 0 for each lease given
/// back: found and removed, or gone already.
///
/// `TIME` is read once, before any write: since Redis 5 a script is
/// replicated by its effects, so reading the clock is allowed, and up to
/// 7.0 the clock still moves while a script runs.
pub(super) static ACQUIRE: LazyLock<::redis::Script> = LazyLock::new(|| {
    ::redis::Script::new(
        r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- A deadline counts from the millisecond after now: rounded down, a lease
-- could end up to a millisecond before it was asked to.
local from = tonumber(time[1]) * 1000 + math.ceil(tonumber(time[2]) / 1000)
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local released = {}
for i = 4, #ARGV do
    released[i - 3] = redis.call('ZREM', KEYS[1], ARGV[i])
end
local held = redis.call('ZCARD', KEYS[1])
local reclaimed = 0
if held >= limit then
    -- Full, counting leases that have run out: those are dropped (only
    -- then: below the limit they block nobody).
    reclaimed = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    held = held - reclaimed
end
if held < limit then
    redis.call('ZADD', KEYS[1], string.format('%d', from + lease), ARGV[3])
    -- The key outlives its latest lease by a lease, then goes; never
    -- sooner than another replica's (maybe longer) lease asked for.
    if redis.call('PTTL', KEYS[1]) < 2 * lease then
        redis.call('PEXPIRE', KEYS[1], 2 * lease)
    end
    return {1, held + 1, reclaimed, 0, released}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, held, reclaimed, math.max(tonumber(first[2]) - now, 0), released}
",
    )
});

/// Moves the deadline of each live lease to a lease from now; a lease that
/// has run out or is gone (reclaimed, or the set deleted) is left as it is,
/// never brought back.
///
/// `KEYS[1]`: the sorted set. `ARGV[1]`: the lease in milliseconds; the
/// rest: the tokens. Replies how many were renewed.
pub(super) static RENEW: LazyLock<::redis::Script> = LazyLock::new(|| {
    ::redis::Script::new(
        r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local from = tonumber(time[1]) * 1000 + math.ceil(tonumber(time[2]) / 1000)
local lease = tonumber(ARGV[1])
local deadline = string.format('%d', from + lease)
local renewed = 0
for i = 2, #ARGV do
    local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
    if score and tonumber(score) > now then
        redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[i])
        renewed = renewed + 1
    end
end
if renewed > 0 and redis.call('PTTL', KEYS[1]) < 2 * lease then
    redis.call('PEXPIRE', KEYS[1], 2 * lease)
end
return renewed
",
    )
});

/// Removes the leases given back. `KEYS[1]`: the sorted set; `ARGV`: their
/// tokens. Replies a 1 or a 0 for each: found and removed, or gone already
/// (run out and reclaimed, or removed by an earlier command).
pub(super) static RELEASE: LazyLock<::redis::Script> = LazyLock::new(|| {
    ::redis::Script::new(
        r"
local removed = {}
for i = 1, #ARGV do
    removed[i] = redis.call('ZREM', KEYS[1], ARGV[i])
end
return removed
",
    )
});
