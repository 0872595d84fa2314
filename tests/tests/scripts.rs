//! Every Lua script distlock sends, run directly (`EVAL`) against a real `redis-server` from a
//! state set up by hand with raw commands: free, held by us, held by another owner, held and
//! marked as waited on (`~` + token) by either, held shared or as permits by live and expired
//! members, an expired queue head, a dead waiter's entry, waiters of each mode, a counter of
//! another type, a counter ahead of the clock, a replayed acquire. Each test checks the reply and
//! what the script left behind: keys, ttls, members and their scores, queue, and the messages on
//! the lock's channel. The scripts' contracts are at the top of their files in
//! `distlock-runtime/src/scripts/` and `src/fair/`; the texts run here are the runtime's own, as
//! composed for Redis (`__private::script`). The shared functions they are composed from are
//! called on their own too, at the end.

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

/// The modes a lease holds a key in (`scripts/holders.lua`); one of N permits is N's digits.
const EXCLUSIVE: &str = "x";
const SHARED: &str = "r";

/// Whether a request waits, as the acquires take it (`Waiting` in the runtime's
/// `scripts/flags.rs`).
const NOT_YET: &str = "0";
const WAITED: &str = "1";
const NEVER: &str = "-";

/// Whether a releasing owner may be queued as a fair waiter (`Queued`).
const NOT_QUEUED: &str = "0";
const MAYBE_QUEUED: &str = "1";

/// Which releases announce themselves (`Announce`): those of keys marked as waited on, or all.
const WAITED_ON: &str = "0";
const ALWAYS: &str = "1";

/// No arguments.
const NO_ARGS: &[&str] = &[];

/// Every script this file runs: a script added to the runtime must be added here, with tests.
const COVERED: [&str; 10] = [
    "acquire",
    "release",
    "extend",
    "fair_acquire",
    "fair_refresh",
    "raise",
    "inspect",
    "force_release",
    "check",
    "key_types",
];

/// The Redis keys of the lock on one key under the default prefix (the runtime's `keys.rs`),
/// and the mode a request holds it in.
#[derive(Clone)]
struct Keys {
    lock: String,
    fence: String,
    queue: String,
    waiters: String,
    holders: String,
    mode: &'static str,
}

/// The keys of the lock on `key`, held exclusively.
fn keys(key: &str) -> Keys {
    Keys {
        lock: format!("distlock:lock:{{{key}}}"),
        fence: format!("distlock:fence:{{{key}}}"),
        queue: format!("distlock:queue:{{{key}}}"),
        waiters: format!("distlock:waiters:{{{key}}}"),
        holders: format!("distlock:holders:{{{key}}}"),
        mode: EXCLUSIVE,
    }
}

impl Keys {
    /// The same lock, held in `mode`.
    fn held(&self, mode: &'static str) -> Self {
        Self {
            mode,
            ..self.clone()
        }
    }

    /// The five keys the scripts that serve the fair queue take per lock (release, fair
    /// acquire, force release), in their order.
    fn served(&self) -> [&str; 5] {
        [
            &self.lock,
            &self.queue,
            &self.waiters,
            &self.fence,
            &self.holders,
        ]
    }

    /// The key a renewal extends: the lock key when held exclusively, else the holders.
    fn lease(&self) -> &str {
        if self.mode == EXCLUSIVE {
            &self.lock
        } else {
            &self.holders
        }
    }

    /// The keys EXTEND takes for this lock: the one its lease holds, the fencing counter, and
    /// the lock key when held by a member (its `holders` covers the member).
    fn extended(&self) -> Vec<&str> {
        let mut keys = vec![self.lease(), &*self.fence];
        if self.mode != EXCLUSIVE {
            keys.push(&self.lock);
        }
        keys
    }

    /// `token`'s member among the holders: its token when shared, `N token` as a permit.
    fn member(&self, token: &str) -> String {
        if self.mode == SHARED {
            token.to_owned()
        } else {
            format!("{} {token}", self.mode)
        }
    }
}

/// The modes of `locks`, one word each, space-separated, as the scripts take them.
fn modes(locks: &[&Keys]) -> String {
    locks.iter().map(|k| k.mode).collect::<Vec<_>>().join(" ")
}

/// A connection to `server` as ACL user `user` (password `pw`), set up with `rules`.
async fn connect_as(server: &RedisServer, user: &str, rules: &[&str]) -> MultiplexedConnection {
    let mut setuser = vec!["ACL", "SETUSER", user, "on", ">pw"];
    setuser.extend_from_slice(rules);
    assert_eq!(server.command(&setuser).trim(), "+OK", "{setuser:?}");
    let url = format!("redis://{user}:pw@127.0.0.1:{}", server.port());
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
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

/// An acquire by one owner: its token, its ttl in ms, and whether it waits (`NOT_YET`, ...).
type Taking<'a> = (&'a str, u64, &'a str);

/// ACQUIRE of `locks`, each in its mode, with `floor` as the proposed fencing token, if any.
async fn try_acquire(
    conn: &mut MultiplexedConnection,
    locks: &[&Keys],
    (token, ttl, waiting): Taking<'_>,
    floor: Option<u64>,
) -> RedisResult<Value> {
    // The holders and queues only when some key is not taken exclusively.
    let exclusive = locks.iter().all(|k| k.mode == EXCLUSIVE);
    let keys: Vec<&str> = locks
        .iter()
        .map(|k| k.lock.as_str())
        .chain(locks.iter().map(|k| k.fence.as_str()))
        .chain(
            locks
                .iter()
                .filter(|_| !exclusive)
                .map(|k| k.holders.as_str()),
        )
        .chain(
            locks
                .iter()
                .filter(|_| !exclusive)
                .map(|k| k.queue.as_str()),
        )
        .chain(
            locks
                .iter()
                .filter(|_| !exclusive)
                .map(|k| k.waiters.as_str()),
        )
        .collect();
    let args = (token, ttl, waiting, modes(locks), floor);
    run(conn, "acquire", &keys, args).await
}

/// ACQUIRE of `locks`, each in its mode, without a proposed token.
async fn acquire(conn: &mut MultiplexedConnection, locks: &[&Keys], taking: Taking<'_>) -> Value {
    try_acquire(conn, locks, taking, None).await.unwrap()
}

/// RELEASE of `locks`, each in its mode, by `token`: how many it released.
async fn release(
    conn: &mut MultiplexedConnection,
    locks: &[&Keys],
    (token, queued, announce): (&str, &str, &str),
) -> i64 {
    let keys: Vec<&str> = locks.iter().flat_map(|k| k.served()).collect();
    let args = (token, queued, "PUBLISH", announce, modes(locks));
    run(conn, "release", &keys, args).await.unwrap()
}

/// FAIR_ACQUIRE of `k` in its mode by `token` for 30 s, with a claim of 2 s, waiting `wait` ms
/// more, with its attempt's `secret`.
async fn fair_acquire(
    conn: &mut MultiplexedConnection,
    k: &Keys,
    (token, wait, secret, waiting): (&str, u64, &str, &str),
) -> Value {
    let args = (
        token, 30_000, 2_000, wait, secret, "PUBLISH", waiting, k.mode,
    );
    run(conn, "fair_acquire", &k.served(), args).await.unwrap()
}

/// EXTEND of `leases` (each its owner's token and its keys, each in its mode) by `ttl` ms:
/// whether each was extended.
async fn extend(
    conn: &mut MultiplexedConnection,
    ttl: u64,
    leases: &[(&str, Vec<&Keys>)],
) -> Vec<i64> {
    let keys: Vec<&str> = leases
        .iter()
        .flat_map(|(_, locks)| locks.iter().flat_map(|k| k.extended()))
        .collect();
    let args: Vec<(&str, u64, String)> = leases
        .iter()
        .map(|(token, locks)| (*token, ttl, modes(locks)))
        .collect();
    run(conn, "extend", &keys, args).await.unwrap()
}

/// What INSPECT tells of a held lock.
#[derive(Debug)]
struct Holding {
    kind: String,
    remaining: i64,
    counter: String,
    waiters: i64,
    holders: i64,
    /// The live fair waiters in arrival order: `(token, mode)`.
    queued: Vec<(String, String)>,
    members: Vec<String>,
}

/// INSPECT of `k`: `None` when it answers that the lock is free.
async fn inspect(conn: &mut MultiplexedConnection, k: &Keys) -> Option<Holding> {
    let keys = [&*k.lock, &k.fence, &k.waiters, &k.holders, &k.queue];
    let reply: Option<Vec<Value>> = run(conn, "inspect", &keys, NO_ARGS).await.unwrap();
    let fields = reply?;
    let text = |v: &Value| String::from_redis_value(v.clone()).unwrap();
    let int = |v: &Value| i64::from_redis_value(v.clone()).unwrap();
    let [kind, remaining, counter, waiters, holders, queued, members @ ..] = fields.as_slice()
    else {
        panic!("not an inspect reply: {fields:?}")
    };
    let queued: Vec<String> = Vec::from_redis_value(queued.clone()).unwrap();
    Some(Holding {
        kind: text(kind),
        remaining: int(remaining),
        counter: text(counter),
        waiters: int(waiters),
        holders: int(holders),
        queued: queued
            .chunks(2)
            .map(|pair| (pair[0].clone(), pair[1].clone()))
            .collect(),
        members: members.iter().map(text).collect(),
    })
}

/// FORCE_RELEASE of `k`: 1 when it was held.
async fn force_release(conn: &mut MultiplexedConnection, k: &Keys) -> i64 {
    run(
        conn,
        "force_release",
        &k.served(),
        ("PUBLISH", "distlock:forced", "k"),
    )
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

async fn exists(conn: &mut MultiplexedConnection, key: &str) -> bool {
    conn.exists(key).await.unwrap()
}

async fn key_type(conn: &mut MultiplexedConnection, key: &str) -> String {
    redis::cmd("TYPE").arg(key).query_async(conn).await.unwrap()
}

/// Makes `token` a holder of `k` in its mode by hand, as the scripts do: its member, scored by
/// its expiry `at` (Redis time, ms), and the lock key holding `holders` until then, unless that
/// has passed.
async fn hold(conn: &mut MultiplexedConnection, k: &Keys, token: &str, at: u64) {
    let _: usize = conn.zadd(&k.holders, k.member(token), at).await.unwrap();
    if at > now(conn).await.1 {
        let _: Option<String> = redis::cmd("SET")
            .arg(&k.lock)
            .arg("holders")
            .arg("NX")
            .arg("PXAT")
            .arg(at)
            .query_async(conn)
            .await
            .unwrap();
        let _: i64 = redis::cmd("PEXPIREAT")
            .arg(&k.lock)
            .arg(at)
            .arg("GT")
            .query_async(conn)
            .await
            .unwrap();
    }
}

/// The expiry (score, Redis ms) of `token`'s member among `k`'s holders, in `k`'s mode.
async fn expiry(conn: &mut MultiplexedConnection, k: &Keys, token: &str) -> Option<u64> {
    let score: Option<f64> = conn.zscore(&k.holders, k.member(token)).await.unwrap();
    // Scores are whole milliseconds, far below 2^53.
    score.map(|ms| ms as u64)
}

/// `k`'s holders, in order of expiry.
async fn members(conn: &mut MultiplexedConnection, k: &Keys) -> Vec<String> {
    conn.zrange(&k.holders, 0, -1).await.unwrap()
}

/// A fair waiter's entry: `"deadline_ms claim_ms secret mode"`.
fn entry(deadline: u64, claim: u64, secret: &str, mode: &str) -> String {
    format!("{deadline} {claim} {secret} {mode}")
}

/// Queues `token` as a fair waiter of `k` by hand: its place in the queue and its `entry`.
async fn enqueue(conn: &mut MultiplexedConnection, k: &Keys, token: &str, entry: &str) {
    let _: i64 = conn.rpush(&k.queue, token).await.unwrap();
    let _: i64 = conn.hset(&k.waiters, token, entry).await.unwrap();
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

/// A fair acquire's answer when it queued (or would have): `[0, pttl, server_ms]`.
fn queued(reply: Value) -> (i64, u64) {
    let fields: Vec<i64> = FromRedisValue::from_redis_value(reply).unwrap();
    match fields.as_slice() {
        [0, pttl, server_ms] => (*pttl, u64::try_from(*server_ms).unwrap()),
        _ => panic!("not queued: {fields:?}"),
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
    let reply = acquire(&mut conn, &[&k], (OURS, 30_000, NOT_YET)).await;
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
        let reply = acquire(&mut conn, &[&k], (OURS, 30_000, waiting)).await;
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
    let reply = acquire(&mut conn, &[&k], (OURS, 30_000, NEVER)).await;
    let (index, remaining) = held(&reply).expect("held");
    assert_eq!(index, 1);
    assert!((4_000..=5_000).contains(&remaining), "{remaining}");
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some(THEIRS));

    // A request that will wait marks the holder, keeping its ttl; one that has waited too.
    for waiting in [NOT_YET, WAITED] {
        set_px(&mut conn, &k.lock, THEIRS, 5_000).await;
        let reply = acquire(&mut conn, &[&k], (OURS, 30_000, waiting)).await;
        assert_eq!(held(&reply).map(|h| h.0), Some(1));
        assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{THEIRS}")));
        assert!((4_000..=5_000).contains(&pttl(&mut conn, &k.lock).await));
    }
    // A holder marked already stays marked once.
    let reply = acquire(&mut conn, &[&k], (OURS, 30_000, NOT_YET)).await;
    assert!(held(&reply).is_some());
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{THEIRS}")));
    // No token was drawn for a lock not taken.
    assert_eq!(get(&mut conn, &k.fence).await.as_deref(), Some("7"));
    // A held key without expiry answers -1.
    let _: () = conn.set(&k.lock, THEIRS).await.unwrap();
    let reply = acquire(&mut conn, &[&k], (OURS, 30_000, NEVER)).await;
    assert_eq!(held(&reply), Some((1, -1)));
}

#[tokio::test]
async fn an_acquire_sent_again_with_the_same_token_takes_the_key_again_with_a_greater_token() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("replayed");
    let first = acquire(&mut conn, &[&k], (OURS, 1_000, NOT_YET)).await;
    // The same request, re-sent (its answer was lost): ours already, so taken again, its ttl
    // counted from now.
    let again = acquire(&mut conn, &[&k], (OURS, 60_000, NOT_YET)).await;
    assert!(token_of(&again) > token_of(&first));
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some(OURS));
    assert!(pttl(&mut conn, &k.lock).await > 59_000);
    // Ours and marked as waited on (a hand-off, or someone waits): it stays marked.
    set_px(&mut conn, &k.lock, &format!("~{OURS}"), 1_000).await;
    let marked = acquire(&mut conn, &[&k], (OURS, 60_000, NEVER)).await;
    assert!(token_of(&marked) > token_of(&again));
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{OURS}")));
    assert!(pttl(&mut conn, &k.lock).await > 59_000);
    // Several keys, one ours marked, one ours plain, one free: all taken, the mark kept.
    let (a, b, c) = (keys("replayed"), keys("replayed-b"), keys("replayed-c"));
    set_px(&mut conn, &b.lock, OURS, 1_000).await;
    let all = acquire(&mut conn, &[&a, &b, &c], (OURS, 60_000, NOT_YET)).await;
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
    let all = [&a, &b, &c];
    // b held (marked by someone else's waiter already), c held plain: nothing is taken, the
    // first held key (b) is marked, and the longest ttl among the held keys is answered.
    set_px(&mut conn, &b.lock, &format!("~{THEIRS}"), 3_000).await;
    set_px(&mut conn, &c.lock, THEIRS, 8_000).await;
    let reply = acquire(&mut conn, &all, (OURS, 30_000, NOT_YET)).await;
    let (index, longest) = held(&reply).expect("held");
    assert_eq!(index, 2);
    assert!((7_000..=8_000).contains(&longest), "{longest}");
    assert_eq!(get(&mut conn, &a.lock).await, None);
    assert_eq!(get(&mut conn, &b.lock).await, Some(format!("~{THEIRS}")));
    // Only the first held key is marked: that is the one a waiter waits for.
    assert_eq!(get(&mut conn, &c.lock).await.as_deref(), Some(THEIRS));
    for key in all {
        assert_eq!(get(&mut conn, &key.fence).await, None);
    }
    // A held key without expiry makes the answer -1.
    let _: () = conn.set(&c.lock, THEIRS).await.unwrap();
    let reply = acquire(&mut conn, &all, (OURS, 30_000, NOT_YET)).await;
    assert_eq!(held(&reply), Some((2, -1)));
    // All free: all taken, with one token in every counter.
    let _: i64 = conn.del(&[&b.lock, &c.lock]).await.unwrap();
    let reply = acquire(&mut conn, &all, (OURS, 30_000, WAITED)).await;
    let token = token_of(&reply);
    for key in all {
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
    let reply = acquire(&mut conn, &[&one], (OURS, 10_000, NOT_YET)).await;
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
    let reply = acquire(&mut conn, &[&one, &two], (OURS, 10_000, NOT_YET)).await;
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
    let taking = (OURS, 10_000, NOT_YET);
    let (clock, _) = now(&mut conn).await;
    // A quorum's proposal, ahead of this server's clock by 20 s.
    let floor = clock + 20_000_000;
    let reply = try_acquire(&mut conn, &[&k], taking, Some(floor)).await;
    assert_eq!(token_of(&reply.unwrap()), floor);
    assert_eq!(get(&mut conn, &k.fence).await, Some(floor.to_string()));
    // The counter lives the ttl plus how far the token is ahead of the clock.
    let kept = pttl(&mut conn, &k.fence).await;
    assert!((29_000..=30_000).contains(&kept), "{kept}");
    // A proposal below the counter: one more than the counter.
    let _: i64 = conn.del(&k.lock).await.unwrap();
    let reply = try_acquire(&mut conn, &[&k], taking, Some(floor - 5)).await;
    assert_eq!(token_of(&reply.unwrap()), floor + 1);
    // A proposal below the clock: the clock.
    let _: i64 = conn.del(&[&k.lock, &k.fence]).await.unwrap();
    let reply = try_acquire(&mut conn, &[&k], taking, Some(clock - 1_000_000)).await;
    let (after, _) = now(&mut conn).await;
    assert!((clock..=after).contains(&token_of(&reply.unwrap())));
}

#[tokio::test]
async fn a_counter_of_another_type_is_overwritten_and_a_lock_of_another_type_is_an_error() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("odd");
    // Another program's list where the counter would be: the token goes on from the clock.
    let _: i64 = conn.rpush(&k.fence, "x").await.unwrap();
    let (before, _) = now(&mut conn).await;
    let reply = acquire(&mut conn, &[&k], (OURS, 10_000, NOT_YET)).await;
    let token = token_of(&reply);
    assert!(token >= before);
    assert_eq!(key_type(&mut conn, &k.fence).await, "string");
    assert_eq!(get(&mut conn, &k.fence).await, Some(token.to_string()));
    assert!(pttl(&mut conn, &k.fence).await > 9_000);

    // Another program's list where the lock would be: WRONGTYPE, and nothing taken or drawn.
    let other = keys("odd-lock");
    let _: i64 = conn.rpush(&other.lock, "x").await.unwrap();
    let error = try_acquire(&mut conn, &[&other], (OURS, 10_000, NOT_YET), None)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("WRONGTYPE"), "{error}");
    assert_eq!(key_type(&mut conn, &other.lock).await, "list");
    assert_eq!(get(&mut conn, &other.fence).await, None);
    // Among several keys, too: the free one is not taken.
    let _: i64 = conn.del(&k.lock).await.unwrap();
    let error = try_acquire(&mut conn, &[&k, &other], (OURS, 10_000, NOT_YET), None)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("WRONGTYPE"), "{error}");
    assert_eq!(get(&mut conn, &k.lock).await, None);
}

#[tokio::test]
async fn a_shared_acquire_joins_the_holders_scored_by_its_expiry_and_keeps_them_alive() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("readers").held(SHARED);
    let (_, ms) = now(&mut conn).await;
    // Another reader holds it for 5 s; the holders key lives as long.
    hold(&mut conn, &k, THEIRS, ms + 5_000).await;
    let _: bool = conn.pexpire(&k.holders, 5_000).await.unwrap();
    let (_, before) = now(&mut conn).await;
    let reply = acquire(&mut conn, &[&k], (OURS, 30_000, NOT_YET)).await;
    let (_, after) = now(&mut conn).await;
    let token = token_of(&reply);
    // A member of its own, scored by its expiry; the other reader's share is untouched.
    let ours = expiry(&mut conn, &k, OURS).await.expect("a member");
    assert!((before + 30_000..=after + 30_000).contains(&ours), "{ours}");
    assert_eq!(expiry(&mut conn, &k, THEIRS).await, Some(ms + 5_000));
    // The holders key lives as long as its last member.
    let kept = pttl(&mut conn, &k.holders).await;
    assert!((29_000..=30_000).contains(&kept), "{kept}");
    // The lock key holds `holders` while they live; each lease draws its fencing token.
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some("holders"));
    assert_eq!(get(&mut conn, &k.fence).await, Some(token.to_string()));
    // A reader with a shorter ttl never shortens the holders key's life.
    let _: bool = conn.pexpire(&k.holders, 90_000).await.unwrap();
    let reply = acquire(&mut conn, &[&k], (FIRST, 10_000, NOT_YET)).await;
    assert!(token_of(&reply) > token);
    assert!(expiry(&mut conn, &k, FIRST).await.is_some());
    assert!(pttl(&mut conn, &k.holders).await > 89_000);
}

#[tokio::test]
async fn an_exclusive_acquire_waits_for_live_members_and_takes_the_key_once_every_one_expired() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("read-then-written");
    let (_, ms) = now(&mut conn).await;
    // A reader for 5 s, and one of 3 permits for 8 s.
    hold(&mut conn, &k.held(SHARED), THEIRS, ms + 5_000).await;
    hold(&mut conn, &k.held("3"), FIRST, ms + 8_000).await;
    let reply = acquire(&mut conn, &[&k], (OURS, 30_000, NOT_YET)).await;
    let (index, remaining) = held(&reply).expect("refused while members live");
    assert_eq!(index, 1);
    // Free once the last of them expires.
    assert!((7_000..=8_000).contains(&remaining), "{remaining}");
    // Nothing taken, marked or drawn.
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some("holders"));
    assert_eq!(get(&mut conn, &k.fence).await, None);
    assert_eq!(
        members(&mut conn, &k).await,
        [k.held(SHARED).member(THEIRS), k.held("3").member(FIRST)]
    );

    // Both expired (their owners crashed), and the lock key's `holders` with the last of them:
    // the key taken, by its `SET NX` alone (the expired members are left to the holders key's
    // own expiry).
    hold(&mut conn, &k.held(SHARED), THEIRS, ms - 1).await;
    hold(&mut conn, &k.held("3"), FIRST, ms - 10).await;
    let _: i64 = conn.del(&k.lock).await.unwrap();
    let reply = acquire(&mut conn, &[&k], (OURS, 30_000, NOT_YET)).await;
    let token = token_of(&reply);
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some(OURS));
    assert!(pttl(&mut conn, &k.lock).await > 29_000);
    assert_eq!(get(&mut conn, &k.fence).await, Some(token.to_string()));
}

#[tokio::test]
async fn a_shared_acquire_is_refused_while_written_or_while_a_fair_waiter_is_queued() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("read-refused").held(SHARED);
    let taking = (OURS, 30_000, NOT_YET);
    // Written by another owner: refused, and the writer marked, as the key it waits for.
    set_px(&mut conn, &k.lock, THEIRS, 5_000).await;
    let reply = acquire(&mut conn, &[&k], taking).await;
    let (index, remaining) = held(&reply).expect("refused while written");
    assert_eq!(index, 1);
    assert!((4_000..=5_000).contains(&remaining), "{remaining}");
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{THEIRS}")));
    assert!(!exists(&mut conn, &k.holders).await);

    // Read by another reader, with a fair writer queued: a reader that is not fair does not
    // overtake it. It could read once the writer has had the key: after the reader's expiry.
    let _: i64 = conn.del(&k.lock).await.unwrap();
    let (_, ms) = now(&mut conn).await;
    hold(&mut conn, &k, THEIRS, ms + 5_000).await;
    enqueue(
        &mut conn,
        &k,
        FIRST,
        &entry(ms + 60_000, 2_000, "aa", EXCLUSIVE),
    )
    .await;
    let reply = acquire(&mut conn, &[&k], taking).await;
    let (index, remaining) = held(&reply).expect("refused while a writer is queued");
    assert_eq!(index, 1);
    assert!((4_000..=5_000).contains(&remaining), "{remaining}");
    assert_eq!(expiry(&mut conn, &k, OURS).await, None);
    // Nobody holds it, the waiter alone is in the way: no time to tell.
    let _: i64 = conn.del(&[&k.holders, &k.lock]).await.unwrap();
    let reply = acquire(&mut conn, &[&k], taking).await;
    assert_eq!(held(&reply), Some((1, -1)));
    assert!(!exists(&mut conn, &k.holders).await);
    assert_eq!(queue(&mut conn, &k).await.0, [FIRST]);
    assert_eq!(get(&mut conn, &k.lock).await, None);
    // The waiter's wait over (a waiter that crashed while queued): it is dropped from the
    // queue, and the reader reads.
    let (_, ms) = now(&mut conn).await;
    let _: i64 = conn.del(&[&k.queue, &k.waiters]).await.unwrap();
    enqueue(&mut conn, &k, FIRST, &entry(ms - 1, 2_000, "aa", EXCLUSIVE)).await;
    let reply = acquire(&mut conn, &[&k], taking).await;
    token_of(&reply);
    assert!(expiry(&mut conn, &k, OURS).await.is_some());
    assert!(queue(&mut conn, &k).await.0.is_empty());
}

#[tokio::test]
async fn a_permit_is_refused_at_n_live_members_and_granted_below() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("permits").held("2");
    let (_, ms) = now(&mut conn).await;
    hold(&mut conn, &k, THEIRS, ms + 5_000).await;
    hold(&mut conn, &k, FIRST, ms + 9_000).await;
    let reply = acquire(&mut conn, &[&k], (OURS, 30_000, NOT_YET)).await;
    let (index, remaining) = held(&reply).expect("both permits are held");
    assert_eq!(index, 1);
    // A permit is freed by the first holder's expiry, not the last's.
    assert!((4_000..=5_000).contains(&remaining), "{remaining}");
    assert_eq!(expiry(&mut conn, &k, OURS).await, None);

    // One holder's lease has expired: one permit of two is free, and the dead member dropped.
    hold(&mut conn, &k, FIRST, ms - 1).await;
    let (_, before) = now(&mut conn).await;
    let reply = acquire(&mut conn, &[&k], (OURS, 30_000, NOT_YET)).await;
    let (_, after) = now(&mut conn).await;
    let token = token_of(&reply);
    assert_eq!(
        members(&mut conn, &k).await,
        [k.member(THEIRS), k.member(OURS)]
    );
    let ours = expiry(&mut conn, &k, OURS).await.expect("a permit");
    assert!((before + 30_000..=after + 30_000).contains(&ours), "{ours}");
    assert_eq!(get(&mut conn, &k.fence).await, Some(token.to_string()));

    // Free permits are no use while a writer holds the key.
    let other = keys("permits-written").held("2");
    set_px(&mut conn, &other.lock, THEIRS, 5_000).await;
    let reply = acquire(&mut conn, &[&other], (OURS, 30_000, NEVER)).await;
    assert_eq!(held(&reply).map(|h| h.0), Some(1));
    assert!(!exists(&mut conn, &other.holders).await);
}

#[tokio::test]
async fn a_request_with_an_exclusive_and_a_shared_key_takes_both_or_neither() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let (a, b) = (keys("mixed-a"), keys("mixed-b").held(SHARED));
    let taking = (OURS, 30_000, NOT_YET);
    let (_, ms) = now(&mut conn).await;
    // a (to write) is read by another owner: b (to read, free) is not taken either.
    hold(&mut conn, &a.held(SHARED), THEIRS, ms + 5_000).await;
    let reply = acquire(&mut conn, &[&a, &b], taking).await;
    assert_eq!(held(&reply).map(|h| h.0), Some(1));
    assert_eq!(get(&mut conn, &a.lock).await.as_deref(), Some("holders"));
    assert!(!exists(&mut conn, &b.holders).await);
    // b is written by another owner: a (free) is not taken either; b is the key marked.
    let _: i64 = conn.del(&[&a.holders, &a.lock]).await.unwrap();
    set_px(&mut conn, &b.lock, THEIRS, 5_000).await;
    let reply = acquire(&mut conn, &[&a, &b], taking).await;
    assert_eq!(held(&reply).map(|h| h.0), Some(2));
    assert_eq!(get(&mut conn, &a.lock).await, None);
    assert_eq!(get(&mut conn, &b.lock).await, Some(format!("~{THEIRS}")));
    assert!(!exists(&mut conn, &b.holders).await);
    for key in [&a, &b] {
        assert_eq!(get(&mut conn, &key.fence).await, None);
    }
    // Both free: a written, b read, under one fencing token.
    let _: i64 = conn.del(&b.lock).await.unwrap();
    let (_, before) = now(&mut conn).await;
    let reply = acquire(&mut conn, &[&a, &b], taking).await;
    let (_, after) = now(&mut conn).await;
    let token = token_of(&reply);
    assert_eq!(get(&mut conn, &a.lock).await.as_deref(), Some(OURS));
    assert!(pttl(&mut conn, &a.lock).await > 29_000);
    assert!(!exists(&mut conn, &a.holders).await);
    assert_eq!(get(&mut conn, &b.lock).await.as_deref(), Some("holders"));
    let ours = expiry(&mut conn, &b, OURS).await.expect("a member");
    assert!((before + 30_000..=after + 30_000).contains(&ours), "{ours}");
    for key in [&a, &b] {
        assert_eq!(get(&mut conn, &key.fence).await, Some(token.to_string()));
    }
}

#[tokio::test]
async fn a_retried_shared_or_permit_acquire_finds_its_own_member_and_takes_it_again() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let (_, ms) = now(&mut conn).await;
    // A reader already in (its answer was lost), though a fair writer has queued since.
    let reader = keys("retried-reader").held(SHARED);
    hold(&mut conn, &reader, OURS, ms + 1_000).await;
    enqueue(
        &mut conn,
        &reader,
        FIRST,
        &entry(ms + 60_000, 2_000, "aa", EXCLUSIVE),
    )
    .await;
    // The one permit of one, ours already.
    let permit = keys("retried-permit").held("1");
    hold(&mut conn, &permit, OURS, ms + 1_000).await;
    for k in [&reader, &permit] {
        let (_, before) = now(&mut conn).await;
        let reply = acquire(&mut conn, &[k], (OURS, 60_000, NOT_YET)).await;
        let (_, after) = now(&mut conn).await;
        token_of(&reply);
        // The same member, its ttl counted from now.
        assert_eq!(members(&mut conn, k).await, [k.member(OURS)], "{}", k.mode);
        let ours = expiry(&mut conn, k, OURS).await.unwrap();
        assert!((before + 60_000..=after + 60_000).contains(&ours), "{ours}");
        assert!(pttl(&mut conn, &k.holders).await > 59_000);
    }
    // A member of ours whose expiry has passed is no hold: that permit is another's now.
    hold(&mut conn, &permit, OURS, ms - 1).await;
    hold(&mut conn, &permit, THEIRS, ms + 5_000).await;
    let reply = acquire(&mut conn, &[&permit], (OURS, 60_000, NOT_YET)).await;
    assert_eq!(held(&reply).map(|h| h.0), Some(1));
    assert_eq!(members(&mut conn, &permit).await, [permit.member(THEIRS)]);
}

#[tokio::test]
async fn a_permit_in_a_slot_is_granted_while_that_slot_is_free_whatever_the_others_hold() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let slot = |i: usize| keys("slots").held(["3/0", "3/1", "3/2"][i]);
    let (_, ms) = now(&mut conn).await;
    hold(&mut conn, &slot(1), THEIRS, ms + 5_000).await;
    hold(&mut conn, &slot(2), FIRST, ms + 9_000).await;
    // Slot 1 is taken: refused, until its holder's expiry (not the other slot's).
    let reply = acquire(&mut conn, &[&slot(1)], (OURS, 30_000, NOT_YET)).await;
    let (index, remaining) = held(&reply).expect("slot 1 is held");
    assert_eq!(index, 1);
    assert!((4_000..=5_000).contains(&remaining), "{remaining}");
    // Slot 0 is free though two members are live, more than a count of 2 would admit.
    let reply = acquire(&mut conn, &[&slot(0)], (OURS, 30_000, NOT_YET)).await;
    let token = token_of(&reply);
    assert_eq!(
        get(&mut conn, &slot(0).fence).await,
        Some(token.to_string())
    );
    assert_eq!(
        members(&mut conn, &slot(0)).await,
        [
            format!("3/1 {THEIRS}"),
            format!("3/2 {FIRST}"),
            format!("3/0 {OURS}")
        ]
    );
    // Retried (its answer lost): the same slot again, with a greater token.
    let again = token_of(&acquire(&mut conn, &[&slot(0)], (OURS, 30_000, NOT_YET)).await);
    assert!(again > token);
    // Another token in the same slot is refused, whatever N it names.
    let other_n = keys("slots").held("5/0");
    let reply = acquire(&mut conn, &[&other_n], (SECOND, 30_000, NEVER)).await;
    assert_eq!(held(&reply).map(|h| h.0), Some(1));
    // An expired holder frees its slot.
    hold(&mut conn, &slot(1), THEIRS, ms - 1).await;
    let reply = acquire(&mut conn, &[&slot(1)], (SECOND, 30_000, NOT_YET)).await;
    token_of(&reply);
    assert!(!members(&mut conn, &slot(1))
        .await
        .contains(&format!("3/1 {THEIRS}")));

    // A live member outside slots (a permit counted by a client without slots, or a reader)
    // holds every slot, until its expiry.
    let mixed = |mode| keys("slots-mixed").held(mode);
    hold(&mut conn, &mixed("2"), THEIRS, ms + 5_000).await;
    let reply = acquire(&mut conn, &[&mixed("2/1")], (OURS, 30_000, NEVER)).await;
    let (_, remaining) = held(&reply).expect("held outside slots");
    assert!((4_000..=5_000).contains(&remaining), "{remaining}");
    // And a counted permit sees the slots' members as holders.
    let _: i64 = conn.del(&mixed("2").holders).await.unwrap();
    hold(&mut conn, &mixed("2/0"), THEIRS, ms + 5_000).await;
    hold(&mut conn, &mixed("2/1"), FIRST, ms + 5_000).await;
    let reply = acquire(&mut conn, &[&mixed("2")], (OURS, 30_000, NEVER)).await;
    assert_eq!(held(&reply).map(|h| h.0), Some(1));
    // A writer is kept out by a slot's member.
    let reply = acquire(&mut conn, &[&mixed(EXCLUSIVE)], (OURS, 30_000, NEVER)).await;
    assert_eq!(held(&reply).map(|h| h.0), Some(1));
}

#[tokio::test]
async fn renewal_and_release_by_any_slot_find_the_tokens_own_slot() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let any = keys("any-slot").held("3/*");
    let (ours, theirs) = (format!("3/2 {OURS}"), format!("3/0 {THEIRS}"));
    let (_, ms) = now(&mut conn).await;
    let _: usize = conn.zadd(&any.holders, &ours, ms + 1_000).await.unwrap();
    let _: usize = conn.zadd(&any.holders, &theirs, ms + 1_000).await.unwrap();
    // Renewed in whichever slot it holds; a token without a slot here is not.
    let extended = extend(
        &mut conn,
        60_000,
        &[(OURS, vec![&any]), (SECOND, vec![&any])],
    )
    .await;
    assert_eq!(extended, [1, 0]);
    let ours_at: Option<f64> = conn.zscore(&any.holders, &ours).await.unwrap();
    assert!(ours_at.unwrap() as u64 >= ms + 59_000);
    let theirs_at: Option<f64> = conn.zscore(&any.holders, &theirs).await.unwrap();
    assert_eq!(theirs_at.map(|s| s as u64), Some(ms + 1_000));
    assert!(pttl(&mut conn, &any.holders).await > 59_000);
    // Inspected as a permit of 3, the slot's member listed.
    let seen = inspect(&mut conn, &any).await.unwrap();
    assert_eq!((seen.kind.as_str(), seen.holders), ("s", 2));
    assert!(seen.members.contains(&ours), "{:?}", seen.members);
    // Released in whichever slot it holds, announced; the other slot's holder stays.
    let mut channel = Channel::subscribe(&server, &any.lock).await;
    assert_eq!(
        release(&mut conn, &[&any], (OURS, NOT_QUEUED, ALWAYS)).await,
        1
    );
    assert_eq!(
        members(&mut conn, &any).await,
        std::slice::from_ref(&theirs)
    );
    assert_eq!(channel.published(&mut conn).await, [""]);
    assert_eq!(
        release(&mut conn, &[&any], (OURS, NOT_QUEUED, ALWAYS)).await,
        0
    );
    // A renewal after the release finds nothing: the lease is lost.
    assert_eq!(extend(&mut conn, 60_000, &[(OURS, vec![&any])]).await, [0]);
    // A release by its exact slot (an undo) removes that member only.
    let _: usize = conn.zadd(&any.holders, &ours, ms + 30_000).await.unwrap();
    let exact = keys("any-slot").held("3/1");
    assert_eq!(
        release(&mut conn, &[&exact], (OURS, NOT_QUEUED, ALWAYS)).await,
        0
    );
    let exact = keys("any-slot").held("3/2");
    assert_eq!(
        release(&mut conn, &[&exact], (OURS, NOT_QUEUED, ALWAYS)).await,
        1
    );
    assert_eq!(members(&mut conn, &any).await, [theirs]);
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
        &entry(ms + 60_000, 2_000, "ab", EXCLUSIVE),
    )
    .await;
    let released = release(&mut conn, &[&k], (OURS, NOT_QUEUED, WAITED_ON)).await;
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
    let released = release(&mut conn, &[&k], (OURS, NOT_QUEUED, WAITED_ON)).await;
    assert_eq!(released, 1);
    assert_eq!(get(&mut conn, &k.lock).await, None);
    assert_eq!(channel.published(&mut conn).await, [""]);
    // A quorum's release announces itself, marked or not.
    set_px(&mut conn, &k.lock, OURS, 30_000).await;
    let released = release(&mut conn, &[&k], (OURS, NOT_QUEUED, ALWAYS)).await;
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
        &entry(ms + 60_000, 2_000, "ab", EXCLUSIVE),
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
        for announce in [WAITED_ON, ALWAYS] {
            let released = release(&mut conn, &[&k], (OURS, NOT_QUEUED, announce)).await;
            assert_eq!(released, 0, "{value}");
            assert_eq!(get(&mut conn, &k.lock).await, Some(value.clone()));
            assert!(pttl(&mut conn, &k.lock).await > 29_000);
        }
    }
    assert_eq!(channel.published(&mut conn).await, Vec::<String>::new());
    assert_eq!(queue(&mut conn, &k).await.0, [FIRST]);
    // Free: nothing released, nothing created.
    let _: i64 = conn.del(&k.lock).await.unwrap();
    let released = release(&mut conn, &[&k], (OURS, NOT_QUEUED, ALWAYS)).await;
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
        &entry(ms + 60_000, 1_500, secret, EXCLUSIVE),
    )
    .await;
    enqueue(
        &mut conn,
        &k,
        SECOND,
        &entry(ms + 60_000, 1_500, "00", EXCLUSIVE),
    )
    .await;

    let released = release(&mut conn, &[&k], (OURS, NOT_QUEUED, WAITED_ON)).await;
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
    enqueue(&mut conn, &k, FIRST, &entry(ms - 1, 2_000, "aa", EXCLUSIVE)).await;
    let _: i64 = conn.rpush(&k.queue, SECOND).await.unwrap(); // no entry
    enqueue(
        &mut conn,
        &k,
        THIRD,
        &entry(ms + 60_000, 2_000, "cc", EXCLUSIVE),
    )
    .await;
    // An entry without its place in the queue (its waiter is gone) is never served.
    let _: i64 = conn
        .hset(&k.waiters, OURS, entry(ms + 60_000, 2_000, "dd", EXCLUSIVE))
        .await
        .unwrap();
    set_px(&mut conn, &k.lock, &format!("~{OURS}"), 30_000).await;

    let released = release(&mut conn, &[&k], (THEIRS, NOT_QUEUED, WAITED_ON)).await;
    assert_eq!(released, 0, "not THEIRS's lock");
    // Released by its owner, who is not the stray entry's waiter either.
    let released = release(&mut conn, &[&k], (OURS, NOT_QUEUED, WAITED_ON)).await;
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
    enqueue(&mut conn, &k, FIRST, &entry(ms - 1, 2_000, "aa", EXCLUSIVE)).await;
    let _: i64 = conn.rpush(&k.queue, SECOND).await.unwrap(); // no entry
    enqueue(&mut conn, &k, THIRD, "not an entry").await;
    let released = release(&mut conn, &[&k], (THIRD, NOT_QUEUED, WAITED_ON)).await;
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
            &entry(ms + 60_000, 2_000, "ab", EXCLUSIVE),
        )
        .await;
    }
    // Not queued: the queue stays as it is.
    let released = release(&mut conn, &[&k], (OURS, NOT_QUEUED, WAITED_ON)).await;
    assert_eq!(released, 0);
    assert_eq!(queue(&mut conn, &k).await.0, [FIRST, OURS, SECOND]);
    // Maybe queued (a fair waiter that gives up): it leaves, the others keep their places.
    let released = release(&mut conn, &[&k], (OURS, MAYBE_QUEUED, WAITED_ON)).await;
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
    let released = release(&mut conn, &[&a, &d, &b, &c], (OURS, NOT_QUEUED, WAITED_ON)).await;
    assert_eq!(released, 2);
    assert_eq!(get(&mut conn, &a.lock).await, None);
    assert_eq!(get(&mut conn, &b.lock).await, None);
    assert_eq!(get(&mut conn, &c.lock).await.as_deref(), Some(THEIRS));
    assert_eq!(key_type(&mut conn, &d.lock).await, "list");
    assert_eq!(channel.published(&mut conn).await, [""]);
}

#[tokio::test]
async fn a_shared_release_removes_only_its_own_member() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("reader-leaves").held(SHARED);
    let taking = (OURS, NOT_QUEUED, WAITED_ON);
    let (_, ms) = now(&mut conn).await;
    hold(&mut conn, &k, THEIRS, ms + 20_000).await;
    hold(&mut conn, &k, OURS, ms + 30_000).await;
    hold(&mut conn, &k, FIRST, ms + 40_000).await;
    assert_eq!(release(&mut conn, &[&k], taking).await, 1);
    assert_eq!(members(&mut conn, &k).await, [THEIRS, FIRST]);
    assert_eq!(expiry(&mut conn, &k, THEIRS).await, Some(ms + 20_000));
    assert_eq!(expiry(&mut conn, &k, FIRST).await, Some(ms + 40_000));
    // Released already, or never held: nothing more.
    assert_eq!(release(&mut conn, &[&k], taking).await, 0);
    assert_eq!(
        release(&mut conn, &[&k], (SECOND, NOT_QUEUED, WAITED_ON)).await,
        0
    );
    // A member whose expiry has passed goes, but it held nothing any more.
    hold(&mut conn, &k, OURS, ms - 1).await;
    assert_eq!(release(&mut conn, &[&k], taking).await, 0);
    assert_eq!(members(&mut conn, &k).await, [THEIRS, FIRST]);
}

#[tokio::test]
async fn the_last_readers_release_hands_the_key_to_the_queued_writer() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("last-reader").held(SHARED);
    let mut channel = Channel::subscribe(&server, &k.lock).await;
    let (clock, ms) = now(&mut conn).await;
    set_px(&mut conn, &k.fence, &clock.to_string(), 30_000).await;
    hold(&mut conn, &k, OURS, ms + 30_000).await;
    hold(&mut conn, &k, THIRD, ms + 30_000).await;
    // A reader whose lease expired is in nobody's way.
    hold(&mut conn, &k, THEIRS, ms - 1).await;
    let secret = "5ec7e7";
    enqueue(
        &mut conn,
        &k,
        FIRST,
        &entry(ms + 60_000, 1_500, secret, EXCLUSIVE),
    )
    .await;
    enqueue(
        &mut conn,
        &k,
        SECOND,
        &entry(ms + 60_000, 1_500, "bb", SHARED),
    )
    .await;
    // Another reader still holds it: the writer waits, and nothing is said.
    let released = release(&mut conn, &[&k], (THIRD, NOT_QUEUED, WAITED_ON)).await;
    assert_eq!(released, 1);
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some("holders"));
    assert_eq!(queue(&mut conn, &k).await.0, [FIRST, SECOND]);
    assert_eq!(channel.published(&mut conn).await, Vec::<String>::new());

    // The last reader leaves: the writer holds it for its claim, marked for those behind it.
    let released = release(&mut conn, &[&k], (OURS, NOT_QUEUED, WAITED_ON)).await;
    assert_eq!(released, 1);
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{FIRST}")));
    let claim = pttl(&mut conn, &k.lock).await;
    assert!((1_000..=1_500).contains(&claim), "{claim}");
    assert!(!exists(&mut conn, &k.holders).await);
    let published = channel.published(&mut conn).await;
    assert_eq!(published.len(), 1, "{published:?}");
    let handoff = handoff(&published[0], secret);
    assert_eq!((handoff.token.as_str(), handoff.claim_ms), (FIRST, 1_500));
    assert!(handoff.fence > clock, "{handoff:?}");
    assert_eq!(
        get(&mut conn, &k.fence).await,
        Some(handoff.fence.to_string())
    );
    // The reader queued behind the writer waits for it.
    assert_eq!(queue(&mut conn, &k).await.0, [SECOND]);
}

#[tokio::test]
async fn a_writers_release_hands_the_key_to_every_reader_at_the_head_up_to_the_next_writer() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("writer-leaves");
    let readers = k.held(SHARED);
    let mut channel = Channel::subscribe(&server, &k.lock).await;
    set_px(&mut conn, &k.lock, &format!("~{OURS}"), 30_000).await;
    let (clock, ms) = now(&mut conn).await;
    set_px(&mut conn, &k.fence, &clock.to_string(), 30_000).await;
    enqueue(
        &mut conn,
        &k,
        FIRST,
        &entry(ms + 60_000, 1_500, "aa", SHARED),
    )
    .await;
    enqueue(
        &mut conn,
        &k,
        SECOND,
        &entry(ms + 60_000, 2_500, "bb", SHARED),
    )
    .await;
    enqueue(
        &mut conn,
        &k,
        THIRD,
        &entry(ms + 60_000, 1_500, "cc", EXCLUSIVE),
    )
    .await;
    enqueue(
        &mut conn,
        &k,
        THEIRS,
        &entry(ms + 60_000, 1_500, "dd", SHARED),
    )
    .await;
    let (_, before) = now(&mut conn).await;
    let released = release(&mut conn, &[&k], (OURS, NOT_QUEUED, WAITED_ON)).await;
    let (_, after) = now(&mut conn).await;
    assert_eq!(released, 1);
    // Read by both readers now, each for its own claim; written by nobody.
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some("holders"));
    assert_eq!(members(&mut conn, &readers).await, [FIRST, SECOND]);
    let first = expiry(&mut conn, &readers, FIRST).await.unwrap();
    assert!((before + 1_500..=after + 1_500).contains(&first), "{first}");
    let second = expiry(&mut conn, &readers, SECOND).await.unwrap();
    assert!(
        (before + 2_500..=after + 2_500).contains(&second),
        "{second}"
    );
    // The holders key lives as long as the longest claim.
    let kept = pttl(&mut conn, &k.holders).await;
    assert!((2_000..=2_500).contains(&kept), "{kept}");
    // Each is told by a message signed with its own secret, with a fencing token of its own.
    // Not announced: a writer is still queued, and waiters that are not fair wait for it.
    let published = channel.published(&mut conn).await;
    assert_eq!(published.len(), 2, "{published:?}");
    let (first, second) = (handoff(&published[0], "aa"), handoff(&published[1], "bb"));
    assert_eq!((first.token.as_str(), first.claim_ms), (FIRST, 1_500));
    assert_eq!((second.token.as_str(), second.claim_ms), (SECOND, 2_500));
    assert!(
        clock < first.fence && first.fence < second.fence,
        "{first:?} {second:?}"
    );
    assert_eq!(
        get(&mut conn, &k.fence).await,
        Some(second.fence.to_string())
    );
    // The writer behind them waits for them, and the reader behind it for the writer.
    assert_eq!(queue(&mut conn, &k).await.0, [THIRD, THEIRS]);
}

#[tokio::test]
async fn a_permits_release_hands_it_to_the_queued_permit_waiter_and_no_further() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("permit-leaves").held("2");
    let mut channel = Channel::subscribe(&server, &k.lock).await;
    let (_, ms) = now(&mut conn).await;
    hold(&mut conn, &k, OURS, ms + 30_000).await;
    hold(&mut conn, &k, THEIRS, ms + 30_000).await;
    enqueue(&mut conn, &k, FIRST, &entry(ms + 60_000, 1_500, "aa", "2")).await;
    enqueue(&mut conn, &k, SECOND, &entry(ms + 60_000, 1_500, "bb", "2")).await;
    let (_, before) = now(&mut conn).await;
    let released = release(&mut conn, &[&k], (OURS, NOT_QUEUED, WAITED_ON)).await;
    let (_, after) = now(&mut conn).await;
    assert_eq!(released, 1);
    // The first permit waiter holds the freed permit for its claim.
    assert_eq!(
        members(&mut conn, &k).await,
        [k.member(FIRST), k.member(THEIRS)]
    );
    let first = expiry(&mut conn, &k, FIRST).await.unwrap();
    assert!((before + 1_500..=after + 1_500).contains(&first), "{first}");
    // The hand-off alone: with a fair waiter still queued, nobody else may take a permit.
    let published = channel.published(&mut conn).await;
    assert_eq!(published.len(), 1, "{published:?}");
    assert_eq!(handoff(&published[0], "aa").token, FIRST);
    // Both permits are held again: the second waiter waits.
    assert_eq!(queue(&mut conn, &k).await.0, [SECOND]);
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some("holders"));
}

#[tokio::test]
async fn a_release_that_made_room_and_served_nobody_announces_it_and_one_that_made_none_does_not() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let reader = keys("announced-reader").held(SHARED);
    let permit = keys("announced-permit").held("2");
    let mut readers = Channel::subscribe(&server, &reader.lock).await;
    let mut permits = Channel::subscribe(&server, &permit.lock).await;
    let (_, ms) = now(&mut conn).await;
    hold(&mut conn, &reader, OURS, ms + 30_000).await;
    hold(&mut conn, &reader, THEIRS, ms + 30_000).await;
    // Another reader stays: no room made for a writer, nothing said.
    let released = release(&mut conn, &[&reader], (OURS, NOT_QUEUED, WAITED_ON)).await;
    assert_eq!(released, 1);
    assert_eq!(readers.published(&mut conn).await, Vec::<String>::new());
    // A quorum's release announces itself all the same.
    hold(&mut conn, &reader, OURS, ms + 30_000).await;
    let released = release(&mut conn, &[&reader], (OURS, NOT_QUEUED, ALWAYS)).await;
    assert_eq!(released, 1);
    assert_eq!(readers.published(&mut conn).await, [""]);
    // The last reader leaves, nobody queued: announced, for writers that are not fair.
    let released = release(&mut conn, &[&reader], (THEIRS, NOT_QUEUED, WAITED_ON)).await;
    assert_eq!(released, 1);
    assert_eq!(readers.published(&mut conn).await, [""]);

    // A permit's release makes room, whoever else holds one.
    hold(&mut conn, &permit, OURS, ms + 30_000).await;
    hold(&mut conn, &permit, THEIRS, ms + 30_000).await;
    let released = release(&mut conn, &[&permit], (OURS, NOT_QUEUED, WAITED_ON)).await;
    assert_eq!(released, 1);
    assert_eq!(members(&mut conn, &permit).await, [permit.member(THEIRS)]);
    assert_eq!(permits.published(&mut conn).await, [""]);
}

// ---- extend.lua ----

#[tokio::test]
async fn extend_prolongs_each_lease_that_holds_all_its_keys_and_touches_no_other() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k: Vec<Keys> = ["e1", "e2", "e3", "e4", "e5", "e6", "e7"]
        .into_iter()
        .map(keys)
        .collect();
    set_px(&mut conn, &k[0].lock, OURS, 1_000).await; // ours, plain
    set_px(&mut conn, &k[1].lock, &format!("~{OURS}"), 1_000).await; // ours, marked
    set_px(&mut conn, &k[2].lock, THEIRS, 1_000).await; // another owner's
    let _: i64 = conn.rpush(&k[4].lock, "x").await.unwrap(); // another program's list
    set_px(&mut conn, &k[5].lock, &format!("~{FIRST}"), 1_000).await; // FIRST's, marked
    set_px(&mut conn, &k[6].lock, FIRST, 1_000).await; // FIRST's, plain
                                                       // The fencing counters of ours and of another owner's key, as the draws left them.
    set_px(&mut conn, &k[0].fence, "1795000000000001", 1_000).await;
    set_px(&mut conn, &k[2].fence, "1795000000000002", 1_000).await;

    // Ours, on a plain and a marked key; ours, with a key another owner holds; a gone key
    // (k[3]); a list; FIRST's two keys, one marked.
    let leases = [
        (OURS, vec![&k[0], &k[1]]),
        (OURS, vec![&k[0], &k[2]]),
        (SECOND, vec![&k[3]]),
        (THIRD, vec![&k[4]]),
        (FIRST, vec![&k[5], &k[6]]),
    ];
    let extended = extend(&mut conn, 60_000, &leases).await;
    assert_eq!(extended, [1, 0, 0, 0, 1]);
    for i in [0, 1, 5, 6] {
        assert!(pttl(&mut conn, &k[i].lock).await > 59_000, "{}", k[i].lock);
    }
    // An extended lease's fencing counter lives as long: its token stays known.
    assert!(pttl(&mut conn, &k[0].fence).await > 59_000);
    // Untouched: another owner's key keeps its ttl, a gone key stays gone, a list stays.
    assert!(pttl(&mut conn, &k[2].lock).await <= 1_000);
    assert!(pttl(&mut conn, &k[2].fence).await <= 1_000);
    assert_eq!(get(&mut conn, &k[2].lock).await.as_deref(), Some(THEIRS));
    assert_eq!(get(&mut conn, &k[3].lock).await, None);
    assert_eq!(pttl(&mut conn, &k[4].lock).await, -1);
    // A lease with one key lost is not extended at all, not even its key that is still held.
    set_px(&mut conn, &k[0].lock, OURS, 1_000).await;
    let extended = extend(&mut conn, 60_000, &[(OURS, vec![&k[0], &k[2]])]).await;
    assert_eq!(extended, [0]);
    assert!(pttl(&mut conn, &k[0].lock).await <= 1_000);
    // Another owner's token never extends ours, marked or not.
    let extended = extend(
        &mut conn,
        60_000,
        &[(THEIRS, vec![&k[0]]), (THEIRS, vec![&k[1]])],
    )
    .await;
    assert_eq!(extended, [0, 0]);
}

#[tokio::test]
async fn extend_prolongs_a_live_shared_or_permit_member_and_its_holders_key() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let (reader, permit) = (
        keys("renewed-reader").held(SHARED),
        keys("renewed-permit").held("3"),
    );
    let (_, ms) = now(&mut conn).await;
    for k in [&reader, &permit] {
        hold(&mut conn, k, OURS, ms + 5_000).await;
        hold(&mut conn, k, THEIRS, ms + 5_000).await;
        let _: bool = conn.pexpire(&k.holders, 5_000).await.unwrap();
    }
    let (_, before) = now(&mut conn).await;
    let leases = [(OURS, vec![&reader]), (OURS, vec![&permit])];
    let extended = extend(&mut conn, 60_000, &leases).await;
    let (_, after) = now(&mut conn).await;
    assert_eq!(extended, [1, 1]);
    for k in [&reader, &permit] {
        let ours = expiry(&mut conn, k, OURS).await.unwrap();
        assert!((before + 60_000..=after + 60_000).contains(&ours), "{ours}");
        // Only its own member: the other lease's expiry stays.
        assert_eq!(expiry(&mut conn, k, THEIRS).await, Some(ms + 5_000));
        assert!(pttl(&mut conn, &k.holders).await > 59_000, "{}", k.mode);
        // The lock key's `holders` covers it: no writer gets in before its new expiry.
        assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some("holders"));
        assert!(pttl(&mut conn, &k.lock).await > 59_000, "{}", k.mode);
    }
}

/// A renewal for less than before (`hold_at_least`, a manual extend) shortens the lock key's
/// `holders` with the member: a writer gets in once the member expired, not at the first ttl.
/// And a member whose lock key holds a writer's token is not renewed.
#[tokio::test]
async fn a_shorter_renewal_of_a_member_shortens_its_lock_key_and_a_writer_beside_it_ends_it() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    for mode in [SHARED, "3"] {
        let k = keys(&format!("shortened-{mode}")).held(mode);
        let writer = keys(&format!("shortened-{mode}"));
        let _ = token_of(&acquire(&mut conn, &[&k], (OURS, 30_000, NOT_YET)).await);
        assert_eq!(extend(&mut conn, 300, &[(OURS, vec![&k])]).await, [1]);
        let left = pttl(&mut conn, &k.lock).await;
        assert!((250..=300).contains(&left), "{mode}: {left}");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let _ = token_of(&acquire(&mut conn, &[&writer], (FIRST, 30_000, NOT_YET)).await);
        // The writer holds it; the member, live again by hand, is not renewed beside it.
        let (_, ms) = now(&mut conn).await;
        let _: usize = conn
            .zadd(&k.holders, k.member(OURS), ms + 5_000)
            .await
            .unwrap();
        assert_eq!(extend(&mut conn, 30_000, &[(OURS, vec![&k])]).await, [0]);
        assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some(FIRST));
        assert_eq!(expiry(&mut conn, &k, OURS).await, Some(ms + 5_000));
    }
}

/// The lock key of a key held by members holds `holders` for as long as the last live member:
/// a release of the longest-lived member shortens it to the next, and the release of the last
/// deletes it (and the holders with it), so a writer is kept out exactly while a member lives.
#[tokio::test]
async fn the_lock_key_of_a_shared_key_lives_as_long_as_its_last_live_member() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("covered").held(SHARED);
    let writer = keys("covered");
    // Two readers, by the acquire script: for 30 s and for 5 s.
    let _ = token_of(&acquire(&mut conn, &[&k], (OURS, 30_000, NOT_YET)).await);
    let _ = token_of(&acquire(&mut conn, &[&k], (THEIRS, 5_000, NOT_YET)).await);
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some("holders"));
    assert!(pttl(&mut conn, &k.lock).await > 29_000);
    // A writer is refused by its `SET NX` alone, nothing marked, until the last one's expiry.
    let reply = acquire(&mut conn, &[&writer], (FIRST, 30_000, NOT_YET)).await;
    let (_, remaining) = held(&reply).expect("refused while members live");
    assert!((29_000..=30_000).contains(&remaining), "{remaining}");
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some("holders"));
    // The 30 s reader leaves: the key is kept for the 5 s one only.
    let leave = (OURS, NOT_QUEUED, WAITED_ON);
    assert_eq!(release(&mut conn, &[&k], leave).await, 1);
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some("holders"));
    let kept = pttl(&mut conn, &k.lock).await;
    assert!((4_000..=5_000).contains(&kept), "{kept}");
    // The last leaves: the lock key goes with it, and a writer takes the key at once.
    assert_eq!(
        release(&mut conn, &[&k], (THEIRS, NOT_QUEUED, WAITED_ON)).await,
        1
    );
    assert!(!exists(&mut conn, &k.lock).await);
    assert!(!exists(&mut conn, &k.holders).await);
    let _ = token_of(&acquire(&mut conn, &[&writer], (FIRST, 30_000, NOT_YET)).await);
    // And a reader is refused while the writer holds it, nothing set.
    let reply = acquire(&mut conn, &[&k], (SECOND, 30_000, NEVER)).await;
    assert_eq!(held(&reply).map(|h| h.0), Some(1));
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some(FIRST));
    assert!(!exists(&mut conn, &k.holders).await);
}

#[tokio::test]
async fn extend_never_revives_an_expired_member_nor_creates_a_missing_one() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("not-revived").held(SHARED);
    let (_, ms) = now(&mut conn).await;
    // Ours has expired (not yet dropped); another reader keeps the holders key alive.
    hold(&mut conn, &k, OURS, ms - 1).await;
    hold(&mut conn, &k, THEIRS, ms + 60_000).await;
    // Another program's string where the holders would be.
    let odd = keys("not-revived-odd").held(SHARED);
    let _: () = conn.set(&odd.holders, "x").await.unwrap();
    let leases = [
        (OURS, vec![&k]),
        (FIRST, vec![&k]),
        (OURS, vec![&odd]),
        (THEIRS, vec![&k]),
    ];
    let extended = extend(&mut conn, 60_000, &leases).await;
    assert_eq!(extended, [0, 0, 0, 1]);
    assert_eq!(expiry(&mut conn, &k, OURS).await, Some(ms - 1));
    assert_eq!(expiry(&mut conn, &k, FIRST).await, None);
    assert_eq!(get(&mut conn, &odd.holders).await.as_deref(), Some("x"));
}

#[tokio::test]
async fn extend_of_a_lease_with_an_exclusive_and_a_shared_key_needs_both_held() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let (a, b) = (keys("renewed-a"), keys("renewed-b").held(SHARED));
    let lease = [(OURS, vec![&a, &b])];
    let (_, ms) = now(&mut conn).await;
    set_px(&mut conn, &a.lock, OURS, 1_000).await;
    hold(&mut conn, &b, OURS, ms + 10_000).await;
    let (_, before) = now(&mut conn).await;
    assert_eq!(extend(&mut conn, 60_000, &lease).await, [1]);
    let (_, after) = now(&mut conn).await;
    assert!(pttl(&mut conn, &a.lock).await > 59_000);
    let ours = expiry(&mut conn, &b, OURS).await.unwrap();
    assert!((before + 60_000..=after + 60_000).contains(&ours), "{ours}");
    // b's share expired: a is not extended either.
    set_px(&mut conn, &a.lock, OURS, 1_000).await;
    hold(&mut conn, &b, OURS, ms - 1).await;
    assert_eq!(extend(&mut conn, 60_000, &lease).await, [0]);
    assert!(pttl(&mut conn, &a.lock).await <= 1_000);
    // a lost to another owner: b's share is not extended either.
    set_px(&mut conn, &a.lock, THEIRS, 1_000).await;
    hold(&mut conn, &b, OURS, ms + 10_000).await;
    assert_eq!(extend(&mut conn, 60_000, &lease).await, [0]);
    assert_eq!(expiry(&mut conn, &b, OURS).await, Some(ms + 10_000));
}

// ---- fair/acquire.lua ----

#[tokio::test]
async fn a_fair_acquire_of_a_free_key_with_nobody_queued_takes_it() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("fair-free");
    let reply = fair_acquire(&mut conn, &k, (OURS, 5_000, "aa", NOT_YET)).await;
    let token = token_of(&reply);
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some(OURS));
    assert!(pttl(&mut conn, &k.lock).await > 29_000);
    assert_eq!(get(&mut conn, &k.fence).await, Some(token.to_string()));
    // One that has waited takes it marked.
    let _: i64 = conn.del(&k.lock).await.unwrap();
    let reply = fair_acquire(&mut conn, &k, (OURS, 5_000, "aa", WAITED)).await;
    assert!(token_of(&reply) > token);
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{OURS}")));
    assert!(!exists(&mut conn, &k.queue).await);
}

#[tokio::test]
async fn a_fair_acquire_of_a_held_key_queues_once_and_marks_the_holder() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("fair-held");
    set_px(&mut conn, &k.lock, THEIRS, 5_000).await;
    // A try (no wait left): neither queued nor marking.
    let reply = fair_acquire(&mut conn, &k, (OURS, 0, "aa", NOT_YET)).await;
    let (remaining, _) = queued(reply);
    assert!((4_000..=5_000).contains(&remaining));
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some(THEIRS));
    assert!(queue(&mut conn, &k).await.0.is_empty());

    let (_, before) = now(&mut conn).await;
    let reply = fair_acquire(&mut conn, &k, (OURS, 10_000, "aa", NOT_YET)).await;
    let (remaining, server_ms) = queued(reply);
    let (_, after) = now(&mut conn).await;
    assert!((4_000..=5_000).contains(&remaining));
    assert!((before..=after).contains(&server_ms));
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{THEIRS}")));
    assert!((4_000..=5_000).contains(&pttl(&mut conn, &k.lock).await));
    let (list, entries) = queue(&mut conn, &k).await;
    assert_eq!(list, [OURS]);
    // Its entry: deadline, claim, secret, and the mode it waits for.
    assert_eq!(entries[OURS], format!("{} 2000 aa x", server_ms + 10_000));
    // The queue lives as long as the wait and a claim, and a quarter of that more.
    for key in [&k.queue, &k.waiters] {
        assert!((14_000..=15_000).contains(&pttl(&mut conn, key).await));
    }
    // A later attempt keeps its place, with its new secret, and does not mark twice.
    set_px(&mut conn, &k.lock, &format!("~{THEIRS}"), 5_000).await;
    let _ = fair_acquire(&mut conn, &k, (OURS, 9_000, "bb", WAITED)).await;
    let (list, entries) = queue(&mut conn, &k).await;
    assert_eq!(list, [OURS]);
    assert!(entries[OURS].ends_with(" 2000 bb x"), "{entries:?}");
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{THEIRS}")));
    // Another waiter queues behind.
    let _ = fair_acquire(&mut conn, &k, (SECOND, 20_000, "cc", NOT_YET)).await;
    assert_eq!(queue(&mut conn, &k).await.0, [OURS, SECOND]);
    assert!(pttl(&mut conn, &k.queue).await > 21_000);
    // A later attempt that waits longer (its presence moved on) moves its deadline on, and
    // the queue keys' life with it; its place stays.
    let (_, before) = now(&mut conn).await;
    let _ = fair_acquire(&mut conn, &k, (OURS, 60_000, "dd", WAITED)).await;
    let (list, entries) = queue(&mut conn, &k).await;
    assert_eq!(list, [OURS, SECOND]);
    let deadline: u64 = entries[OURS].split(' ').next().unwrap().parse().unwrap();
    assert!(deadline >= before + 60_000, "{entries:?}");
    for key in [&k.queue, &k.waiters] {
        assert!(pttl(&mut conn, key).await > 61_000);
    }
}

// ---- fair/refresh.lua ----

/// FAIR_REFRESH of `k`'s queue with a claim of 2 s for `waiters` (token, ms to keep): the
/// tokens no longer queued.
async fn fair_refresh(
    conn: &mut MultiplexedConnection,
    k: &Keys,
    waiters: &[(&str, u64)],
) -> Vec<String> {
    let args: Vec<(&str, u64)> = waiters.to_vec();
    run(
        conn,
        "fair_refresh",
        &[&*k.queue, &k.waiters],
        (2_000, args),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_refresh_moves_live_entries_deadlines_on_and_names_the_waiters_no_longer_queued() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("fair-refresh");
    let (_, at) = now(&mut conn).await;
    enqueue(&mut conn, &k, OURS, &entry(at + 1_000, 2_000, "aa", "x")).await;
    enqueue(&mut conn, &k, SECOND, &entry(at - 1, 2_000, "bb", "r")).await;
    for key in [&k.queue, &k.waiters] {
        let _: bool = conn.pexpire(key, 3_000).await.unwrap();
    }
    // THEIRS was handed the lock (no entry), SECOND's wait passed.
    let gone = fair_refresh(
        &mut conn,
        &k,
        &[(OURS, 30_000), (SECOND, 30_000), (THEIRS, 30_000)],
    )
    .await;
    assert_eq!(gone, [SECOND, THEIRS]);
    let (list, entries) = queue(&mut conn, &k).await;
    assert_eq!(list, [OURS, SECOND], "places never change");
    let (deadline, rest) = entries[OURS].split_once(' ').unwrap();
    assert!(
        deadline.parse::<u64>().unwrap() >= at + 30_000,
        "{entries:?}"
    );
    assert_eq!(rest, "2000 aa x", "claim, secret and mode are kept");
    assert_eq!(
        entries[SECOND],
        entry(at - 1, 2_000, "bb", "r"),
        "a lapsed entry is not revived"
    );
    // The queue keys live as long as the longest entry and a claim.
    for key in [&k.queue, &k.waiters] {
        assert!((31_000..=32_000).contains(&pttl(&mut conn, key).await));
    }
    // Nobody left to keep: nothing changes, and every token is named.
    let gone = fair_refresh(&mut conn, &k, &[(THEIRS, 1_000)]).await;
    assert_eq!(gone, [THEIRS]);
    assert!(pttl(&mut conn, &k.queue).await > 30_000);
}

#[tokio::test]
async fn a_fair_acquire_of_a_free_key_serves_the_first_live_waiter_before_itself() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("fair-line");
    let mut channel = Channel::subscribe(&server, &k.lock).await;
    let (_, ms) = now(&mut conn).await;
    enqueue(&mut conn, &k, FIRST, &entry(ms - 1, 1_500, "aa", EXCLUSIVE)).await; // expired
    enqueue(
        &mut conn,
        &k,
        SECOND,
        &entry(ms + 60_000, 1_500, "bb", EXCLUSIVE),
    )
    .await;
    let reply = fair_acquire(&mut conn, &k, (OURS, 10_000, "cc", NOT_YET)).await;
    let (remaining, _) = queued(reply);
    // Handed to the live waiter that was first in line; the caller queued behind it.
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{SECOND}")));
    assert!((1_000..=1_500).contains(&remaining), "{remaining}");
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
    let reply = fair_acquire(&mut conn, &k, (OURS, 10_000, "ee", NOT_YET)).await;
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
    let reply = fair_acquire(&mut conn, &k, (OURS, 10_000, "aa", NOT_YET)).await;
    assert_eq!(token_of(&reply), clock + 1_000_001);
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{OURS}")));
    assert!(pttl(&mut conn, &k.lock).await > 29_000);
    // Ours unmarked (a retried request): taken as it is.
    set_px(&mut conn, &k.lock, OURS, 2_000).await;
    let reply = fair_acquire(&mut conn, &k, (OURS, 10_000, "aa", NOT_YET)).await;
    assert_eq!(token_of(&reply), clock + 1_000_002);
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some(OURS));
}

#[tokio::test]
async fn a_fair_reader_joins_the_readers_when_nobody_is_queued() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("fair-readers").held(SHARED);
    let (_, ms) = now(&mut conn).await;
    hold(&mut conn, &k, THEIRS, ms + 5_000).await;
    let (_, before) = now(&mut conn).await;
    let reply = fair_acquire(&mut conn, &k, (OURS, 10_000, "aa", NOT_YET)).await;
    let (_, after) = now(&mut conn).await;
    let token = token_of(&reply);
    assert_eq!(members(&mut conn, &k).await, [THEIRS, OURS]);
    let ours = expiry(&mut conn, &k, OURS).await.unwrap();
    assert!((before + 30_000..=after + 30_000).contains(&ours), "{ours}");
    assert!(pttl(&mut conn, &k.holders).await > 29_000);
    assert_eq!(get(&mut conn, &k.fence).await, Some(token.to_string()));
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some("holders"));
    assert!(!exists(&mut conn, &k.queue).await);
}

#[tokio::test]
async fn a_fair_reader_queues_behind_a_queued_writer_though_only_readers_hold_the_key() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("fair-behind").held(SHARED);
    let (_, ms) = now(&mut conn).await;
    hold(&mut conn, &k, THEIRS, ms + 5_000).await;
    enqueue(
        &mut conn,
        &k,
        FIRST,
        &entry(ms + 60_000, 2_000, "aa", EXCLUSIVE),
    )
    .await;
    let reply = fair_acquire(&mut conn, &k, (OURS, 10_000, "bb", NOT_YET)).await;
    let (remaining, server_ms) = queued(reply);
    // It can read once the writer has had the key: after the reader's expiry at the earliest.
    assert!((4_000..=5_000).contains(&remaining), "{remaining}");
    assert_eq!(members(&mut conn, &k).await, [THEIRS]);
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some("holders"));
    let (list, entries) = queue(&mut conn, &k).await;
    assert_eq!(list, [FIRST, OURS]);
    // Its entry carries its mode, for the release that will serve it.
    assert_eq!(entries[OURS], format!("{} 2000 bb r", server_ms + 10_000));
}

#[tokio::test]
async fn a_fair_reader_that_waits_for_a_writer_marks_it_and_queues() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("fair-reader-waits").held(SHARED);
    set_px(&mut conn, &k.lock, THEIRS, 5_000).await;
    let reply = fair_acquire(&mut conn, &k, (OURS, 10_000, "aa", NOT_YET)).await;
    let (remaining, server_ms) = queued(reply);
    assert!((4_000..=5_000).contains(&remaining), "{remaining}");
    // Marked, so that the writer's release hands the key over.
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{THEIRS}")));
    assert!(!exists(&mut conn, &k.holders).await);
    let (list, entries) = queue(&mut conn, &k).await;
    assert_eq!(list, [OURS]);
    assert_eq!(entries[OURS], format!("{} 2000 aa r", server_ms + 10_000));
}

#[tokio::test]
async fn a_fair_reader_first_in_line_takes_the_key_and_the_readers_behind_it_are_handed_it_too() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("fair-head").held(SHARED);
    let mut channel = Channel::subscribe(&server, &k.lock).await;
    let (_, ms) = now(&mut conn).await;
    enqueue(
        &mut conn,
        &k,
        OURS,
        &entry(ms + 60_000, 2_000, "aa", SHARED),
    )
    .await;
    enqueue(
        &mut conn,
        &k,
        SECOND,
        &entry(ms + 60_000, 1_500, "bb", SHARED),
    )
    .await;
    enqueue(
        &mut conn,
        &k,
        THIRD,
        &entry(ms + 60_000, 1_500, "cc", EXCLUSIVE),
    )
    .await;
    let (_, before) = now(&mut conn).await;
    let reply = fair_acquire(&mut conn, &k, (OURS, 10_000, "aa", WAITED)).await;
    let (_, after) = now(&mut conn).await;
    let token = token_of(&reply);
    // Its own attempt takes it, for its ttl, not for a claim.
    let ours = expiry(&mut conn, &k, OURS).await.unwrap();
    assert!((before + 30_000..=after + 30_000).contains(&ours), "{ours}");
    // The reader behind it is handed it for its claim, told by a message signed with its
    // secret; no message for the caller.
    let second = expiry(&mut conn, &k, SECOND).await.unwrap();
    assert!(
        (before + 1_500..=after + 1_500).contains(&second),
        "{second}"
    );
    let published = channel.published(&mut conn).await;
    assert_eq!(published.len(), 1, "{published:?}");
    let handoff = handoff(&published[0], "bb");
    assert_eq!((handoff.token.as_str(), handoff.claim_ms), (SECOND, 1_500));
    assert!(token > handoff.fence, "{token} {handoff:?}");
    assert_eq!(get(&mut conn, &k.fence).await, Some(token.to_string()));
    // The writer behind them waits for them.
    assert_eq!(queue(&mut conn, &k).await.0, [THIRD]);
    assert_eq!(get(&mut conn, &k.lock).await.as_deref(), Some("holders"));
}

#[tokio::test]
async fn a_fair_reader_confirms_its_handed_share_before_a_queued_writer_unless_it_lapsed() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("fair-reader-confirm").held(SHARED);
    let (clock, ms) = now(&mut conn).await;
    // Handed to us for a claim of 2 s, with the hand-off's token in the counter; a writer has
    // queued since, and waits for us.
    hold(&mut conn, &k, OURS, ms + 2_000).await;
    set_px(
        &mut conn,
        &k.fence,
        &(clock + 1_000_000).to_string(),
        30_000,
    )
    .await;
    enqueue(
        &mut conn,
        &k,
        FIRST,
        &entry(ms + 60_000, 1_500, "aa", EXCLUSIVE),
    )
    .await;
    let (_, before) = now(&mut conn).await;
    let reply = fair_acquire(&mut conn, &k, (OURS, 10_000, "bb", WAITED)).await;
    let (_, after) = now(&mut conn).await;
    // Ours already: held for the ttl, with a token above the hand-off's.
    assert_eq!(token_of(&reply), clock + 1_000_001);
    let ours = expiry(&mut conn, &k, OURS).await.unwrap();
    assert!((before + 30_000..=after + 30_000).contains(&ours), "{ours}");
    assert!(pttl(&mut conn, &k.holders).await > 29_000);
    assert_eq!(queue(&mut conn, &k).await.0, [FIRST]);

    // A claim that lapsed before its confirmation holds nothing: the writer is served first.
    hold(&mut conn, &k, OURS, ms - 1).await;
    let reply = fair_acquire(&mut conn, &k, (OURS, 10_000, "bb", WAITED)).await;
    queued(reply);
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{FIRST}")));
    assert_eq!(expiry(&mut conn, &k, OURS).await, None);
    assert_eq!(queue(&mut conn, &k).await.0, [OURS]);
}

#[tokio::test]
async fn a_fair_permit_request_queues_at_n_with_its_mode_and_takes_a_permit_freed_at_its_turn() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("fair-permits").held("2");
    let mut channel = Channel::subscribe(&server, &k.lock).await;
    let (_, ms) = now(&mut conn).await;
    hold(&mut conn, &k, THEIRS, ms + 5_000).await;
    hold(&mut conn, &k, FIRST, ms + 9_000).await;
    let reply = fair_acquire(&mut conn, &k, (OURS, 10_000, "aa", NOT_YET)).await;
    let (remaining, server_ms) = queued(reply);
    // A permit is freed by the first holder's expiry.
    assert!((4_000..=5_000).contains(&remaining), "{remaining}");
    assert_eq!(expiry(&mut conn, &k, OURS).await, None);
    let (list, entries) = queue(&mut conn, &k).await;
    assert_eq!(list, [OURS]);
    assert_eq!(entries[OURS], format!("{} 2000 aa 2", server_ms + 10_000));

    // The first holder's lease ended: the caller, first in line, takes the permit at its next
    // attempt, itself, with no message.
    hold(&mut conn, &k, THEIRS, ms - 1).await;
    let (_, before) = now(&mut conn).await;
    let reply = fair_acquire(&mut conn, &k, (OURS, 9_000, "bb", WAITED)).await;
    let (_, after) = now(&mut conn).await;
    token_of(&reply);
    assert_eq!(
        members(&mut conn, &k).await,
        [k.member(FIRST), k.member(OURS)]
    );
    let ours = expiry(&mut conn, &k, OURS).await.unwrap();
    assert!((before + 30_000..=after + 30_000).contains(&ours), "{ours}");
    let (list, entries) = queue(&mut conn, &k).await;
    assert!(
        list.is_empty() && entries.is_empty(),
        "{list:?} {entries:?}"
    );
    assert_eq!(channel.published(&mut conn).await, Vec::<String>::new());
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
    assert!(inspect(&mut conn, &k).await.is_none());
    let (_, ms) = now(&mut conn).await;
    enqueue(
        &mut conn,
        &k,
        FIRST,
        &entry(ms + 60_000, 2_000, "aa", EXCLUSIVE),
    )
    .await;
    enqueue(&mut conn, &k, THIRD, &entry(ms - 1, 2_000, "cc", EXCLUSIVE)).await; // wait passed
    enqueue(
        &mut conn,
        &k,
        SECOND,
        &entry(ms + 60_000, 2_000, "bb", SHARED),
    )
    .await;
    let _: i64 = conn.rpush(&k.queue, OURS).await.unwrap(); // left: no entry
    enqueue(&mut conn, &k, THEIRS, &format!("{} 2000", ms + 60_000)).await; // before modes
    set_px(&mut conn, &k.fence, "1234", 60_000).await;
    for value in [THEIRS.to_owned(), format!("~{THEIRS}")] {
        set_px(&mut conn, &k.lock, &value, 5_000).await;
        let seen = inspect(&mut conn, &k).await.expect("held");
        assert_eq!(seen.kind, "x", "{value}");
        assert!((4_000..=5_000).contains(&seen.remaining), "{seen:?}");
        assert_eq!((seen.counter.as_str(), seen.waiters), ("1234", 4));
        assert_eq!((seen.holders, seen.members), (1, vec![THEIRS.to_owned()]));
        // The live waiters in arrival order, with the mode each waits for; the others stay.
        let live = [(FIRST, EXCLUSIVE), (SECOND, SHARED), (THEIRS, EXCLUSIVE)];
        let live: Vec<_> = live.map(|(t, m)| (t.to_owned(), m.to_owned())).into();
        assert_eq!(seen.queued, live);
        assert_eq!(queue(&mut conn, &k).await.0.len(), 5);
        assert_eq!(get(&mut conn, &k.lock).await, Some(value));
    }
    // Counter and entries of other types read as none; a lock of another type as free.
    let _: i64 = conn.del(&[&k.fence, &k.waiters]).await.unwrap();
    let _: i64 = conn.rpush(&k.fence, "x").await.unwrap();
    let _: i64 = conn.rpush(&k.waiters, "x").await.unwrap();
    let seen = inspect(&mut conn, &k).await.expect("held");
    assert_eq!((seen.counter.as_str(), seen.waiters), ("", 0));
    assert!(seen.queued.is_empty(), "{seen:?}");
    let _: i64 = conn.del(&k.lock).await.unwrap();
    let _: i64 = conn.rpush(&k.lock, "x").await.unwrap();
    assert!(inspect(&mut conn, &k).await.is_none());
}

/// The kind INSPECT answers of `k` (`x`, `h`, `s`), given a hand-off's claim of `claim` ms.
async fn inspected_kind(conn: &mut MultiplexedConnection, k: &Keys, claim: &[u64]) -> String {
    let keys = [&*k.lock, &k.fence, &k.waiters, &k.holders, &k.queue];
    let reply: Vec<Value> = run(conn, "inspect", &keys, claim).await.unwrap();
    String::from_redis_value(reply[0].clone()).unwrap()
}

#[tokio::test]
async fn inspect_tells_a_hand_offs_claim_from_a_lease_until_its_recipient_extends_it() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("claimed");
    // A lease of 30 s, waited on by a fair waiter with a claim of 2 s.
    let (us, ms) = now(&mut conn).await;
    set_px(&mut conn, &k.fence, &us.to_string(), 30_000).await;
    set_px(&mut conn, &k.lock, &format!("~{OURS}"), 30_000).await;
    enqueue(
        &mut conn,
        &k,
        FIRST,
        &entry(ms + 60_000, 2_000, "aa", EXCLUSIVE),
    )
    .await;
    assert_eq!(inspected_kind(&mut conn, &k, &[2_000]).await, "x");
    // Released: handed to the waiter for its claim.
    assert_eq!(
        release(&mut conn, &[&k], (OURS, NOT_QUEUED, WAITED_ON)).await,
        1
    );
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{FIRST}")));
    assert_eq!(inspected_kind(&mut conn, &k, &[2_000]).await, "h");
    // A caller that does not say the claim is told a lease.
    assert_eq!(inspected_kind(&mut conn, &k, &[]).await, "x");
    // The recipient's renewal extends it to its ttl: a lease.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert_eq!(extend(&mut conn, 30_000, &[(FIRST, vec![&k])]).await, [1]);
    assert_eq!(inspected_kind(&mut conn, &k, &[2_000]).await, "x");
    // A lease as long as the claim, marked and not renewed, reads as a claim (documented).
    let (us, ms) = now(&mut conn).await;
    set_px(&mut conn, &k.fence, &us.to_string(), 2_000).await;
    let expiry = ms + 2_000;
    let () = redis::cmd("SET")
        .arg(&k.lock)
        .arg(format!("~{THEIRS}"))
        .arg("PXAT")
        .arg(expiry)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(inspected_kind(&mut conn, &k, &[2_000]).await, "h");
    // Unmarked, it is a lease: a hand-off always marks.
    let () = redis::cmd("SET")
        .arg(&k.lock)
        .arg(THEIRS)
        .arg("PXAT")
        .arg(expiry)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(inspected_kind(&mut conn, &k, &[2_000]).await, "x");
}

#[tokio::test]
async fn inspect_lists_the_live_members_of_a_shared_or_permit_key_by_expiry_and_writes_nothing() {
    // Redis refuses any write from a script so flagged.
    assert!(script("inspect").starts_with("#!lua flags=no-writes\n"));
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let reader = keys("seen-reader").held(SHARED);
    let (_, ms) = now(&mut conn).await;
    hold(&mut conn, &reader, THEIRS, ms + 9_000).await;
    hold(&mut conn, &reader, OURS, ms + 3_000).await;
    hold(&mut conn, &reader, FIRST, ms - 1).await; // expired
    set_px(&mut conn, &reader.fence, "1234", 60_000).await;
    enqueue(
        &mut conn,
        &reader,
        SECOND,
        &entry(ms + 60_000, 2_000, "aa", EXCLUSIVE),
    )
    .await;
    let seen = inspect(&mut conn, &reader).await.expect("read");
    assert_eq!(seen.kind, "s");
    assert_eq!(seen.queued, [(SECOND.to_owned(), EXCLUSIVE.to_owned())]);
    // Held until the last member's expiry.
    assert!((8_000..=9_000).contains(&seen.remaining), "{seen:?}");
    assert_eq!((seen.counter.as_str(), seen.waiters), ("1234", 1));
    assert_eq!(
        (seen.holders, seen.members),
        (2, vec![OURS.to_owned(), THEIRS.to_owned()])
    );
    // The expired member is left where it was.
    assert_eq!(expiry(&mut conn, &reader, FIRST).await, Some(ms - 1));

    let permit = keys("seen-permit").held("2");
    hold(&mut conn, &permit, OURS, ms + 5_000).await;
    hold(&mut conn, &permit, THEIRS, ms + 4_000).await;
    let seen = inspect(&mut conn, &permit).await.expect("held");
    assert_eq!(seen.kind, "s");
    assert!((4_000..=5_000).contains(&seen.remaining), "{seen:?}");
    assert_eq!((seen.counter.as_str(), seen.waiters), ("", 0));
    assert_eq!(
        (seen.holders, seen.members),
        (2, vec![permit.member(THEIRS), permit.member(OURS)])
    );

    // Only expired members: free.
    let gone = keys("seen-gone").held(SHARED);
    hold(&mut conn, &gone, OURS, ms - 1).await;
    assert!(inspect(&mut conn, &gone).await.is_none());
    assert_eq!(expiry(&mut conn, &gone, OURS).await, Some(ms - 1));
}

/// A read refused by an ACL rule is raised, not read as nothing: each server names the command
/// (Redis 7.2 and later, Valkey) or the script's line (Redis 7.0), and that line runs it. A key
/// of another type still reads as nothing (the test above).
#[tokio::test]
async fn inspect_raises_a_read_the_user_may_not_run_on_the_line_that_runs_it() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let held = keys("refused-x");
    let shared = keys("refused-s").held(SHARED);
    let (_, ms) = now(&mut conn).await;
    set_px(&mut conn, &held.lock, THEIRS, 30_000).await;
    set_px(&mut conn, &held.fence, "1234", 60_000).await;
    enqueue(
        &mut conn,
        &held,
        FIRST,
        &entry(ms + 60_000, 2_000, "aa", EXCLUSIVE),
    )
    .await;
    hold(&mut conn, &shared, OURS, ms + 9_000).await;
    let code = script("inspect");
    for (command, k) in [
        ("get", &held),
        ("hlen", &held),
        ("lindex", &held),
        ("hget", &held),
        ("zcount", &shared),
    ] {
        let minus = format!("-{command}");
        let mut limited =
            connect_as(&server, &format!("no-{command}"), &["~*", "+@all", &minus]).await;
        let keys = [&*k.lock, &k.fence, &k.waiters, &k.holders, &k.queue];
        let error = run::<Value>(&mut limited, "inspect", &keys, NO_ARGS)
            .await
            .expect_err(command);
        let text = error.to_string();
        let line = text
            .split("@user_script:")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<usize>().ok())
            .and_then(|n| code.lines().nth(n - 1))
            .unwrap_or_default();
        let upper = format!("'{}'", command.to_uppercase());
        assert!(
            line.contains(&upper),
            "{command}: {text} raised on `{line}`"
        );
    }
}

// ---- force_release.lua ----

#[tokio::test]
async fn force_release_deletes_whoever_holds_and_hands_over_to_a_live_waiter() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("forced");
    let mut channel = Channel::subscribe(&server, &k.lock).await;
    assert_eq!(force_release(&mut conn, &k).await, 0);
    for value in [THEIRS.to_owned(), format!("~{THEIRS}")] {
        set_px(&mut conn, &k.lock, &value, 30_000).await;
        assert_eq!(force_release(&mut conn, &k).await, 1);
        assert_eq!(get(&mut conn, &k.lock).await, None);
        assert_eq!(channel.published(&mut conn).await, [""]);
    }
    // A live waiter (behind an expired one) is handed the lock.
    let (_, ms) = now(&mut conn).await;
    enqueue(&mut conn, &k, FIRST, &entry(ms - 1, 1_500, "aa", EXCLUSIVE)).await;
    enqueue(
        &mut conn,
        &k,
        SECOND,
        &entry(ms + 60_000, 1_500, "bb", EXCLUSIVE),
    )
    .await;
    set_px(&mut conn, &k.lock, THEIRS, 30_000).await;
    assert_eq!(force_release(&mut conn, &k).await, 1);
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

#[tokio::test]
async fn force_release_of_a_shared_key_drops_every_member_and_serves_the_queue() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let k = keys("forced-shared");
    let (reader, permit) = (k.held(SHARED), k.held("3"));
    let mut channel = Channel::subscribe(&server, &k.lock).await;
    // Only an expired member: free, and left as it is.
    let (_, ms) = now(&mut conn).await;
    hold(&mut conn, &reader, OURS, ms - 1).await;
    assert_eq!(force_release(&mut conn, &k).await, 0);
    assert_eq!(expiry(&mut conn, &reader, OURS).await, Some(ms - 1));
    assert_eq!(channel.published(&mut conn).await, Vec::<String>::new());

    // Two readers and a permit holder, a writer queued: every member goes, the writer is
    // handed the key.
    hold(&mut conn, &reader, OURS, ms + 30_000).await;
    hold(&mut conn, &reader, THEIRS, ms + 30_000).await;
    hold(&mut conn, &permit, THIRD, ms + 30_000).await;
    enqueue(
        &mut conn,
        &k,
        FIRST,
        &entry(ms + 60_000, 1_500, "aa", EXCLUSIVE),
    )
    .await;
    assert_eq!(force_release(&mut conn, &k).await, 1);
    assert!(!exists(&mut conn, &k.holders).await);
    assert_eq!(get(&mut conn, &k.lock).await, Some(format!("~{FIRST}")));
    // Handed to the writer: nothing else is announced.
    let published = channel.published(&mut conn).await;
    assert_eq!(published.len(), 1, "{published:?}");
    assert_eq!(handoff(&published[0], "aa").token, FIRST);
    assert!(queue(&mut conn, &k).await.0.is_empty());

    // Readers, nobody queued: dropped, and announced.
    let _: i64 = conn.del(&k.lock).await.unwrap();
    hold(&mut conn, &reader, OURS, ms + 30_000).await;
    hold(&mut conn, &reader, THEIRS, ms + 30_000).await;
    assert_eq!(force_release(&mut conn, &k).await, 1);
    assert!(!exists(&mut conn, &k.holders).await);
    assert_eq!(channel.published(&mut conn).await, [""]);
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
        &k.holders,
        "PUBLISH",
        "SUBSCRIBE",
        "UNSUBSCRIBE",
        "SELECT 0",
    ];
    type Checked = (Vec<String>, i64, i64, String, String, String, Vec<String>);
    let (missing, publish, subscribe, product, version, redis_version, unknown): Checked =
        run(&mut conn, "check", &[], args).await.unwrap();
    assert_eq!((missing, publish, subscribe), (vec![], 1, 1));
    assert!(unknown.is_empty(), "{unknown:?}");
    // What the server is, as its INFO says (Valkey reports `valkey_version` beside the
    // `redis_version` it is compatible with).
    assert_eq!(
        Some(redis_version.clone()),
        server.info_field("redis_version")
    );
    match server.info_field("valkey_version") {
        Some(valkey) => assert_eq!((product.as_str(), version), ("valkey", valkey)),
        None => assert_eq!((product.as_str(), version), ("redis", redis_version)),
    }
    let rules = ["~*", "+@all", "-hset", "-zadd", "-select", "resetchannels"];
    let mut limited = connect_as(&server, "limited", &rules).await;
    // And a command the server does not know (renamed away, or a proxy's).
    let args = [args, &["NOSUCHCOMMAND 1"]].concat();
    let (missing, publish, subscribe, _, _, _, unknown): Checked =
        run(&mut limited, "check", &[], &args).await.unwrap();
    assert_eq!(
        missing,
        [
            format!("HSET {}", k.waiters),
            format!("ZADD {}", k.holders),
            "SELECT 0".to_owned()
        ]
    );
    assert_eq!((publish, subscribe), (0, 0));
    assert_eq!(unknown, ["NOSUCHCOMMAND 1"]);
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
    let _: usize = conn.zadd("z", "x", 1).await.unwrap();
    let _: i64 = conn.sadd("set", "x").await.unwrap();
    let types: Vec<String> = run(
        &mut conn,
        "key_types",
        &["gone", "s", "h", "l", "z", "set"],
        NO_ARGS,
    )
    .await
    .unwrap();
    assert_eq!(types, ["none", "string", "hash", "list", "zset", "other"]);
    // And changes none of them.
    let list: Vec<String> = conn.lrange("l", 0, -1).await.unwrap();
    assert_eq!(list, ["x"]);
    let zset: Vec<String> = conn.zrange("z", 0, -1).await.unwrap();
    assert_eq!(zset, ["x"]);
}

// ---- shared functions, called on their own ----

/// The files of the shared functions the scripts are composed from (the runtime's `src/`).
const OWNER_LUA: &str = include_str!("../../distlock-runtime/src/scripts/owner.lua");
const COUNTER_LUA: &str = include_str!("../../distlock-runtime/src/scripts/counter.lua");
const HOLDERS_LUA: &str = include_str!("../../distlock-runtime/src/scripts/holders.lua");
const ENTRY_LUA: &str = include_str!("../../distlock-runtime/src/fair/entry.lua");

/// Runs `body` after the shared functions of `files`, with `keys` and `args`, as `EVAL`.
async fn call<T: FromRedisValue>(
    conn: &mut MultiplexedConnection,
    (files, body): (&[&str], &str),
    keys: &[&str],
    args: impl ToRedisArgs,
) -> T {
    redis::cmd("EVAL")
        .arg(format!("{}{body}", files.concat()))
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .query_async(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn is_owner_is_the_token_marked_or_not_and_nothing_else() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let _: i64 = conn.rpush("a-list", "x").await.unwrap();
    // 1 for each value the token owns: ARGV[2...], a missing key's false, and a GET under
    // pcall of a key of another type.
    let body = "local owned = {}
      for i = 2, #ARGV do owned[#owned + 1] = is_owner(ARGV[i], ARGV[1]) and 1 or 0 end
      owned[#owned + 1] = is_owner(false, ARGV[1]) and 1 or 0
      owned[#owned + 1] = is_owner(redis.pcall('GET', KEYS[1]), ARGV[1]) and 1 or 0
      return owned";
    let marked = format!("~{OURS}");
    let twice = format!("~~{OURS}");
    let owned: Vec<i64> = call(
        &mut conn,
        (&[OWNER_LUA], body),
        &["a-list"],
        (OURS, OURS, &marked, THEIRS, &twice, ""),
    )
    .await;
    assert_eq!(owned, [1, 1, 0, 0, 0, 0, 0]);
}

#[tokio::test]
async fn exceeds_orders_tokens_as_numbers_and_keep_for_adds_how_far_one_is_ahead() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let body = "local pairs = {{'10', '9'}, {'9', '10'}, {'124', '123'}, {'123', '124'},
        {'123', '123'}}
      local order = {}
      for _, p in ipairs(pairs) do order[#order + 1] = exceeds(p[1], p[2]) and 1 or 0 end
      -- Redis's clock at 1,000,000 s.
      local t = {'1000000', '0'}
      return {order, {keep_for('5000', '999999000000', t), keep_for(5000, '1000000000000', t),
        keep_for('5000', '1000002500001', t), keep_for(5000, 1000000000999, t)}}";
    let (order, kept): (Vec<i64>, Vec<String>) =
        call(&mut conn, (&[COUNTER_LUA], body), &[], NO_ARGS).await;
    assert_eq!(order, [1, 0, 1, 0, 0]);
    // Behind or at the clock: the ttl; ahead: as much longer, to the ms rounded up.
    assert_eq!(kept, ["5000", "5000", "7501", "5001"]);
}

#[tokio::test]
async fn an_entry_written_is_read_back_while_its_wait_lasts() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    // Each read as `claim|secret|mode`, or `none`.
    let body = "local function read(entry, now)
        local claim, secret, mode = read_entry(entry, now)
        return claim and (claim .. '|' .. secret .. '|' .. mode) or 'none'
      end
      local entry = write_entry(1000, '2000', 'ab12', 'r')
      return {entry, read(entry, 999), read(entry, 1000), read('1000 2000', 999),
        read('1000 2000 ab12', 999), read('soon 2000 ab12 r', 999), read(false, 999),
        read(redis.pcall('HGET', KEYS[1], 'x'), 999)}";
    let _: () = conn.set("a-string", "x").await.unwrap();
    let read: Vec<String> = call(&mut conn, (&[ENTRY_LUA], body), &["a-string"], NO_ARGS).await;
    assert_eq!(
        read,
        [
            &entry(1000, 2000, "ab12", "r"),
            "2000|ab12|r",
            // Its deadline passed.
            "none",
            // Entries from before secrets and modes: exclusive.
            "2000||x",
            "2000|ab12|x",
            "none",
            // No entry; an entries key of another type.
            "none",
            "none",
        ]
    );
}

/// Whether a lease fits beside the holders `holders` at `ms` (Redis time), in the modes 'x',
/// 'r', '1' and '2', each 1 or 0.
async fn fits(conn: &mut MultiplexedConnection, holders: &str, ms: u64) -> Vec<i64> {
    let body = "local fit = {}
      for _, mode in ipairs({'x', 'r', '1', '2'}) do
        fit[#fit + 1] = fits(mode, KEYS[1], tonumber(ARGV[1])) and 1 or 0
      end
      return fit";
    call(conn, (&[HOLDERS_LUA], body), &[holders], ms).await
}

#[tokio::test]
async fn fits_counts_live_holders_by_mode_and_drops_expired_ones() {
    let server = RedisServer::start();
    let mut conn = server.client().await;
    let (_, ms) = now(&mut conn).await;
    // Nobody holds: everything fits.
    assert_eq!(fits(&mut conn, "holders", ms).await, [1, 1, 1, 1]);
    // Only an expired member: dropped, and everything fits.
    let _: usize = conn.zadd("holders", "gone", ms - 1).await.unwrap();
    assert_eq!(fits(&mut conn, "holders", ms).await, [1, 1, 1, 1]);
    assert!(!exists(&mut conn, "holders").await);
    // One live member: a reader, and one of 2 permits, but no writer nor 1 permit.
    let _: usize = conn.zadd("holders", "live", ms + 30_000).await.unwrap();
    let _: usize = conn.zadd("holders", "gone", ms - 1).await.unwrap();
    assert_eq!(fits(&mut conn, "holders", ms).await, [0, 1, 0, 1]);
    let members: Vec<String> = conn.zrange("holders", 0, -1).await.unwrap();
    assert_eq!(members, ["live"]);
}
