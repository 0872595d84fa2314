//! Every Lua script distlock sends, run directly (`EVAL`) against a real `redis-server` from a
//! state set up by hand with raw commands: free, held by us, held by another owner, held and
//! marked as waited on (`~` + token) by either, an expired queue head, a dead waiter's entry, a
//! counter of another type, a counter ahead of the clock, a replayed acquire. Each test checks
//! the reply and what the script left behind: keys, ttls, queue, and the messages on the lock's
//! channel. The scripts' contracts are at the top of their files in
//! `distlock-runtime/src/scripts/`; the texts run here are the runtime's own, as composed for
//! Redis (`__private::script`).

use std::collections::HashMap;
use std::time::Duration;

use distlock_runtime::__private::{script, scripts};
use distlock_tests::RedisServer;
use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, FromRedisValue, RedisResult, ToRedisArgs, Value};

/// Owner tokens as distlock makes them (128 random bits in hex, a holder label after `:`).
const OURS: &str = "0a1b2c3d4e5f60718293a4b5c6d7e8f9";
const THEIRS: &str = "f9e8d7c6b5a4938271605f4e3d2c1b0a:other-host";
/// Fair waiters' tokens.
const FIRST: &str = "1111111111111111aaaaaaaaaaaaaaaa";
const SECOND: &str = "2222222222222222bbbbbbbbbbbbbbbb";
const THIRD: &str = "3333333333333333cccccccccccccccc";

/// The acquire's third argument (`Waiting` in the runtime's `scripts/mod.rs`).
const NOT_YET: &str = "0";
const WAITED: &str = "1";
const NEVER: &str = "-";

/// No arguments.
const NO_ARGS: &[&str] = &[];

/// Every script this file runs: a script added to the runtime must be added here, with tests.
const COVERED: [&str; 9] = [
    "acquire",
    "release",
    "extend",
    "fair_acquire",
    "raise",
    "inspect",
    "force_release",
    "check",
    "key_types",
];

/// The Redis keys of the lock on `key` under the default prefix (the runtime's `keys.rs`).
struct Keys {
    lock: String,
    fence: String,
    queue: String,
    waiters: String,
}

fn keys(key: &str) -> Keys {
    Keys {
        lock: format!("distlock:lock:{{{key}}}"),
        fence: format!("distlock:fence:{{{key}}}"),
        queue: format!("distlock:queue:{{{key}}}"),
        waiters: format!("distlock:waiters:{{{key}}}"),
    }
}

impl Keys {
    /// The four keys the release and fair acquire scripts take per lock, in their order.
    fn for_release(&self) -> [&str; 4] {
        [&self.lock, &self.queue, &self.waiters, &self.fence]
    }
}

/// Runs the script `name` with `keys` and `args`, as `EVAL`.
async fn run<T: FromRedisValue>(
    conn: &mut MultiplexedConnection,
    name: &str,
    keys: &[&str],
    args: impl ToRedisArgs,
) -> RedisResult<T> {
    redis::cmd("EVAL")
        .arg(script(name))
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .query_async(conn)
        .await
}

/// ACQUIRE of the one lock `k`.
async fn acquire(conn: &mut MultiplexedConnection, k: &Keys, args: impl ToRedisArgs) -> Value {
    run(conn, "acquire", &[&k.lock, &k.fence], args)
        .await
        .unwrap()
}

/// RELEASE of the one lock `k`: how many lock keys it released.
async fn release(conn: &mut MultiplexedConnection, k: &Keys, args: impl ToRedisArgs) -> i64 {
    run(conn, "release", &k.for_release(), args).await.unwrap()
}

/// FAIR_ACQUIRE of the lock `k`.
async fn fair_acquire(conn: &mut MultiplexedConnection, k: &Keys, args: impl ToRedisArgs) -> Value {
    run(conn, "fair_acquire", &k.for_release(), args)
        .await
        .unwrap()
}

/// Redis's clock: `(µs, ms)`.
async fn now(conn: &mut MultiplexedConnection) -> (u64, u64) {
    let (secs, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    (secs * 1_000_000 + us, secs * 1000 + us / 1000)
}

async fn set_px(conn: &mut MultiplexedConnection, key: &str, value: &str, px: u64) {
    let () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(px)
        .query_async(conn)
        .await
        .unwrap();
}

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    conn.get(key).await.unwrap()
}

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    conn.pttl(key).await.unwrap()
}

async fn key_type(conn: &mut MultiplexedConnection, key: &str) -> String {
    redis::cmd("TYPE").arg(key).query_async(conn).await.unwrap()
}

/// Queues `token` as a fair waiter of `k` by hand: its list entry and its hash entry
/// `"deadline_ms claim_ms secret"`.
async fn enqueue(conn: &mut MultiplexedConnection, k: &Keys, token: &str, entry: Option<String>) {
    let _: i64 = conn.rpush(&k.queue, token).await.unwrap();
    if let Some(entry) = entry {
        let _: i64 = conn.hset(&k.waiters, token, entry).await.unwrap();
    }
}

/// The queue of `k`: its tokens in order, and its entries.
async fn queue(
    conn: &mut MultiplexedConnection,
    k: &Keys,
) -> (Vec<String>, HashMap<String, String>) {
    let list: Vec<String> = conn.lrange(&k.queue, 0, -1).await.unwrap();
    let entries: HashMap<String, String> = conn.hgetall(&k.waiters).await.unwrap();
    (list, entries)
}

/// The messages published on one channel, as a raw subscriber sees them.
struct Channel {
    name: String,
    messages: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Channel {
    async fn subscribe(server: &RedisServer, name: &str) -> Self {
        let mut pubsub = redis::Client::open(server.url())
            .unwrap()
            .get_async_pubsub()
            .await
            .unwrap();
        pubsub.subscribe(name).await.unwrap();
        let (sender, messages) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut stream = pubsub.into_on_message();
            while let Some(message) = stream.next().await {
                if sender.send(message.get_payload().unwrap()).is_err() {
                    return;
                }
            }
        });
        Self {
            name: name.to_owned(),
            messages,
        }
    }

    /// Everything published on the channel so far, in order: a marker is published after
    /// the scripts ran, and the messages before it are theirs.
    async fn published(&mut self, conn: &mut MultiplexedConnection) -> Vec<String> {
        let marker = "-- end of the test's messages --";
        let _: i64 = conn.publish(&self.name, marker).await.unwrap();
        let mut published = Vec::new();
        loop {
            let message = tokio::time::timeout(Duration::from_secs(5), self.messages.recv())
                .await
                .expect("the marker is delivered")
                .expect("subscribed");
            if message == marker {
                return published;
            }
            published.push(message);
        }
    }
}

/// A hand-off message's fields, checked against its signature.
#[derive(Debug)]
struct Handoff {
    token: String,
    fence: u64,
    server_ms: u64,
    claim_ms: u64,
}

/// Parses `h <token> <fence> <ms> <claim> <mac>` and checks `<mac>` is
/// `sha1hex(secret + " " + fields + " " + secret)` over the fields before it.
fn handoff(message: &str, secret: &str) -> Handoff {
    let fields = message
        .strip_prefix("h ")
        .unwrap_or_else(|| panic!("not a hand-off: {message:?}"));
    let (signed, mac) = fields.rsplit_once(' ').unwrap();
    let expected = sha1_smol::Sha1::from(format!("{secret} {signed} {secret}"))
        .digest()
        .to_string();
    assert_eq!(mac, expected, "the signature of {message:?}");
    let parts: Vec<&str> = signed.split(' ').collect();
    assert_eq!(parts.len(), 4, "fields of {message:?}");
    Handoff {
        token: parts[0].to_owned(),
        fence: parts[1].parse().unwrap(),
        server_ms: parts[2].parse().unwrap(),
        claim_ms: parts[3].parse().unwrap(),
    }
}

/// The acquire's reply when some key was held: `(index, pttl)`.
fn held(reply: &Value) -> Option<(i64, i64)> {
    match <Vec<i64>>::from_redis_value(reply.clone()).ok()?.as_slice() {
        [0, index, pttl] => Some((*index, *pttl)),
        _ => None,
    }
}

/// The acquire's reply when it took the keys: the fencing token.
fn token_of(reply: &Value) -> u64 {
    String::from_redis_value(reply.clone())
        .ok()
        .and_then(|digits| digits.parse().ok())
        .unwrap_or_else(|| panic!("not a fencing token: {reply:?}"))
}

#[test]
fn every_script_the_runtime_sends_is_run_here() {
    let mut sent: Vec<&str> = scripts().iter().map(|(name, _)| *name).collect();
    let mut covered = COVERED.to_vec();
    sent.sort_unstable();
    covered.sort_unstable();
    assert_eq!(sent, covered, "add the new script's tests to this file");
}

// ---- acquire.lua ----

#[tokio::test]
async fn acquire_takes_a_free_key_with_its_ttl_and_a_token_from_the_clock() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("free");
    let (before, _) = now(&mut conn).await;
    let reply: Value = acquire(&mut conn, &k, (OURS, 30_000, NOT_YET)).await;
    let (after, _) = now(&mut conn).await;
    let token = token_of(&reply);
    assert!(
        (before..=after).contains(&token),
        "{before} <= {token} <= {after}"
    );
    // Taken plain: nobody waited for it.
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some(OURS));
    assert!((29_000..=30_000).contains(&pttl(&mut conn, &k.lock).await));
    assert_eq!(get(&mut conn, &k.fence).await, Some(token.to_string()));
    assert!((29_000..=30_000).contains(&pttl(&mut conn, &k.fence).await));

    // A try-lock takes it plain too; a request that has waited takes it marked, for the
    // waiters behind it.
    for (waiting, value) in [(NEVER, OURS.to_owned()), (WAITED, format!("~{OURS}"))] {
        let _: i64 = conn.del(&k.lock).await.unwrap();
        let reply: Value = acquire(&mut conn, &k, (OURS, 30_000, waiting)).await;
        assert!(token_of(&reply) > token);
        assert_eq!(
            get(&mut conn, &k.lock).await,
            Some(value),
            "waiting {waiting}"
        );
    }
}

#[tokio::test]
async fn acquire_of_a_key_another_owner_holds_marks_it_unless_it_is_a_try_lock() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("held");
    set_px(&mut conn, &k.fence, "7", 60_000).await;

    // A try-lock: nothing changes.
    set_px(&mut conn, &k.lock, THEIRS, 5_000).await;
    let reply: Value = acquire(&mut conn, &k, (OURS, 30_000, NEVER)).await;
    let (index, remaining) = held(&reply).expect("held");
    assert_eq!(index, 1);
    assert!((4_000..=5_000).contains(&remaining), "{remaining}");
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some(THEIRS));

    // A request that will wait marks the holder, keeping its ttl; one that has waited too.
    for waiting in [NOT_YET, WAITED] {
        set_px(&mut conn, &k.lock, THEIRS, 5_000).await;
        let reply: Value = acquire(&mut conn, &k, (OURS, 30_000, waiting)).await;
        assert_eq!(held(&reply).map(|h| h.0), Some(1));
        assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{THEIRS}")));
        assert!((4_000..=5_000).contains(&pttl(&mut conn, &k.lock).await));
    }
    // A holder marked already stays marked once.
    let reply: Value = acquire(&mut conn, &k, (OURS, 30_000, NOT_YET)).await;
    assert!(held(&reply).is_some());
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{THEIRS}")));
    // No token was drawn for a lock not taken.
    assert_eq!(get(&mut conn, &k.fence).await.as_deref(), Some("7"));
    // A held key without expiry answers -1.
    let _: () = conn.set(&k.lock, THEIRS).await.unwrap();
    let reply: Value = acquire(&mut conn, &k, (OURS, 30_000, NEVER)).await;
    assert_eq!(held(&reply), Some((1, -1)));
}

#[tokio::test]
async fn an_acquire_sent_again_with_the_same_token_takes_the_key_again_with_a_greater_token() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("replayed");
    let first: Value = acquire(&mut conn, &k, (OURS, 1_000, NOT_YET)).await;
    // The same request, re-sent (its answer was lost): ours already, so taken again, its ttl
    // counted from now.
    let again: Value = acquire(&mut conn, &k, (OURS, 60_000, NOT_YET)).await;
    assert!(token_of(&again) > token_of(&first));
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some(OURS));
    assert!(pttl(&mut conn, &k.lock).await > 59_000);
    // Ours and marked as waited on (a hand-off, or someone waits): it stays marked.
    set_px(&mut conn, &k.lock, &format!("~{OURS}"), 1_000).await;
    let marked: Value = acquire(&mut conn, &k, (OURS, 60_000, NEVER)).await;
    assert!(token_of(&marked) > token_of(&again));
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{OURS}")));
    assert!(pttl(&mut conn, &k.lock).await > 59_000);
    // Several keys, one ours marked, one ours plain, one free: all taken, the mark kept.
    let (a, b, c) = (keys("replayed"), keys("replayed-b"), keys("replayed-c"));
    set_px(&mut conn, &b.lock, OURS, 1_000).await;
    let all: Value = run(
        &mut conn,
        "acquire",
        &[&a.lock, &b.lock, &c.lock, &a.fence, &b.fence, &c.fence],
        (OURS, 60_000, NOT_YET),
    )
    .await
    .unwrap();
    let token = token_of(&all);
    assert!(token > token_of(&marked));
    assert_eq!(get(&mut conn, &a.lock).await, Some(format!("~{OURS}")));
    assert_eq!(get(&mut conn, &b.lock).await.as_deref(), Some(OURS));
    assert_eq!(get(&mut conn, &c.lock).await.as_deref(), Some(OURS));
    for key in [&a, &b, &c] {
        assert!(pttl(&mut conn, &key.lock).await > 59_000);
        assert_eq!(get(&mut conn, &key.fence).await, Some(token.to_string()));
    }
}

#[tokio::test]
async fn acquire_of_several_keys_takes_all_or_none() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let (a, b, c) = (keys("a"), keys("b"), keys("c"));
    let all = [&*a.lock, &b.lock, &c.lock, &a.fence, &b.fence, &c.fence];
    // b held (marked by someone else's waiter already), c held plain: nothing is taken, the
    // first held key (b) is marked, and the longest ttl among the held keys is answered.
    set_px(&mut conn, &b.lock, &format!("~{THEIRS}"), 3_000).await;
    set_px(&mut conn, &c.lock, THEIRS, 8_000).await;
    let reply: Value = run(&mut conn, "acquire", &all, (OURS, 30_000, NOT_YET))
        .await
        .unwrap();
    let (index, longest) = held(&reply).expect("held");
    assert_eq!(index, 2);
    assert!((7_000..=8_000).contains(&longest), "{longest}");
    assert_eq!(get(&mut conn, &a.lock).await, None);
    assert_eq!(get(&mut conn, &b.lock).await, Some(format!("~{THEIRS}")));
    // Only the first held key is marked: that is the one a waiter waits for.
    assert_eq!(get(&mut conn, &c.lock).await.as_deref(), Some(THEIRS));
    for key in [&a, &b, &c] {
        assert_eq!(get(&mut conn, &key.fence).await, None);
    }
    // A held key without expiry makes the answer -1.
    let _: () = conn.set(&c.lock, THEIRS).await.unwrap();
    let reply: Value = run(&mut conn, "acquire", &all, (OURS, 30_000, NOT_YET))
        .await
        .unwrap();
    assert_eq!(held(&reply), Some((2, -1)));
    // All free: all taken, with one token in every counter.
    let _: i64 = conn.del(&[&b.lock, &c.lock]).await.unwrap();
    let reply: Value = run(&mut conn, "acquire", &all, (OURS, 30_000, WAITED))
        .await
        .unwrap();
    let token = token_of(&reply);
    for key in [&a, &b, &c] {
        assert_eq!(get(&mut conn, &key.lock).await, Some(format!("~{OURS}")));
        assert_eq!(get(&mut conn, &key.fence).await, Some(token.to_string()));
    }
}

#[tokio::test]
async fn the_token_drawn_is_above_a_counter_ahead_of_the_clock() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let (one, two) = (keys("ahead"), keys("ahead-b"));
    let (clock, _) = now(&mut conn).await;
    // As after Redis's clock was set back an hour.
    let ahead = clock + 3_600_000_000;
    set_px(&mut conn, &one.fence, &ahead.to_string(), 60_000).await;
    let reply: Value = acquire(&mut conn, &one, (OURS, 10_000, NOT_YET)).await;
    assert_eq!(token_of(&reply), ahead + 1);
    assert_eq!(
        get(&mut conn, &one.fence).await,
        Some((ahead + 1).to_string())
    );
    // The counter lives until the clock has passed it, not just the lease's ttl.
    let kept = pttl(&mut conn, &one.fence).await;
    assert!((3_600_000..=3_610_000).contains(&kept), "{kept}");

    // Two keys: one token above the greatest counter, written to both.
    let _: i64 = conn.del(&one.lock).await.unwrap();
    set_px(&mut conn, &two.fence, &(ahead + 10).to_string(), 60_000).await;
    let reply: Value = run(
        &mut conn,
        "acquire",
        &[&one.lock, &two.lock, &one.fence, &two.fence],
        (OURS, 10_000, NOT_YET),
    )
    .await
    .unwrap();
    assert_eq!(token_of(&reply), ahead + 11);
    assert_eq!(
        get(&mut conn, &one.fence).await,
        Some((ahead + 11).to_string())
    );
    assert_eq!(
        get(&mut conn, &two.fence).await,
        Some((ahead + 11).to_string())
    );
}

#[tokio::test]
async fn a_proposed_token_is_drawn_when_it_is_above_the_clock_and_the_counter() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("floor");
    let (clock, _) = now(&mut conn).await;
    // A quorum's proposal, ahead of this server's clock by 20 s.
    let floor = clock + 20_000_000;
    let reply: Value = acquire(&mut conn, &k, (OURS, 10_000, NOT_YET, floor)).await;
    assert_eq!(token_of(&reply), floor);
    assert_eq!(get(&mut conn, &k.fence).await, Some(floor.to_string()));
    // The counter lives the ttl plus how far the token is ahead of the clock.
    let kept = pttl(&mut conn, &k.fence).await;
    assert!((29_000..=30_000).contains(&kept), "{kept}");
    // A proposal below the counter: one more than the counter.
    let _: i64 = conn.del(&k.lock).await.unwrap();
    let reply: Value = acquire(&mut conn, &k, (OURS, 10_000, NOT_YET, floor - 5)).await;
    assert_eq!(token_of(&reply), floor + 1);
    // A proposal below the clock: the clock.
    let _: i64 = conn.del(&[&k.lock, &k.fence]).await.unwrap();
    let reply: Value = acquire(&mut conn, &k, (OURS, 10_000, NOT_YET, clock - 1_000_000)).await;
    let (after, _) = now(&mut conn).await;
    assert!((clock..=after).contains(&token_of(&reply)));
}

#[tokio::test]
async fn a_counter_of_another_type_is_overwritten_and_a_lock_of_another_type_is_an_error() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("odd");
    // Another program's list where the counter would be: the token goes on from the clock.
    let _: i64 = conn.rpush(&k.fence, "x").await.unwrap();
    let (before, _) = now(&mut conn).await;
    let reply: Value = acquire(&mut conn, &k, (OURS, 10_000, NOT_YET)).await;
    let token = token_of(&reply);
    assert!(token >= before);
    assert_eq!(key_type(&mut conn, &k.fence).await, "string");
    assert_eq!(get(&mut conn, &k.fence).await, Some(token.to_string()));
    assert!(pttl(&mut conn, &k.fence).await > 9_000);

    // Another program's list where the lock would be: WRONGTYPE, and nothing taken or drawn.
    let other = keys("odd-lock");
    let _: i64 = conn.rpush(&other.lock, "x").await.unwrap();
    let error = run::<Value>(
        &mut conn,
        "acquire",
        &[&other.lock, &other.fence],
        (OURS, 10_000, NOT_YET),
    )
    .await
    .unwrap_err();
    assert!(error.to_string().contains("WRONGTYPE"), "{error}");
    assert_eq!(key_type(&mut conn, &other.lock).await, "list");
    assert_eq!(get(&mut conn, &other.fence).await, None);
    // Among several keys, too: the free one is not taken.
    let _: i64 = conn.del(&k.lock).await.unwrap();
    let error = run::<Value>(
        &mut conn,
        "acquire",
        &[&k.lock, &other.lock, &k.fence, &other.fence],
        (OURS, 10_000, NOT_YET),
    )
    .await
    .unwrap_err();
    assert!(error.to_string().contains("WRONGTYPE"), "{error}");
    assert_eq!(get(&mut conn, &k.lock).await, None);
}

// ---- release.lua ----

#[tokio::test]
async fn a_release_of_our_unmarked_lock_deletes_it_without_a_word() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("plain");
    let mut channel = Channel::subscribe(&server, &k.lock).await;
    set_px(&mut conn, &k.lock, OURS, 30_000).await;
    set_px(&mut conn, &k.fence, "42", 30_000).await;
    // A fair waiter is queued, but nobody marked the lock: no hand-off either.
    let (_, ms) = now(&mut conn).await;
    enqueue(
        &mut conn,
        &k,
        FIRST,
        Some(format!("{} 2000 ab", ms + 60_000)),
    )
    .await;
    let released: i64 = release(&mut conn, &k, (OURS, "0", "PUBLISH", "0")).await;
    assert_eq!(released, 1);
    assert_eq!(get(&mut conn, &k.lock).await, None);
    assert_eq!(channel.published(&mut conn).await, Vec::<String>::new());
    assert_eq!(queue(&mut conn, &k).await.0, [FIRST]);
    assert_eq!(get(&mut conn, &k.fence).await.as_deref(), Some("42"));
}

#[tokio::test]
async fn a_release_of_our_marked_lock_deletes_and_announces_it() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("marked");
    let mut channel = Channel::subscribe(&server, &k.lock).await;
    set_px(&mut conn, &k.lock, &format!("~{OURS}"), 30_000).await;
    let released: i64 = release(&mut conn, &k, (OURS, "0", "PUBLISH", "0")).await;
    assert_eq!(released, 1);
    assert_eq!(get(&mut conn, &k.lock).await, None);
    assert_eq!(channel.published(&mut conn).await, [""]);
    // A quorum's release announces itself, marked or not.
    set_px(&mut conn, &k.lock, OURS, 30_000).await;
    let released: i64 = release(&mut conn, &k, (OURS, "0", "PUBLISH", "1")).await;
    assert_eq!(released, 1);
    assert_eq!(get(&mut conn, &k.lock).await, None);
    assert_eq!(channel.published(&mut conn).await, [""]);
}

#[tokio::test]
async fn a_release_never_touches_a_lock_another_owner_holds() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("foreign");
    let mut channel = Channel::subscribe(&server, &k.lock).await;
    let (_, ms) = now(&mut conn).await;
    enqueue(
        &mut conn,
        &k,
        FIRST,
        Some(format!("{} 2000 ab", ms + 60_000)),
    )
    .await;
    // Held by another owner, plain and marked; and one whose token starts with ours.
    for value in [
        THEIRS.to_owned(),
        format!("~{THEIRS}"),
        format!("{OURS}:x"),
        format!("~~{OURS}"),
    ] {
        set_px(&mut conn, &k.lock, &value, 30_000).await;
        for always in ["0", "1"] {
            let released: i64 = release(&mut conn, &k, (OURS, "0", "PUBLISH", always)).await;
            assert_eq!(released, 0, "{value}");
            assert_eq!(get(&mut conn, &k.lock).await, Some(value.clone()));
            assert!(pttl(&mut conn, &k.lock).await > 29_000);
        }
    }
    assert_eq!(channel.published(&mut conn).await, Vec::<String>::new());
    assert_eq!(queue(&mut conn, &k).await.0, [FIRST]);
    // Free: nothing released, nothing created.
    let _: i64 = conn.del(&k.lock).await.unwrap();
    let released: i64 = release(&mut conn, &k, (OURS, "0", "PUBLISH", "1")).await;
    assert_eq!(released, 0);
    assert_eq!(get(&mut conn, &k.lock).await, None);
}

#[tokio::test]
async fn a_release_hands_a_marked_lock_to_the_live_fair_waiter_with_a_signed_message() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("handed");
    let mut channel = Channel::subscribe(&server, &k.lock).await;
    set_px(&mut conn, &k.lock, &format!("~{OURS}"), 30_000).await;
    let (clock, ms) = now(&mut conn).await;
    set_px(&mut conn, &k.fence, &clock.to_string(), 30_000).await;
    let secret = "5ec7e7";
    enqueue(
        &mut conn,
        &k,
        FIRST,
        Some(format!("{} 1500 {secret}", ms + 60_000)),
    )
    .await;
    enqueue(
        &mut conn,
        &k,
        SECOND,
        Some(format!("{} 1500 00", ms + 60_000)),
    )
    .await;

    let released: i64 = release(&mut conn, &k, (OURS, "0", "PUBLISH", "0")).await;
    assert_eq!(released, 1);
    // The first waiter holds it for its claim, marked: the second still waits behind it.
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{FIRST}")));
    let claim = pttl(&mut conn, &k.lock).await;
    assert!((1_000..=1_500).contains(&claim), "{claim}");
    let published = channel.published(&mut conn).await;
    assert_eq!(published.len(), 1, "{published:?}");
    let handoff = handoff(&published[0], secret);
    assert_eq!(handoff.token, FIRST);
    assert_eq!(handoff.claim_ms, 1_500);
    let (_, after) = now(&mut conn).await;
    assert!((ms..=after).contains(&handoff.server_ms), "{handoff:?}");
    // Its fencing token is drawn from the counter, above the last one.
    assert!(handoff.fence > clock, "{handoff:?}");
    assert_eq!(
        get(&mut conn, &k.fence).await,
        Some(handoff.fence.to_string())
    );
    // Off the queue; the second waiter stays.
    let (list, entries) = queue(&mut conn, &k).await;
    assert_eq!(list, [SECOND]);
    assert!(!entries.contains_key(FIRST));
    assert!(entries.contains_key(SECOND));
}

#[tokio::test]
async fn a_release_skips_expired_and_dead_waiters_and_announces_when_none_is_left() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("dead");
    let mut channel = Channel::subscribe(&server, &k.lock).await;
    let (_, ms) = now(&mut conn).await;
    // The head's wait has passed; the second left no entry (a dead waiter); the third lives.
    enqueue(&mut conn, &k, FIRST, Some(format!("{} 2000 aa", ms - 1))).await;
    enqueue(&mut conn, &k, SECOND, None).await;
    enqueue(
        &mut conn,
        &k,
        THIRD,
        Some(format!("{} 2000 cc", ms + 60_000)),
    )
    .await;
    // An entry without its place in the queue (its waiter is gone) is never served.
    let _: i64 = conn
        .hset(&k.waiters, OURS, format!("{} 2000 dd", ms + 60_000))
        .await
        .unwrap();
    set_px(&mut conn, &k.lock, &format!("~{OURS}"), 30_000).await;

    let released: i64 = release(&mut conn, &k, (THEIRS, "0", "PUBLISH", "0")).await;
    assert_eq!(released, 0, "not THEIRS's lock");
    // Released by its owner, who is not the stray entry's waiter either.
    let released: i64 = release(&mut conn, &k, (OURS, "0", "PUBLISH", "0")).await;
    assert_eq!(released, 1);
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{THIRD}")));
    let published = channel.published(&mut conn).await;
    assert_eq!(published.len(), 1, "{published:?}");
    assert_eq!(handoff(&published[0], "cc").token, THIRD);
    let (list, entries) = queue(&mut conn, &k).await;
    assert!(list.is_empty(), "{list:?}");
    assert_eq!(entries.keys().collect::<Vec<_>>(), [OURS]);

    // Only expired or dead waiters: deleted and announced, the queue emptied.
    let _: i64 = conn.del(&k.waiters).await.unwrap();
    enqueue(&mut conn, &k, FIRST, Some(format!("{} 2000 aa", ms - 1))).await;
    enqueue(&mut conn, &k, SECOND, None).await;
    enqueue(&mut conn, &k, THIRD, Some("not an entry".to_owned())).await;
    let released: i64 = release(&mut conn, &k, (THIRD, "0", "PUBLISH", "0")).await;
    assert_eq!(released, 1);
    assert_eq!(get(&mut conn, &k.lock).await, None);
    assert_eq!(channel.published(&mut conn).await, [""]);
    let (list, entries) = queue(&mut conn, &k).await;
    assert!(
        list.is_empty() && entries.is_empty(),
        "{list:?} {entries:?}"
    );
}

#[tokio::test]
async fn a_release_that_may_have_queued_its_owner_takes_it_off_the_queue() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("leaving");
    let (_, ms) = now(&mut conn).await;
    set_px(&mut conn, &k.lock, THEIRS, 30_000).await;
    for token in [FIRST, OURS, SECOND] {
        enqueue(
            &mut conn,
            &k,
            token,
            Some(format!("{} 2000 ab", ms + 60_000)),
        )
        .await;
    }
    // Not queued: the queue stays as it is.
    let released: i64 = release(&mut conn, &k, (OURS, "0", "PUBLISH", "0")).await;
    assert_eq!(released, 0);
    assert_eq!(queue(&mut conn, &k).await.0, [FIRST, OURS, SECOND]);
    // Maybe queued (a fair waiter that gives up): it leaves, the others keep their places.
    let released: i64 = release(&mut conn, &k, (OURS, "1", "PUBLISH", "0")).await;
    assert_eq!(released, 0);
    let (list, entries) = queue(&mut conn, &k).await;
    assert_eq!(list, [FIRST, SECOND]);
    assert!(!entries.contains_key(OURS) && entries.len() == 2);
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some(THEIRS));
}

#[tokio::test]
async fn a_release_of_several_keys_releases_ours_and_skips_the_rest() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let (a, b, c, d) = (keys("m-a"), keys("m-b"), keys("m-c"), keys("m-d"));
    let mut channel = Channel::subscribe(&server, &b.lock).await;
    set_px(&mut conn, &a.lock, OURS, 30_000).await;
    set_px(&mut conn, &b.lock, &format!("~{OURS}"), 30_000).await;
    set_px(&mut conn, &c.lock, THEIRS, 30_000).await;
    // Overwritten by another program: not ours, and no reason to leave the others held.
    let _: i64 = conn.rpush(&d.lock, "x").await.unwrap();
    let mut all = Vec::new();
    for key in [&a, &d, &b, &c] {
        all.extend(key.for_release());
    }
    let released: i64 = run(&mut conn, "release", &all, (OURS, "0", "PUBLISH", "0"))
        .await
        .unwrap();
    assert_eq!(released, 2);
    assert_eq!(get(&mut conn, &a.lock).await, None);
    assert_eq!(get(&mut conn, &b.lock).await, None);
    assert_eq!(get(&mut conn, &c.lock).await.as_deref(), Some(THEIRS));
    assert_eq!(key_type(&mut conn, &d.lock).await, "list");
    assert_eq!(channel.published(&mut conn).await, [""]);
}

// ---- extend.lua ----

#[tokio::test]
async fn extend_prolongs_each_lease_that_holds_all_its_keys_and_touches_no_other() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let names = ["e1", "e2", "e3", "e4", "e5", "e6", "e7"];
    let k: Vec<String> = names.iter().map(|n| keys(n).lock).collect();
    set_px(&mut conn, &k[0], OURS, 1_000).await; // ours, plain
    set_px(&mut conn, &k[1], &format!("~{OURS}"), 1_000).await; // ours, marked
    set_px(&mut conn, &k[2], THEIRS, 1_000).await; // another owner's
                                                   // k[3] is gone
    let _: i64 = conn.rpush(&k[4], "x").await.unwrap(); // another program's list
    set_px(&mut conn, &k[5], &format!("~{FIRST}"), 1_000).await; // FIRST's, marked
    set_px(&mut conn, &k[6], FIRST, 1_000).await; // FIRST's, plain
                                                  // Lease 1: ours, on a plain and a marked key. Lease 2: ours, and one key another owner
                                                  // holds. Lease 3: a gone key. Lease 4: a list. Lease 5: FIRST's two keys, one marked.
    let keys: Vec<&str> = [0, 1, 0, 2, 3, 4, 5, 6]
        .iter()
        .map(|&i| k[i].as_str())
        .collect();
    let args = (
        (OURS, 60_000, 2),
        (OURS, 60_000, 2),
        (SECOND, 60_000, 1),
        (THIRD, 60_000, 1),
        (FIRST, 60_000, 2),
    );
    let extended: Vec<i64> = run(&mut conn, "extend", &keys, args).await.unwrap();
    assert_eq!(extended, [1, 0, 0, 0, 1]);
    for i in [0, 1, 5, 6] {
        assert!(pttl(&mut conn, &k[i]).await > 59_000, "{}", names[i]);
    }
    // Untouched: another owner's key keeps its ttl, a gone key stays gone, a list stays.
    assert!(pttl(&mut conn, &k[2]).await <= 1_000);
    assert_eq!(get(&mut conn, &k[2]).await.as_deref(), Some(THEIRS));
    assert_eq!(get(&mut conn, &k[3]).await, None);
    assert_eq!(pttl(&mut conn, &k[4]).await, -1);
    // A lease with one key lost is not extended at all, not even its key that is still held.
    set_px(&mut conn, &k[0], OURS, 1_000).await;
    let extended: Vec<i64> = run(&mut conn, "extend", &[&*k[0], &k[2]], (OURS, 60_000, 2))
        .await
        .unwrap();
    assert_eq!(extended, [0]);
    assert!(pttl(&mut conn, &k[0]).await <= 1_000);
    // Another owner's token never extends ours, marked or not.
    let extended: Vec<i64> = run(
        &mut conn,
        "extend",
        &[&*k[0], &k[1]],
        ((THEIRS, 60_000, 1), (THEIRS, 60_000, 1)),
    )
    .await
    .unwrap();
    assert_eq!(extended, [0, 0]);
}

// ---- fair/acquire.lua ----

/// `fair_acquire`'s arguments for `token`: ttl 30 s, claim 2 s, `wait` ms, its secret.
fn fair_args(
    token: &'static str,
    wait: u64,
    secret: &'static str,
    waited: &'static str,
) -> impl ToRedisArgs {
    (token, 30_000, 2_000, wait, secret, "PUBLISH", waited)
}

#[tokio::test]
async fn a_fair_acquire_of_a_free_key_with_nobody_queued_takes_it() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("fair-free");
    let reply: Value = fair_acquire(&mut conn, &k, fair_args(OURS, 5_000, "aa", NOT_YET)).await;
    let token = token_of(&reply);
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some(OURS));
    assert!(pttl(&mut conn, &k.lock).await > 29_000);
    assert_eq!(get(&mut conn, &k.fence).await, Some(token.to_string()));
    // One that has waited takes it marked.
    let _: i64 = conn.del(&k.lock).await.unwrap();
    let reply: Value = fair_acquire(&mut conn, &k, fair_args(OURS, 5_000, "aa", WAITED)).await;
    assert!(token_of(&reply) > token);
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{OURS}")));
    assert!(!conn.exists::<_, bool>(&k.queue).await.unwrap());
}

#[tokio::test]
async fn a_fair_acquire_of_a_held_key_queues_once_and_marks_the_holder() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("fair-held");
    set_px(&mut conn, &k.lock, THEIRS, 5_000).await;
    // A try (no wait left): neither queued nor marking.
    let reply: Value = fair_acquire(&mut conn, &k, fair_args(OURS, 0, "aa", NOT_YET)).await;
    let fields: Vec<i64> = FromRedisValue::from_redis_value(reply).unwrap();
    assert_eq!(fields[0], 0);
    assert!((4_000..=5_000).contains(&fields[1]));
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some(THEIRS));
    assert!(queue(&mut conn, &k).await.0.is_empty());

    let (_, before) = now(&mut conn).await;
    let reply: Value = fair_acquire(&mut conn, &k, fair_args(OURS, 10_000, "aa", NOT_YET)).await;
    let fields: Vec<i64> = FromRedisValue::from_redis_value(reply).unwrap();
    let (_, after) = now(&mut conn).await;
    assert_eq!(fields[0], 0);
    assert!((4_000..=5_000).contains(&fields[1]));
    let server_ms = u64::try_from(fields[2]).unwrap();
    assert!((before..=after).contains(&server_ms));
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{THEIRS}")));
    assert!((4_000..=5_000).contains(&pttl(&mut conn, &k.lock).await));
    let (list, entries) = queue(&mut conn, &k).await;
    assert_eq!(list, [OURS]);
    assert_eq!(entries[OURS], format!("{} 2000 aa", server_ms + 10_000));
    // The queue lives as long as the wait and a claim.
    for key in [&k.queue, &k.waiters] {
        assert!((11_000..=12_000).contains(&pttl(&mut conn, key).await));
    }
    // A later attempt keeps its place, with its new secret, and does not mark twice.
    set_px(&mut conn, &k.lock, &format!("~{THEIRS}"), 5_000).await;
    let _: Value = fair_acquire(&mut conn, &k, fair_args(OURS, 9_000, "bb", WAITED)).await;
    let (list, entries) = queue(&mut conn, &k).await;
    assert_eq!(list, [OURS]);
    assert!(entries[OURS].ends_with(" 2000 bb"), "{entries:?}");
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{THEIRS}")));
    // Another waiter queues behind.
    let _: Value = fair_acquire(&mut conn, &k, fair_args(SECOND, 20_000, "cc", NOT_YET)).await;
    assert_eq!(queue(&mut conn, &k).await.0, [OURS, SECOND]);
    assert!(pttl(&mut conn, &k.queue).await > 21_000);
}

#[tokio::test]
async fn a_fair_acquire_of_a_free_key_serves_the_first_live_waiter_before_itself() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("fair-line");
    let mut channel = Channel::subscribe(&server, &k.lock).await;
    let (_, ms) = now(&mut conn).await;
    enqueue(&mut conn, &k, FIRST, Some(format!("{} 1500 aa", ms - 1))).await; // expired
    enqueue(
        &mut conn,
        &k,
        SECOND,
        Some(format!("{} 1500 bb", ms + 60_000)),
    )
    .await;
    let reply: Value = fair_acquire(&mut conn, &k, fair_args(OURS, 10_000, "cc", NOT_YET)).await;
    let fields: Vec<i64> = FromRedisValue::from_redis_value(reply).unwrap();
    assert_eq!(fields[0], 0);
    // Handed to the live waiter that was first in line; the caller queued behind it.
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{SECOND}")));
    assert!((1_000..=1_500).contains(&fields[1]), "{fields:?}");
    let published = channel.published(&mut conn).await;
    assert_eq!(published.len(), 1, "{published:?}");
    let handoff = handoff(&published[0], "bb");
    assert_eq!((handoff.token.as_str(), handoff.claim_ms), (SECOND, 1_500));
    assert_eq!(
        get(&mut conn, &k.fence).await,
        Some(handoff.fence.to_string())
    );
    assert_eq!(queue(&mut conn, &k).await.0, [OURS]);

    // Free again (the claim lapsed), the caller first in line: taken, marked for those who
    // may queue behind it, and nothing published.
    let _: i64 = conn.del(&k.lock).await.unwrap();
    let reply: Value = fair_acquire(&mut conn, &k, fair_args(OURS, 10_000, "ee", NOT_YET)).await;
    assert!(token_of(&reply) > handoff.fence);
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{OURS}")));
    assert!(pttl(&mut conn, &k.lock).await > 29_000);
    let (list, entries) = queue(&mut conn, &k).await;
    assert!(
        list.is_empty() && entries.is_empty(),
        "{list:?} {entries:?}"
    );
    assert_eq!(channel.published(&mut conn).await, Vec::<String>::new());
}

#[tokio::test]
async fn a_fair_acquire_confirms_a_hand_off_with_a_greater_token_and_its_own_ttl() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("fair-confirm");
    let (clock, _) = now(&mut conn).await;
    // Handed to us: marked, for the claim, with the hand-off's token in the counter.
    set_px(&mut conn, &k.lock, &format!("~{OURS}"), 2_000).await;
    set_px(
        &mut conn,
        &k.fence,
        &(clock + 1_000_000).to_string(),
        30_000,
    )
    .await;
    let reply: Value = fair_acquire(&mut conn, &k, fair_args(OURS, 10_000, "aa", NOT_YET)).await;
    assert_eq!(token_of(&reply), clock + 1_000_001);
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{OURS}")));
    assert!(pttl(&mut conn, &k.lock).await > 29_000);
    // Ours unmarked (a retried request): taken as it is.
    set_px(&mut conn, &k.lock, OURS, 2_000).await;
    let reply: Value = fair_acquire(&mut conn, &k, fair_args(OURS, 10_000, "aa", NOT_YET)).await;
    assert_eq!(token_of(&reply), clock + 1_000_002);
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some(OURS));
}

// ---- raise.lua ----

#[tokio::test]
async fn raise_lifts_counters_below_the_token_missing_or_of_another_type_and_no_other() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let (clock, _) = now(&mut conn).await;
    let token = clock + 10_000_000;
    let [below, missing, list, above, shorter] =
        ["r1", "r2", "r3", "r4", "r5"].map(|n| keys(n).fence);
    set_px(&mut conn, &below, &(token - 5).to_string(), 60_000).await;
    let _: i64 = conn.rpush(&list, "x").await.unwrap();
    set_px(&mut conn, &above, &(token + 5).to_string(), 60_000).await;
    set_px(&mut conn, &shorter, "99", 60_000).await;
    let raised: i64 = run(
        &mut conn,
        "raise",
        &[&*below, &missing, &list, &above, &shorter],
        (token, 5_000),
    )
    .await
    .unwrap();
    assert_eq!(raised, 4);
    for counter in [&below, &missing, &list, &shorter] {
        assert_eq!(get(&mut conn, counter).await, Some(token.to_string()));
        // The ttl, and as long again as the token is ahead of the clock.
        let kept = pttl(&mut conn, counter).await;
        assert!((14_000..=15_000).contains(&kept), "{kept}");
    }
    assert_eq!(get(&mut conn, &above).await, Some((token + 5).to_string()));
    assert!(pttl(&mut conn, &above).await > 59_000);
}

// ---- inspect.lua ----

#[tokio::test]
async fn inspect_reads_a_lock_without_its_mark_and_changes_nothing() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("seen");
    let read = [&*k.lock, &k.fence, &k.waiters];
    let free: Value = run(&mut conn, "inspect", &read, NO_ARGS).await.unwrap();
    assert_eq!(free, Value::Nil);
    let (_, ms) = now(&mut conn).await;
    enqueue(
        &mut conn,
        &k,
        FIRST,
        Some(format!("{} 2000 aa", ms + 60_000)),
    )
    .await;
    enqueue(
        &mut conn,
        &k,
        SECOND,
        Some(format!("{} 2000 bb", ms + 60_000)),
    )
    .await;
    set_px(&mut conn, &k.fence, "1234", 60_000).await;
    for value in [THEIRS.to_owned(), format!("~{THEIRS}")] {
        set_px(&mut conn, &k.lock, &value, 5_000).await;
        let (owner, remaining, counter, waiters): (String, i64, String, i64) =
            run(&mut conn, "inspect", &read, NO_ARGS).await.unwrap();
        assert_eq!(owner, THEIRS, "{value}");
        assert!((4_000..=5_000).contains(&remaining));
        assert_eq!((counter.as_str(), waiters), ("1234", 2));
        assert_eq!(get(&mut conn, &k.lock).await, Some(value));
    }
    // Counter and entries of other types read as none; a lock of another type as free.
    let _: i64 = conn.del(&[&k.fence, &k.waiters]).await.unwrap();
    let _: i64 = conn.rpush(&k.fence, "x").await.unwrap();
    let _: i64 = conn.rpush(&k.waiters, "x").await.unwrap();
    let (_, _, counter, waiters): (String, i64, String, i64) =
        run(&mut conn, "inspect", &read, NO_ARGS).await.unwrap();
    assert_eq!((counter.as_str(), waiters), ("", 0));
    let _: i64 = conn.del(&k.lock).await.unwrap();
    let _: i64 = conn.rpush(&k.lock, "x").await.unwrap();
    let odd: Value = run(&mut conn, "inspect", &read, NO_ARGS).await.unwrap();
    assert_eq!(odd, Value::Nil);
}

// ---- force_release.lua ----

#[tokio::test]
async fn force_release_deletes_whoever_holds_and_hands_over_to_a_live_waiter() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("forced");
    let mut channel = Channel::subscribe(&server, &k.lock).await;
    let force = |conn: &mut MultiplexedConnection| {
        let mut conn = conn.clone();
        let keys = k.for_release().map(str::to_owned);
        async move {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            run::<i64>(&mut conn, "force_release", &keys, "PUBLISH")
                .await
                .unwrap()
        }
    };
    assert_eq!(force(&mut conn).await, 0);
    for value in [THEIRS.to_owned(), format!("~{THEIRS}")] {
        set_px(&mut conn, &k.lock, &value, 30_000).await;
        assert_eq!(force(&mut conn).await, 1);
        assert_eq!(get(&mut conn, &k.lock).await, None);
        assert_eq!(channel.published(&mut conn).await, [""]);
    }
    // A live waiter (behind an expired one) is handed the lock.
    let (_, ms) = now(&mut conn).await;
    enqueue(&mut conn, &k, FIRST, Some(format!("{} 1500 aa", ms - 1))).await;
    enqueue(
        &mut conn,
        &k,
        SECOND,
        Some(format!("{} 1500 bb", ms + 60_000)),
    )
    .await;
    set_px(&mut conn, &k.lock, THEIRS, 30_000).await;
    assert_eq!(force(&mut conn).await, 1);
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{SECOND}")));
    let published = channel.published(&mut conn).await;
    assert_eq!(published.len(), 1, "{published:?}");
    let handoff = handoff(&published[0], "bb");
    assert_eq!(handoff.token, SECOND);
    assert_eq!(
        get(&mut conn, &k.fence).await,
        Some(handoff.fence.to_string())
    );
    assert!(queue(&mut conn, &k).await.0.is_empty());
}

// ---- check.lua ----

#[tokio::test]
async fn check_finds_nothing_missing_for_a_full_user_and_names_what_a_limited_one_lacks() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("check");
    let args: &[&str] = &[
        &k.lock,
        &k.fence,
        &k.queue,
        &k.waiters,
        "PUBLISH",
        "SUBSCRIBE",
        "UNSUBSCRIBE",
        "SELECT 0",
    ];
    let (missing, publish, subscribe): (Vec<String>, i64, i64) =
        run(&mut conn, "check", &[], args).await.unwrap();
    assert_eq!((missing, publish, subscribe), (vec![], 1, 1));
    server.command(&[
        "ACL",
        "SETUSER",
        "limited",
        "on",
        ">pw",
        "~*",
        "+@all",
        "-hset",
        "-select",
        "resetchannels",
    ]);
    let url = format!("redis://limited:pw@127.0.0.1:{}", server.port());
    let mut limited = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (missing, publish, subscribe): (Vec<String>, i64, i64) =
        run(&mut limited, "check", &[], args).await.unwrap();
    assert_eq!(
        missing,
        [format!("HSET {}", k.waiters), "SELECT 0".to_owned()]
    );
    assert_eq!((publish, subscribe), (0, 0));
    // It writes nothing.
    let written: Vec<String> = conn.keys("*").await.unwrap();
    assert!(written.is_empty(), "{written:?}");
}

// ---- key_types.lua ----

#[tokio::test]
async fn key_types_names_each_keys_type() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let _: () = conn.set("s", "x").await.unwrap();
    let _: i64 = conn.hset("h", "f", "x").await.unwrap();
    let _: i64 = conn.rpush("l", "x").await.unwrap();
    let _: i64 = conn.sadd("z", "x").await.unwrap();
    let types: Vec<String> = run(
        &mut conn,
        "key_types",
        &["gone", "s", "h", "l", "z"],
        NO_ARGS,
    )
    .await
    .unwrap();
    assert_eq!(types, ["none", "string", "hash", "list", "other"]);
    // And changes none of them.
    let list: Vec<String> = conn.lrange("l", 0, -1).await.unwrap();
    assert_eq!(list, ["x"]);
}
