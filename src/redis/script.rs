//! The Lua scripts that run on the Redis server: each is one round trip,
//! atomic, and reads the server's clock (`TIME`), so that no client clock
//! ever dates a lease.

use std::sync::LazyLock;

/// Takes a lease if fewer than the limit are held, and if no replica
/// with fewer leases for its weight is waiting for the place.
///
/// `KEYS[1]`: the sorted set of leases (member: a token, whose first 16
/// characters are its replica's id; score: the lease's deadline in
/// milliseconds of the server's clock). `KEYS[2]`: a hash, replica to the
/// leases it holds. `KEYS[3]`: the replicas waiting, a sorted set, replica
/// to when it was first refused since its last grant. `KEYS[4]`: a hash,
/// replica to until when it counts as waiting (its last refusal and the
/// window it asked for), and `replica:w` to its weight. `ARGV`: the limit,
/// the lease in milliseconds, the replica's id, its weight, how long after
/// a refusal it counts as waiting (milliseconds), the token, then the
/// tokens of leases this replica is giving back.
///
/// Removes the leases given back first (so that a caller's next call does not
/// find its own last lease still held), then, if the limit is reached,
/// the expired ones (they are reclaimed slots, and counted), then admits or
/// refuses. A free place is kept for each waiting replica ahead of this one
/// (fewer leases for its weight, or as few and waiting since earlier): this
/// one is admitted only if more places are free than replicas ahead of it,
/// so places go first to the replicas furthest under their share, and to
/// anyone once no such replica is asking. Replies
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
local id = ARGV[3]
local weight = tonumber(ARGV[4])
local asking = tonumber(ARGV[5])
-- A lease gone: one fewer for its replica (the first 16 characters).
local function gone(token)
    local owner = string.sub(token, 1, 16)
    if redis.call('HINCRBY', KEYS[2], owner, -1) <= 0 then
        redis.call('HDEL', KEYS[2], owner)
    end
end
local released = {}
for i = 7, #ARGV do
    released[i - 6] = redis.call('ZREM', KEYS[1], ARGV[i])
    if released[i - 6] == 1 then
        gone(ARGV[i])
    end
end
local held = redis.call('ZCARD', KEYS[1])
if held == 0 then
    -- No lease (or the set deleted): no replica holds any.
    redis.call('DEL', KEYS[2])
end
local reclaimed = 0
if held >= limit then
    -- Full, counting leases that have run out: those are dropped (only
    -- then: below the limit they block nobody).
    local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
    for _, token in ipairs(expired) do
        gone(token)
    end
    reclaimed = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    held = held - reclaimed
end
local free = limit - held
local ahead = 0
local waiters = 0
if free > 0 then
    waiters = redis.call('ZCARD', KEYS[3])
end
if waiters > 0 then
    -- The replicas waiting ahead of this one, each keeping a place free.
    local mine = tonumber(redis.call('HGET', KEYS[2], id) or '0')
    local since = tonumber(redis.call('ZSCORE', KEYS[3], id) or (now + 1))
    local waiting = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
    -- Three commands for all of them: their windows and weights, and
    -- their leases.
    local ids, fields = {}, {}
    for i = 1, #waiting, 2 do
        ids[#ids + 1] = waiting[i]
        fields[#fields + 1] = waiting[i]
        fields[#fields + 1] = waiting[i] .. ':w'
    end
    local seen = redis.call('HMGET', KEYS[4], unpack(fields))
    local holds = redis.call('HMGET', KEYS[2], unpack(ids))
    for j, other in ipairs(ids) do
        local i = 2 * j - 1
        if other ~= id then
            local until_ = seen[i]
            if not until_ or tonumber(until_) < now then
                -- Refused long ago: no longer asking.
                redis.call('ZREM', KEYS[3], other)
                redis.call('HDEL', KEYS[4], other, other .. ':w')
            else
                local theirs = tonumber(holds[j] or '0')
                local a = theirs * weight
                local b = mine * tonumber(seen[i + 1] or '1')
                local their_since = tonumber(waiting[i + 1])
                if a < b or (a == b and (their_since < since or (their_since == since and other < id))) then
                    ahead = ahead + 1
                end
            end
        end
    end
end
if free > ahead then
    redis.call('ZADD', KEYS[1], string.format('%d', from + lease), ARGV[6])
    redis.call('HINCRBY', KEYS[2], id, 1)
    if waiters > 0 then
        redis.call('ZREM', KEYS[3], id)
    end
    -- The keys outlive the latest lease by a lease, then go; never
    -- sooner than another replica's (maybe longer) lease asked for.
    for k = 1, 2 do
        if redis.call('PTTL', KEYS[k]) < 2 * lease then
            redis.call('PEXPIRE', KEYS[k], 2 * lease)
        end
    end
    return {1, held + 1, reclaimed, 0, released}
end
redis.call('ZADD', KEYS[3], 'NX', now, id)
redis.call('HSET', KEYS[4], id, now + asking, id .. ':w', weight)
for k = 3, 4 do
    if redis.call('PTTL', KEYS[k]) < 2 * lease then
        redis.call('PEXPIRE', KEYS[k], 2 * lease)
    end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local hint = 0
if first[2] then
    hint = math.max(tonumber(first[2]) - now, 0)
end
return {0, held, reclaimed, hint, released}
",
    )
});

/// Moves the deadline of each live lease to a lease from now; a lease that
/// has run out or is gone (reclaimed, or the set deleted) is left as it is,
/// never brought back.
///
/// `KEYS[1]`: the sorted set; `KEYS[2]`: the leases held by replica, kept
/// as long. `ARGV[1]`: the lease in milliseconds; the rest: the tokens.
/// Replies how many were renewed.
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
if renewed > 0 then
    for k = 1, 2 do
        if redis.call('PTTL', KEYS[k]) < 2 * lease then
            redis.call('PEXPIRE', KEYS[k], 2 * lease)
        end
    end
end
return renewed
",
    )
});

/// Removes the leases given back. `KEYS[1]`: the sorted set; `KEYS[2]`: the
/// leases held by replica; `ARGV`: their tokens. Replies a 1 or a 0 for
/// each: found and removed, or gone already (run out and reclaimed, or
/// removed by an earlier command).
pub(super) static RELEASE: LazyLock<::redis::Script> = LazyLock::new(|| {
    ::redis::Script::new(
        r"
local removed = {}
for i = 1, #ARGV do
    removed[i] = redis.call('ZREM', KEYS[1], ARGV[i])
    if removed[i] == 1 then
        local owner = string.sub(ARGV[i], 1, 16)
        if redis.call('HINCRBY', KEYS[2], owner, -1) <= 0 then
            redis.call('HDEL', KEYS[2], owner)
        end
    end
end
return removed
",
    )
});
