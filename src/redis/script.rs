//! The Lua scripts that run on the Redis server: each is one round trip,
//! atomic, and reads the server's clock (`TIME`), so that no client clock
//! ever dates a lease.

use std::sync::LazyLock;

/// Takes a lease if fewer than the limit are held, unless the place is
/// kept for a replica that is waiting with fewer leases for its weight.
///
/// `KEYS[1]`: the ceiling's one key, a sorted set of four kinds of
/// members, told apart by their scores:
/// - a lease: member its token (whose first 16 characters are its
///   replica's id), score its deadline in milliseconds of the server's
///   clock, above 0;
/// - `h:<replica>`: the leases a replica holds, as minus their count, from
///   -2^30 to -1 (gone at 0);
/// - `w:<replica>`: a replica waiting (refused since its last grant), score
///   its leases over its weight less 2^41, from -2^41 to -2^40: the
///   waiting replicas in the order they come first;
/// - `u:<replica>`: beside it, until when it counts as waiting (the end of
///   its window, in milliseconds) less 2^52, below -2^51.
///
/// `ARGV`: the limit, the lease in milliseconds, the token, the replica's
/// id, its weight, how long a refusal counts it as waiting (milliseconds),
/// then the tokens of leases this replica is giving back.
///
/// Removes the leases given back first (so that a caller's next call does
/// not find its own last lease still held), then, if the limit is reached,
/// the expired ones (they are reclaimed slots, and counted; their replicas
/// count as waiting no more). A place that is free is kept for each waiting
/// replica ahead of this one: with fewer leases for its weight, or as few
/// and before it in an order of the replicas shuffled every 100 ms (`SHA1`
/// of the time and the id), so that where the ceiling does not divide
/// evenly the extra places go round, without changing hands at every
/// release. This one is admitted if more places are free than replicas
/// ahead of it. The waiting replicas are read in order, from the fewest
/// leases, up to 32, and only those not after this one: none while the
/// ceiling has room for everyone, and none while each replica holds its
/// share. A replica whose window has ended is passed over, and its marks
/// go. Granted, a replica waits no more; refused, it is marked, written
/// only if it was not (or its window had ended): a storm of refusals
/// writes nothing more.
///
/// A token already held is a request sent again (a redirection, a retry)
/// after it was granted: it is answered granted, and nothing is taken twice.
///
/// Replies `{admitted, held, reclaimed, hint, released, kept}`: `held`
/// counts the leases after the decision, `hint` is how long until the
/// earliest lease held runs out (0 when admitted), `released` a 1 or a 0
/// for each lease given back: found and removed, or gone already; `kept`
/// the places left free for replicas ahead when refused (0 when the
/// ceiling is full).
///
/// `TIME` is read once, before any write: since Redis 5 a script is
/// replicated by its effects, so reading the clock is allowed, and up to
/// 7.0 the clock still moves while a script runs.
pub(super) static ACQUIRE: LazyLock<::redis::Script> = LazyLock::new(|| {
    ::redis::Script::new(
        r"
local key = KEYS[1]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- A deadline counts from the millisecond after now: rounded down, a lease
-- could end up to a millisecond before it was asked to.
local from = tonumber(time[1]) * 1000 + math.ceil(tonumber(time[2]) / 1000)
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local token = ARGV[3]
local replica = ARGV[4]
local weight = tonumber(ARGV[5])
local window = tonumber(ARGV[6])
local W = 2199023255552
local U = 4503599627370496
local count_of = 'h:' .. replica
-- Leases gone: this replica's are settled with its answer, in one write.
local gone = 0
local others = {}
local function lost(gone_token)
    local owner = string.sub(gone_token, 1, 16)
    if owner == replica then
        gone = gone + 1
    else
        others[owner] = (others[owner] or 0) + 1
    end
end
local released = {}
for i = 7, #ARGV do
    released[i - 6] = redis.call('ZREM', key, ARGV[i])
    if released[i - 6] == 1 then
        lost(ARGV[i])
    end
end
local held = redis.call('ZCOUNT', key, '(0', '+inf')
local reclaimed = 0
local first = nil
if held >= limit then
    -- Full, counting leases that have run out: those are dropped (only
    -- then: below the limit they block nobody).
    first = redis.call('ZRANGEBYSCORE', key, '(0', '+inf', 'WITHSCORES', 'LIMIT', '0', '1')
    if first[2] and tonumber(first[2]) <= now then
        local expired = redis.call('ZRANGEBYSCORE', key, '(0', now)
        for _, expired_token in ipairs(expired) do
            lost(expired_token)
        end
        redis.call('ZREMRANGEBYSCORE', key, '(0', now)
        reclaimed = #expired
        held = held - reclaimed
        first = nil
    end
end
for owner, count in pairs(others) do
    -- Another replica's leases ran out: it waits no more.
    if tonumber(redis.call('ZINCRBY', key, count, 'h:' .. owner)) >= 0 then
        redis.call('ZREM', key, 'h:' .. owner)
    end
    redis.call('ZREM', key, 'w:' .. owner, 'u:' .. owner)
end
local ours = nil
local function our_count()
    if not ours then
        local score = redis.call('ZSCORE', key, count_of)
        ours = 0
        if score then
            ours = -tonumber(score)
        end
        ours = ours - gone
    end
    return ours
end
-- The leases this replica holds go from `ours + gone` to `ours`.
local function settle(taken)
    local change = gone - taken
    if change ~= 0 then
        local left = -tonumber(redis.call('ZINCRBY', key, change, count_of))
        if left <= 0 then
            redis.call('ZREM', key, count_of)
            left = 0
        end
        return left
    end
    return nil
end
local free = limit - held
local ahead = 0
local waiters = false
if free > 0 then
    local lowest = redis.call('ZRANGEBYSCORE', key, '-2199023255552', '(-1099511627776',
        'WITHSCORES', 'LIMIT', '0', '1')
    waiters = lowest[1] ~= nil
    local mine = 0
    if waiters then
        mine = our_count() / weight - W
    end
    if waiters and tonumber(lowest[2]) <= mine then
        -- The replicas waiting with as few leases for their weights, or
        -- fewer, fewest first.
        local waiting = redis.call('ZRANGEBYSCORE', key, '-2199023255552',
            string.format('%.17g', mine), 'WITHSCORES', 'LIMIT', '0', '32')
        local epoch = string.format('%d:', math.floor(now / 100))
        local our_turn = nil
        for i = 1, #waiting, 2 do
            local other = string.sub(waiting[i], 3)
            if other ~= replica then
                local before = tonumber(waiting[i + 1]) < mine
                if not before then
                    -- As many: the order of the moment.
                    our_turn = our_turn or redis.sha1hex(epoch .. replica)
                    before = redis.sha1hex(epoch .. other) < our_turn
                end
                if before then
                    local ends = redis.call('ZSCORE', key, 'u:' .. other)
                    if ends and tonumber(ends) >= now - U then
                        ahead = ahead + 1
                        if ahead >= free then
                            break
                        end
                    else
                        -- Its window has ended: it asks no more.
                        redis.call('ZREM', key, waiting[i], 'u:' .. other)
                    end
                end
            end
        end
    end
end
if free > ahead then
    local taken = redis.call('ZADD', key, 'NX', string.format('%d', from + lease), token)
    -- 0: sent again after it was granted, granted already.
    settle(taken)
    if waiters and taken == 1 then
        redis.call('ZREM', key, 'w:' .. replica, 'u:' .. replica)
    end
    -- The key outlives its latest lease by a lease, then goes; never
    -- sooner than another replica's (maybe longer) lease asked for.
    if redis.call('PTTL', key) < 2 * lease then
        redis.call('PEXPIRE', key, 2 * lease)
    end
    return {1, held + taken, reclaimed, 0, released, 0}
end
if redis.call('ZSCORE', key, token) then
    -- Sent again after it was granted: granted already.
    settle(0)
    return {1, held, reclaimed, 0, released, 0}
end
local left = settle(0)
local ends = redis.call('ZSCORE', key, 'u:' .. replica)
if ends and tonumber(ends) >= now - U then
    if left then
        -- Waiting, with fewer leases now.
        redis.call('ZADD', key, 'XX', string.format('%.17g', left / weight - W),
            'w:' .. replica)
    end
else
    redis.call('ZADD', key, string.format('%d', now + window - U), 'u:' .. replica)
    redis.call('ZADD', key, string.format('%.17g', (left or our_count()) / weight - W),
        'w:' .. replica)
    if redis.call('PTTL', key) < 0 then
        redis.call('PEXPIRE', key, 2 * lease)
    end
end
if not first then
    first = redis.call('ZRANGEBYSCORE', key, '(0', '+inf', 'WITHSCORES', 'LIMIT', '0', '1')
end
local hint = 0
if first[2] then
    hint = math.max(tonumber(first[2]) - now, 0)
end
return {0, held, reclaimed, hint, released, math.max(free, 0)}
",
    )
});

/// Moves the deadline of each live lease to a lease from now; a lease that
/// has run out or is gone (reclaimed, or the set deleted) is left as it is,
/// never brought back.
///
/// `KEYS[1]`: the ceiling's key (see [`ACQUIRE`]). `ARGV[1]`: the lease in
/// milliseconds; the rest: the tokens. Replies how many were renewed.
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

/// Removes the leases given back, one fewer for each one's replica.
/// `KEYS[1]`: the ceiling's key (see [`ACQUIRE`]); `ARGV`: the replica's id
/// and weight (its place in line, if it is waiting, moves with its count),
/// then the tokens. Replies a 1 or a 0 for each token: found and removed,
/// or gone already (run out and reclaimed, or removed by an earlier
/// command).
pub(super) static RELEASE: LazyLock<::redis::Script> = LazyLock::new(|| {
    ::redis::Script::new(
        r"
local key = KEYS[1]
local replica = ARGV[1]
local weight = tonumber(ARGV[2])
local removed = {}
local gone = {}
for i = 3, #ARGV do
    removed[i - 2] = redis.call('ZREM', key, ARGV[i])
    if removed[i - 2] == 1 then
        local owner = string.sub(ARGV[i], 1, 16)
        gone[owner] = (gone[owner] or 0) + 1
    end
end
for owner, count in pairs(gone) do
    local left = -tonumber(redis.call('ZINCRBY', key, count, 'h:' .. owner))
    if left <= 0 then
        redis.call('ZREM', key, 'h:' .. owner)
        left = 0
    end
    if owner == replica then
        redis.call('ZADD', key, 'XX', string.format('%.17g', left / weight - 2199023255552),
            'w:' .. owner)
    end
end
return removed
",
    )
});

#[cfg(test)]
mod tests {
    //! The scripts against a real `redis-server` of the test's own on a free
    //! loopback port: skipped, saying so, without one on `PATH` (unless
    //! `TOWER_INFLIGHT_REQUIRE_REDIS` is set, as `.ci/run` sets it).

    use super::*;
    use ::redis::aio::MultiplexedConnection;
    use ::redis::AsyncCommands;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    const KEY: &str = "tower-inflight:{script}:leases";
    const A: &str = "aaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbb";
    const LONG: u64 = 60_000;

    struct Server {
        child: Child,
        dir: std::path::PathBuf,
        connection: MultiplexedConnection,
    }

    impl Server {
        async fn start(test: &str) -> Option<Self> {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let dir = std::env::temp_dir().join(format!(
                "tower-inflight-script-{}-{port}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            let child = match child {
                Ok(child) => child,
                Err(error) => {
                    assert!(
                        std::env::var_os("TOWER_INFLIGHT_REQUIRE_REDIS").is_none(),
                        "{test}: redis-server failed to start ({error})"
                    );
                    eprintln!("SKIPPED {test}: redis-server is not on PATH ({error})");
                    return None;
                }
            };
            let client = ::redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
            let started = Instant::now();
            loop {
                if let Ok(connection) = client.get_multiplexed_async_connection().await {
                    return Some(Self {
                        child,
                        dir,
                        connection,
                    });
                }
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "no redis-server"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }

        /// `ACQUIRE` for the token's replica (weight 1), a refusal counting
        /// it as waiting for `window` ms.
        async fn acquire(
            &mut self,
            limit: usize,
            lease: u64,
            token: &str,
            window: u64,
            releases: &[&str],
        ) -> Answer {
            let mut script = ACQUIRE.key(KEY);
            script
                .arg(limit)
                .arg(lease)
                .arg(token)
                .arg(&token[..16])
                .arg(1)
                .arg(window);
            for release in releases {
                script.arg(*release);
            }
            let (admitted, held, reclaimed, _hint, released, kept): (
                u8,
                usize,
                u64,
                u64,
                Vec<u8>,
                u64,
            ) = script.invoke_async(&mut self.connection).await.unwrap();
            Answer {
                admitted: admitted == 1,
                held,
                reclaimed,
                released,
                kept,
            }
        }

        async fn release(&mut self, tokens: &[&str]) -> Vec<u8> {
            let mut script = RELEASE.key(KEY);
            script.arg(&tokens[0][..16]).arg(1);
            for token in tokens {
                script.arg(*token);
            }
            script.invoke_async(&mut self.connection).await.unwrap()
        }

        /// The leases `replica` holds, as its record says.
        async fn holds(&mut self, replica: &str) -> i64 {
            let score: Option<i64> = self
                .connection
                .zscore(KEY, format!("h:{replica}"))
                .await
                .unwrap();
            -score.unwrap_or(0)
        }

        async fn leases(&mut self) -> usize {
            self.connection.zcount(KEY, "(0", "+inf").await.unwrap()
        }

        /// When `replica`'s window ends, if it is waiting.
        async fn mark(&mut self, replica: &str) -> Option<i64> {
            let ends: Option<i64> = self
                .connection
                .zscore(KEY, format!("u:{replica}"))
                .await
                .unwrap();
            let place: Option<f64> = self
                .connection
                .zscore(KEY, format!("w:{replica}"))
                .await
                .unwrap();
            assert_eq!(ends.is_some(), place.is_some(), "both marks or neither");
            ends
        }
    }

    #[derive(Debug, PartialEq)]
    struct Answer {
        admitted: bool,
        held: usize,
        reclaimed: u64,
        released: Vec<u8>,
        kept: u64,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn token(replica: &str, n: u64) -> String {
        format!("{replica}{n:016x}")
    }

    #[tokio::test]
    async fn a_request_sent_again_takes_nothing_twice() {
        let Some(mut redis) = Server::start("a_request_sent_again_takes_nothing_twice").await
        else {
            return;
        };
        let (a1, a2) = (token(A, 1), token(A, 2));
        assert!(redis.acquire(2, LONG, &a1, LONG, &[]).await.admitted);
        // Sent again (a redirection, a retry of a reply lost): granted, once.
        let again = redis.acquire(2, LONG, &a1, LONG, &[]).await;
        assert_eq!((again.admitted, again.held), (true, 1));
        assert_eq!((redis.leases().await, redis.holds(A).await), (1, 1));
        // And with a release carried: removed once, counted once.
        assert!(redis.acquire(2, LONG, &a2, LONG, &[&a1]).await.admitted);
        let again = redis.acquire(2, LONG, &a2, LONG, &[&a1]).await;
        assert_eq!((again.admitted, again.released), (true, vec![0]));
        assert_eq!((redis.leases().await, redis.holds(A).await), (1, 1));
    }

    #[tokio::test]
    async fn a_free_place_is_kept_for_a_waiting_replica_with_fewer_leases() {
        let Some(mut redis) =
            Server::start("a_free_place_is_kept_for_a_waiting_replica_with_fewer_leases").await
        else {
            return;
        };
        let a: Vec<String> = (0..4).map(|n| token(A, n)).collect();
        let b: Vec<String> = (0..3).map(|n| token(B, n)).collect();
        assert!(redis.acquire(2, LONG, &a[0], LONG, &[]).await.admitted);
        assert!(redis.acquire(2, LONG, &a[1], LONG, &[]).await.admitted);
        assert!(!redis.acquire(2, LONG, &b[0], LONG, &[]).await.admitted);
        assert!(redis.mark(B).await.is_some(), "B waits");
        // A gives one back and asks again: B, waiting with none, is ahead.
        let kept = redis.acquire(2, LONG, &a[2], LONG, &[&a[0]]).await;
        assert_eq!(
            kept,
            Answer {
                admitted: false,
                held: 1,
                reclaimed: 0,
                released: vec![1],
                kept: 1
            }
        );
        assert!(!redis.acquire(2, LONG, &a[3], LONG, &[]).await.admitted);
        // B takes it; granted, it waits no more.
        assert!(redis.acquire(2, LONG, &b[1], LONG, &[]).await.admitted);
        assert_eq!(redis.mark(B).await, None);
        assert_eq!((redis.holds(A).await, redis.holds(B).await), (1, 1));
        // Full again; A waits with one lease. B gives its lease back and
        // asks again with none: fewer than A, it keeps its place.
        assert!(!redis.acquire(2, LONG, &a[3], LONG, &[]).await.admitted);
        assert!(redis.acquire(2, LONG, &b[2], LONG, &[&b[1]]).await.admitted);
        assert_eq!(redis.leases().await, 2);
    }

    #[tokio::test]
    async fn a_kept_place_is_lent_once_the_waiting_replica_stops_asking() {
        let Some(mut redis) =
            Server::start("a_kept_place_is_lent_once_the_waiting_replica_stops_asking").await
        else {
            return;
        };
        let a: Vec<String> = (0..4).map(|n| token(A, n)).collect();
        assert!(redis.acquire(2, LONG, &a[0], LONG, &[]).await.admitted);
        assert!(redis.acquire(2, LONG, &a[1], LONG, &[]).await.admitted);
        // B is refused, waiting for 50 ms, and asks no more.
        let started = Instant::now();
        assert!(!redis.acquire(2, LONG, &token(B, 0), 50, &[]).await.admitted);
        let kept = redis.acquire(2, LONG, &a[2], LONG, &[&a[0]]).await;
        if started.elapsed() < Duration::from_millis(40) {
            assert_eq!((kept.admitted, kept.kept), (false, 1), "kept for B");
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
        // B's window has ended: the place is lent, and B's mark is gone.
        assert!(redis.acquire(2, LONG, &a[3], LONG, &[]).await.admitted);
        assert_eq!(redis.mark(B).await, None);
        assert_eq!(redis.holds(A).await, 2);
    }

    #[tokio::test]
    async fn a_refusal_writes_its_mark_once_a_window() {
        let Some(mut redis) = Server::start("a_refusal_writes_its_mark_once_a_window").await else {
            return;
        };
        assert!(
            redis
                .acquire(1, LONG, &token(A, 0), LONG, &[])
                .await
                .admitted
        );
        assert!(
            !redis
                .acquire(1, LONG, &token(B, 0), LONG, &[])
                .await
                .admitted
        );
        let first = redis.mark(B).await.unwrap();
        for n in 1..20 {
            assert!(
                !redis
                    .acquire(1, LONG, &token(B, n), LONG, &[])
                    .await
                    .admitted
            );
        }
        assert_eq!(redis.mark(B).await, Some(first), "not written again");
        // Once its window has ended, the next refusal marks it again.
        const C: &str = "cccccccccccccccc";
        assert!(!redis.acquire(1, LONG, &token(C, 0), 20, &[]).await.admitted);
        let first = redis.mark(C).await.unwrap();
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(!redis.acquire(1, LONG, &token(C, 1), 20, &[]).await.admitted);
        assert!(redis.mark(C).await.unwrap() > first, "marked again");
    }

    #[tokio::test]
    async fn a_replica_s_count_follows_its_leases() {
        let Some(mut redis) = Server::start("a_replica_s_count_follows_its_leases").await else {
            return;
        };
        let (a0, a1, b0) = (token(A, 0), token(A, 1), token(B, 0));
        for held in [&a0, &a1, &b0] {
            assert!(redis.acquire(3, LONG, held, LONG, &[]).await.admitted);
        }
        assert_eq!((redis.holds(A).await, redis.holds(B).await), (2, 1));
        assert_eq!(
            redis.release(&[&a0, &b0, &token(B, 9)]).await,
            vec![1, 1, 0]
        );
        assert_eq!(redis.release(&[&a0]).await, vec![0], "twice: once");
        assert_eq!((redis.holds(A).await, redis.holds(B).await), (1, 0));
        // A lease that runs out, reclaimed when the ceiling is full, is one
        // fewer for its replica.
        assert!(redis.acquire(2, 20, &b0, LONG, &[]).await.admitted);
        tokio::time::sleep(Duration::from_millis(40)).await;
        let answer = redis.acquire(2, LONG, &token(A, 2), LONG, &[]).await;
        assert_eq!(
            (answer.admitted, answer.held, answer.reclaimed),
            (true, 2, 1)
        );
        assert_eq!((redis.holds(A).await, redis.holds(B).await), (2, 0));
        // Everything given back: only the key's expiry is left.
        assert_eq!(redis.release(&[&a1, &token(A, 2)]).await, vec![1, 1]);
        let left: usize = redis.connection.zcard(KEY).await.unwrap();
        assert_eq!(left, 0, "no lease, no count");
    }

    /// Three replicas' requests in a random order: new tokens carrying
    /// releases, requests sent again, releases sent apart, leases that run
    /// out. After each, the leases held are within the limit, a token
    /// answered granted is held, and each replica's count is its leases.
    #[tokio::test]
    async fn random_requests_keep_the_limit_and_each_replica_s_count() {
        let Some(mut redis) =
            Server::start("random_requests_keep_the_limit_and_each_replica_s_count").await
        else {
            return;
        };
        const LIMIT: usize = 3;
        let replicas = [A, B, "cccccccccccccccc"];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut random = move |below: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % below as u64) as usize
        };
        // Each replica's tokens answered granted and not given back.
        let mut held: Vec<Vec<String>> = vec![Vec::new(); replicas.len()];
        let mut asked: Vec<String> = Vec::new();
        for step in 0..1_500u64 {
            let r = random(replicas.len());
            let granted = match random(10) {
                0..=4 => {
                    let token = token(replicas[r], step);
                    let mut carried = Vec::new();
                    for _ in 0..random(3) {
                        if !held[r].is_empty() {
                            let at = random(held[r].len());
                            carried.push(held[r].swap_remove(at));
                        }
                    }
                    let carried: Vec<&str> = carried.iter().map(String::as_str).collect();
                    let lease = if random(4) == 0 { 3 } else { LONG };
                    asked.push(token.clone());
                    let answer = redis.acquire(LIMIT, lease, &token, 30, &carried).await;
                    answer.admitted.then_some(token)
                }
                5..=6 if !asked.is_empty() => {
                    let token = asked[random(asked.len())].clone();
                    let answer = redis.acquire(LIMIT, LONG, &token, 30, &[]).await;
                    answer.admitted.then_some(token)
                }
                7..=8 if !held[r].is_empty() => {
                    let at = random(held[r].len());
                    let token = held[r].swap_remove(at);
                    redis.release(&[&token]).await;
                    None
                }
                _ => {
                    tokio::time::sleep(Duration::from_millis(4)).await;
                    None
                }
            };
            // Everything from one read: a lease of 3 ms, alone in the set,
            // has the key expire 6 ms on, and on a loaded machine the key
            // could expire between two reads. (Gone whole, it is gone
            // consistently: no lease and no count.)
            let all: Vec<(String, f64)> = redis
                .connection
                .zrange_withscores(KEY, 0, -1)
                .await
                .unwrap();
            if let Some(token) = granted {
                let held_now = all
                    .iter()
                    .any(|(member, score)| *member == token && *score > 0.0);
                assert!(all.is_empty() || held_now, "step {step}: {token} not held");
                let owner = replicas.iter().position(|r| token.starts_with(r)).unwrap();
                if !held[owner].contains(&token) {
                    held[owner].push(token);
                }
            }
            let leases: Vec<&str> = all
                .iter()
                .filter(|(_, score)| *score > 0.0)
                .map(|(member, _)| member.as_str())
                .collect();
            assert!(leases.len() <= LIMIT, "step {step}: {leases:?}");
            for replica in replicas {
                let theirs = leases.iter().filter(|l| l.starts_with(replica)).count();
                let count = all
                    .iter()
                    .find(|(member, _)| *member == format!("h:{replica}"))
                    .map_or(0.0, |(_, score)| -score);
                assert_eq!(count, theirs as f64, "step {step}: {replica}'s count");
            }
        }
    }

    /// Thousands of replicas waiting at once: the script looks at 32 of
    /// them, whatever their number (read all in one command, past about
    /// 4,000 they would overflow Lua's stack).
    #[tokio::test]
    async fn thousands_of_waiting_replicas_cost_a_bounded_look() {
        let Some(mut redis) =
            Server::start("thousands_of_waiting_replicas_cost_a_bounded_look").await
        else {
            return;
        };
        let a: Vec<String> = (0..3).map(|n| token(A, n)).collect();
        assert!(redis.acquire(2, LONG, &a[0], LONG, &[]).await.admitted);
        assert!(redis.acquire(2, LONG, &a[1], LONG, &[]).await.admitted);
        // Loaded first: a pipeline sends EVALSHA alone.
        ACQUIRE
            .prepare_invoke()
            .load_async(&mut redis.connection)
            .await
            .unwrap();
        for chunk in 0..10u64 {
            let mut pipeline = ::redis::pipe();
            for n in chunk * 500..(chunk + 1) * 500 {
                let waiter = token(&format!("{n:016x}"), 0);
                pipeline
                    .invoke_script(
                        ACQUIRE
                            .key(KEY)
                            .arg(2)
                            .arg(LONG)
                            .arg(&waiter)
                            .arg(&waiter[..16])
                            .arg(1)
                            .arg(LONG),
                    )
                    .ignore();
            }
            let () = pipeline.query_async(&mut redis.connection).await.unwrap();
        }
        let marks: usize = redis
            .connection
            .zcount(KEY, "-inf", "(-2251799813685248")
            .await
            .unwrap();
        assert_eq!(marks, 5_000);
        // A gives one back, holding one more than each of them: kept.
        let kept = redis.acquire(2, LONG, &a[2], LONG, &[&a[0]]).await;
        assert_eq!(
            (kept.admitted, kept.released, kept.kept),
            (false, vec![1], 1)
        );
    }
}
