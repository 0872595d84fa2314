//! A Redis Cluster, through redis-rs's `cluster_async` connection: each call goes to the
//! primary serving its keys' slot, `MOVED` / `ASK` and failovers are followed by the client.
//!
//! **Why not deadpool.** deadpool-redis's cluster manager cannot set the cluster client's
//! timeouts or retries, and the defaults are a trap for a lock: no response timeout, 16 retries,
//! and waits between retries that grow to minutes. A cluster connection is multiplexed over one
//! connection per node and reconnects by itself, so the route keeps one, built with bounded
//! settings: the connect and response timeouts of the manager, an overall bound of one response
//! timeout per call however many retries it takes, and at most [`RETRIES`] retries, 10 to
//! 100 ms apart.
//!
//! **Scripts.** A retry may re-send a script after an IO error: every distlock script is
//! idempotent on re-send (an acquire that finds its own token succeeds). A promoted replica has
//! no scripts loaded: `NOSCRIPT` is answered by `EVAL` routed to the same slot (never a
//! `SCRIPT LOAD` to every primary, which fails while one is down).
//!
//! **Straight to the slot's primary.** The route also keeps the slot map (`CLUSTER SLOTS`) and a
//! [`Link`] per primary, and sends each call straight on the link of its slot's primary: one
//! hop fewer than through the cluster connection's routing task, and with `min_replicas`, writes
//! and their `WAIT` run on connections of their own per node (see `conn.rs`), so a slow replica
//! stalls no other call. An answer that says the slot is elsewhere or moving (`MOVED`, `ASK`,
//! `TRYAGAIN`, `CLUSTERDOWN`: refused before anything ran), or a node that cannot be reached,
//! sends the call through the cluster connection instead, which follows redirections, and has
//! the slot map fetched again. A link reaches its node the way the first seed is reached: plain
//! TCP, or TLS with the manager's certificates (a node answers `CLUSTER SLOTS` on a TLS
//! connection with its TLS port).
//!
//! **Notifications** use sharded pub/sub: the scripts announce with `SPUBLISH` on the lock key's
//! name, whose slot is the lock's, and waiters `SSUBSCRIBE` over a RESP3 cluster connection of
//! their own. A subscription the server ends (its slot moved) is reported and made again where
//! the slot lives; a node's connection lost ends the whole subscriber connection, so waiters
//! poll (with a bound) and subscribe anew.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{TlsCertificates, Value};

use super::{push_handler, Channels, Ended, OnMessage, Route, Subscribe};
use crate::call::{self, Failed, Reached};
use crate::call::{confirmed, BoxFuture, Replicas, ScriptCall};
use crate::conn::{self, lock, Dial, Link, Timeouts};
use crate::error::LockError;
use crate::tls::Tls;

/// Retries of one call (after an IO error, `MOVED` to a node not yet connected, `TRYAGAIN`, a
/// cluster briefly down), within one response timeout in all.
const RETRIES: u32 = 3;

/// A Redis Cluster.
pub(crate) struct Cluster {
    client: ClusterClient,
    conn: Mutex<Option<ClusterConnection>>,
    /// With `min_replicas`: the client and connection of the writes followed by `WAIT`.
    replicated: Option<(ClusterClient, Mutex<Option<ClusterConnection>>)>,
    /// The seed nodes, for the subscriber's client.
    seeds: Vec<redis::ConnectionInfo>,
    /// The certificates for `rediss://` seeds, for the subscriber's client.
    certificates: Option<TlsCertificates>,
    timeouts: Timeouts,
    endpoint: String,
    replicas: Option<Replicas>,
    /// The slot map and the links to the primaries, shared with the task that refreshes them.
    direct: Arc<Direct>,
}

/// The link to the primary of each of the 16384 slots (`None`: a slot no primary serves).
type SlotMap = Arc<[Option<Arc<Link>>]>;

/// Which primary serves each slot, and a link to each primary.
struct Direct {
    /// `None` until fetched, and again once an answer showed it stale.
    slots: RwLock<Option<SlotMap>>,
    links: Mutex<HashMap<(String, u16), Arc<Link>>>,
    refreshing: AtomicBool,
    /// How to reach a node: the first seed's address (TLS or not, with its certificates) and
    /// its user, password and database; `None` when the seeds use a socket (then every call
    /// goes through the cluster connection).
    settings: Option<(redis::ConnectionAddr, redis::RedisConnectionInfo)>,
    timeouts: Timeouts,
    replicas: Option<Replicas>,
}

impl Cluster {
    pub(crate) fn new(
        urls: &[String],
        tls: &Tls,
        timeouts: Timeouts,
        replicas: Option<Replicas>,
    ) -> Result<Self, LockError> {
        if urls.is_empty() {
            return Err(LockError::InvalidConfig {
                what: "cluster",
                reason: "give at least one seed node URL".to_owned(),
            });
        }
        let mut seeds = Vec::with_capacity(urls.len());
        let mut shown = Vec::with_capacity(urls.len());
        for url in urls {
            let (info, endpoint) = conn::parse_url(url, tls)?;
            seeds.push(info);
            shown.push(endpoint);
        }
        let invalid = |e: redis::RedisError| LockError::InvalidConfig {
            what: "cluster",
            reason: e.to_string(),
        };
        // The cluster client takes its certificates apart from the seeds' addresses.
        let certificates = tls
            .certificates()
            .filter(|_| matches!(seeds[0].addr(), redis::ConnectionAddr::TcpTls { .. }));
        let client = builder(&seeds, certificates.as_ref(), timeouts)
            .build()
            .map_err(invalid)?;
        let replicated = match replicas {
            Some(replicas) => {
                let client = builder(&seeds, certificates.as_ref(), timeouts)
                    .overall_response_timeout(Some(timeouts.response + replicas.timeout))
                    .response_timeout(timeouts.response + replicas.timeout)
                    .build()
                    .map_err(invalid)?;
                Some((client, Mutex::new(None)))
            }
            None => None,
        };
        let settings = matches!(
            seeds[0].addr(),
            redis::ConnectionAddr::Tcp(..) | redis::ConnectionAddr::TcpTls { .. }
        )
        .then(|| (seeds[0].addr().clone(), seeds[0].redis_settings().clone()));
        Ok(Self {
            client,
            conn: Mutex::new(None),
            replicated,
            seeds,
            certificates,
            timeouts,
            endpoint: format!("cluster [{}]", shown.join(", ")),
            replicas,
            direct: Arc::new(Direct {
                slots: RwLock::new(None),
                links: Mutex::new(HashMap::new()),
                refreshing: AtomicBool::new(false),
                settings,
                timeouts,
                replicas,
            }),
        })
    }

    /// The cluster connection, connecting first if there is none yet.
    async fn connection(&self, op: &'static str) -> Result<ClusterConnection, Failed> {
        connection(&self.client, &self.conn, self.timeouts, op).await
    }

    async fn query(&self, op: &'static str, cmd: redis::Cmd) -> Result<Value, Failed> {
        let conn = self.connection(op).await?;
        query(conn, op, cmd, self.timeouts.response).await
    }

    /// Runs `call` on the link of its slot's primary; through the cluster connection when the
    /// slot map is not known or turns out stale (see the module docs).
    async fn run_call(&self, call: &ScriptCall) -> Result<Value, Failed> {
        let slot = call.first_key().map_or(0, slot);
        match self.direct.link(slot) {
            Some(link) => match link.run(call).await {
                // Refused (the slot moved), or the node is gone (refused the connection): the
                // cluster connection finds where the slot lives now.
                Err(failed) if failed_redirected(&failed) || unreachable(&failed) => {
                    self.direct.forget_slots();
                }
                // A node that hangs (no answer, or no connection within the connect timeout)
                // is an error now, not a second wait through the cluster connection.
                Err(failed) => {
                    if failed.reached == Reached::No {
                        self.direct.forget_slots();
                    }
                    return Err(failed);
                }
                answer => return answer,
            },
            None => self.refresh_slots(),
        }
        self.run_routed(call).await
    }

    /// Fetches the slot map again, from a task of its own (one at a time).
    fn refresh_slots(&self) {
        if self.direct.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.direct.refreshing.store(false, Ordering::Release);
            return;
        };
        let direct = Arc::clone(&self.direct);
        let client = self.client.clone();
        let kept = lock(&self.conn).clone();
        let timeouts = self.timeouts;
        runtime.spawn(async move {
            let slots = fetch_slots(&client, kept, timeouts).await;
            if let Some(slots) = slots {
                direct.install(&slots);
            }
            // Not again at once: a map fetched during a failover may still be stale.
            tokio::time::sleep(Duration::from_millis(100)).await;
            direct.refreshing.store(false, Ordering::Release);
        });
    }

    /// Runs `call` through the cluster connection and, with `min_replicas`, `WAIT`s after it
    /// (see [`Cluster::confirm`]).
    async fn run_routed(&self, call: &ScriptCall) -> Result<Value, Failed> {
        match (&self.replicated, self.replicas) {
            (Some((client, conn)), Some(replicas)) if call.kind.needs_replicas() => {
                let conn = connection(client, conn, self.timeouts, call.op).await?;
                self.confirm(conn, call, replicas).await
            }
            _ => self.run_plain(call).await,
        }
    }

    async fn run_plain(&self, call: &ScriptCall) -> Result<Value, Failed> {
        call.run_with(|cmd| self.query(call.op, cmd)).await
    }

    /// Runs a write and `WAIT`s for `replicas` on the primary of its slot, both on the cluster
    /// connection kept for such writes: `WAIT` must follow the write on the connection that
    /// sent it, and it blocks that connection until the replicas answer. On the connection
    /// every other call uses, a slow replica would stall every lock on its node; here it stalls
    /// only other replicated writes to that node, by at most the replica timeout. An acquire
    /// the replicas did not confirm is undone (see `topology::confirmed`).
    async fn confirm(
        &self,
        conn: ClusterConnection,
        call: &ScriptCall,
        replicas: Replicas,
    ) -> Result<Value, Failed> {
        use redis::cluster_routing::{Route as SlotRoute, SingleNodeRoutingInfo, SlotAddr};
        let op = call.op;
        let after = self.timeouts.response + replicas.timeout;
        let slot = call.first_key().map_or(0, slot);
        let route = SingleNodeRoutingInfo::SpecificNode(SlotRoute::new(slot, SlotAddr::Master));
        // The write and its WAIT in one pipeline, to the slot's primary: one round trip.
        let answer = call
            .run_with(|cmd| {
                let mut pipe = redis::pipe();
                pipe.add_command(cmd)
                    .cmd("WAIT")
                    .arg(replicas.count)
                    .arg(conn::millis(replicas.timeout));
                let (mut conn, route) = (conn.clone(), route.clone());
                async move {
                    let values = conn
                        .route_pipeline(pipe, 0, 2, route)
                        .await
                        .map_err(|source| call::failed(op, source, after))?;
                    // The script's own error (NOSCRIPT, say) fails the call.
                    if let Some(Err(source)) = values.first().cloned().map(Value::extract_error) {
                        return Err(call::failed(op, source, after));
                    }
                    Ok(Value::Array(values))
                }
            })
            .await?;
        confirmed(call, answer, replicas, |undo| async move {
            self.run_plain(&undo).await
        })
        .await
    }
}

impl Direct {
    /// The link to the primary of `slot`, if the slot map is known.
    fn link(&self, slot: u16) -> Option<Arc<Link>> {
        let slots = self
            .slots
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slots.as_ref()?.get(usize::from(slot))?.clone()
    }

    fn forget_slots(&self) {
        *self
            .slots
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// Installs a slot map: `(first slot, last slot, host, port)` per range.
    fn install(&self, ranges: &[(u16, u16, String, u16)]) {
        let Some((transport, settings)) = &self.settings else {
            return;
        };
        let mut links = lock(&self.links);
        let mut slots: Vec<Option<Arc<Link>>> = vec![None; 16384];
        for (first, last, host, port) in ranges {
            let link = links
                .entry((host.clone(), *port))
                .or_insert_with(|| {
                    let info = redis::IntoConnectionInfo::into_connection_info(
                        crate::tls::address_like(transport, host.clone(), *port),
                    )
                    .map(|info| info.set_redis_settings(settings.clone()));
                    let dial = NodeDial {
                        client: info.and_then(redis::Client::open),
                        timeouts: self.timeouts,
                    };
                    Arc::new(Link::new(
                        Box::new(dial),
                        self.timeouts,
                        true,
                        self.replicas,
                    ))
                })
                .clone();
            for slot in slots
                .iter_mut()
                .take(usize::from(*last) + 1)
                .skip(usize::from(*first))
            {
                *slot = Some(Arc::clone(&link));
            }
        }
        drop(links);
        *self
            .slots
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(slots.into());
    }
}

/// Dials one cluster node.
struct NodeDial {
    client: redis::RedisResult<redis::Client>,
    timeouts: Timeouts,
}

impl Dial for NodeDial {
    fn dial(
        &self,
        op: &'static str,
    ) -> BoxFuture<'_, Result<redis::aio::MultiplexedConnection, LockError>> {
        Box::pin(async move {
            match &self.client {
                Ok(client) => conn::dial(client, self.timeouts, op).await,
                Err(error) => Err(LockError::InvalidUrl {
                    reason: error.to_string(),
                }),
            }
        })
    }
}

/// `CLUSTER SLOTS`, asked through the cluster connection: each range's primary. `None` when it
/// cannot be had now (the calls go through the cluster connection meanwhile).
async fn fetch_slots(
    client: &ClusterClient,
    kept: Option<ClusterConnection>,
    timeouts: Timeouts,
) -> Option<Vec<(u16, u16, String, u16)>> {
    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
    let mut conn = match kept {
        Some(conn) => conn,
        None => {
            let connect = client.get_async_connection();
            tokio::time::timeout(timeouts.connect, connect)
                .await
                .ok()?
                .ok()?
        }
    };
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
    let answer = tokio::time::timeout(timeouts.response, conn.route_command(cmd, routing))
        .await
        .ok()?
        .ok()?;
    let Value::Array(ranges) = answer else {
        return None;
    };
    let mut parsed = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let [Value::Int(first), Value::Int(last), Value::Array(primary), ..] = fields.as_slice()
        else {
            return None;
        };
        let [Value::BulkString(host), Value::Int(port), ..] = primary.as_slice() else {
            return None;
        };
        let host = String::from_utf8(host.clone())
            .ok()
            .filter(|h| !h.is_empty())?;
        parsed.push((
            u16::try_from(*first).ok()?,
            u16::try_from(*last).ok()?.min(16383),
            host,
            u16::try_from(*port).ok()?,
        ));
    }
    Some(parsed)
}

/// Whether a call failed because its node could not be connected to at all (not: in time).
fn unreachable(failed: &Failed) -> bool {
    failed.reached == Reached::No && !matches!(failed.error, LockError::RedisTimeout { .. })
}

/// Whether a failed call was refused because its slot is elsewhere or moving.
fn failed_redirected(failed: &Failed) -> bool {
    matches!(&failed.error, LockError::Redis { source, .. } if redirected(source))
}

/// The connection kept in `kept`, connecting `client` first if there is none yet.
async fn connection(
    client: &ClusterClient,
    kept: &Mutex<Option<ClusterConnection>>,
    timeouts: Timeouts,
    op: &'static str,
) -> Result<ClusterConnection, Failed> {
    if let Some(conn) = &*lock(kept) {
        return Ok(conn.clone());
    }
    let connect = client.get_async_connection();
    let after = timeouts.connect;
    let conn = match tokio::time::timeout(after, connect).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(source)) => {
            return Err(Failed {
                error: LockError::from_redis(op, source),
                reached: Reached::No,
            })
        }
        Err(_) => {
            return Err(Failed {
                error: LockError::RedisTimeout { op, after },
                reached: Reached::No,
            })
        }
    };
    Ok(lock(kept).get_or_insert(conn).clone())
}

/// Sends `cmd` on `conn`, routed by its first key.
///
/// Right after a failover the client's slot map can be stale for longer than its own few
/// retries: a `MOVED`, `ASK`, `TRYAGAIN` or `CLUSTERDOWN` answer (refused before anything ran)
/// is sent again, 20 ms apart, until `after` has passed since the first try.
async fn query(
    mut conn: ClusterConnection,
    op: &'static str,
    cmd: redis::Cmd,
    after: Duration,
) -> Result<Value, Failed> {
    let until = tokio::time::Instant::now() + after;
    loop {
        let answer = redis::aio::ConnectionLike::req_packed_command(&mut conn, &cmd)
            .await
            .and_then(Value::extract_error);
        match answer {
            Err(source) if redirected(&source) && tokio::time::Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answer => return answer.map_err(|source| call::failed(op, source, after)),
        }
    }
}

/// Whether the cluster refused a request because its slot is elsewhere or moving.
fn redirected(error: &redis::RedisError) -> bool {
    use redis::ServerErrorKind::{Ask, ClusterDown, Moved, TryAgain};
    matches!(
        error.kind(),
        redis::ErrorKind::Server(Ask | ClusterDown | Moved | TryAgain)
    )
}

/// A cluster client builder for `seeds` (with `certificates` for `rediss://` seeds) with
/// bounded timeouts and retries.
fn builder(
    seeds: &[redis::ConnectionInfo],
    certificates: Option<&TlsCertificates>,
    timeouts: Timeouts,
) -> ClusterClientBuilder {
    let builder = match certificates {
        Some(certificates) => ClusterClientBuilder::new(seeds.to_vec()).certs(certificates.clone()),
        None => ClusterClientBuilder::new(seeds.to_vec()),
    };
    builder
        .connection_timeout(timeouts.connect)
        .response_timeout(timeouts.response)
        .overall_response_timeout(Some(timeouts.response))
        .retries(RETRIES)
        .min_retry_wait(10)
        .max_retry_wait(100)
}

impl Route for Cluster {
    fn run<'a>(&'a self, call: &'a ScriptCall) -> BoxFuture<'a, Result<Value, Failed>> {
        Box::pin(self.run_call(call))
    }

    fn shard(&self, key: &str) -> u16 {
        slot(key)
    }

    fn publish_command(&self) -> &'static str {
        "SPUBLISH"
    }

    fn subscriber(&self) -> Option<Arc<dyn Subscribe>> {
        Some(Arc::new(ClusterSubscriber {
            seeds: self.seeds.clone(),
            certificates: self.certificates.clone(),
            timeouts: self.timeouts,
        }))
    }

    fn scan<'a>(&'a self, pattern: &'a str) -> BoxFuture<'a, Result<Vec<String>, LockError>> {
        Box::pin(async move {
            let kept = lock(&self.conn).clone();
            let ranges = fetch_slots(&self.client, kept, self.timeouts).await.ok_or(
                LockError::RedisTimeout {
                    op: "scan (CLUSTER SLOTS)",
                    after: self.timeouts.response,
                },
            )?;
            self.direct.install(&ranges);
            let mut primaries: Vec<(String, u16)> = ranges
                .into_iter()
                .map(|(_, _, host, port)| (host, port))
                .collect();
            primaries.sort();
            primaries.dedup();
            let mut found = Vec::new();
            for primary in primaries {
                let link = lock(&self.direct.links).get(&primary).cloned();
                if let Some(link) = link {
                    found.extend(link.scan(pattern).await?);
                }
            }
            Ok(found)
        })
    }

    fn response_timeout(&self) -> Duration {
        self.timeouts.response
    }

    fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    fn refuses_fair(&self) -> Option<&'static str> {
        self.replicas.map(|_| super::FAIR_WITH_REPLICAS)
    }
}

/// Subscribes with `SSUBSCRIBE` over a RESP3 cluster connection of its own.
struct ClusterSubscriber {
    seeds: Vec<redis::ConnectionInfo>,
    certificates: Option<TlsCertificates>,
    timeouts: Timeouts,
}

impl Subscribe for ClusterSubscriber {
    fn open(
        &self,
        on_message: OnMessage,
    ) -> BoxFuture<'_, redis::RedisResult<(Arc<dyn Channels>, Ended)>> {
        Box::pin(async move {
            // A node's connection lost ends the whole subscriber connection (the client ignores
            // what the push handler returns); the notifier opens a new one.
            let (pushes, ended) = push_handler(on_message);
            let client = builder(&self.seeds, self.certificates.as_ref(), self.timeouts)
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(pushes)
                .build()?;
            let conn = client.get_async_connection().await?;
            Ok((Arc::new(ClusterChannels(conn)) as Arc<dyn Channels>, ended))
        })
    }
}

/// `SSUBSCRIBE` / `SUNSUBSCRIBE` on the subscriber's cluster connection.
struct ClusterChannels(ClusterConnection);

impl Channels for ClusterChannels {
    fn subscribe<'a>(&'a self, channel: &'a str) -> BoxFuture<'a, redis::RedisResult<()>> {
        let mut conn = self.0.clone();
        Box::pin(async move { conn.ssubscribe(channel).await })
    }

    fn unsubscribe<'a>(&'a self, channel: &'a str) -> BoxFuture<'a, redis::RedisResult<()>> {
        let mut conn = self.0.clone();
        Box::pin(async move { conn.sunsubscribe(channel).await })
    }
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first `{`
/// and the next `}`, when not empty) or of the whole key, modulo 16384.
pub(crate) fn slot(key: impl AsRef<[u8]>) -> u16 {
    let bytes = key.as_ref();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::slot;

    #[test]
    fn slots_match_cluster_keyslot() {
        // redis-cli CLUSTER KEYSLOT <key>
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("123456789"), 12739);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        // An empty tag is no tag; only the first `{` counts.
        assert_eq!(
            slot("foo{}{bar}"),
            crate::topology::cluster::crc16(b"foo{}{bar}") % 16384
        );
        assert_eq!(slot("foo{{bar}}zap"), slot("{bar"));
        assert_eq!(slot("distlock:lock:{{user:7}:wallet}"), slot("{user:7"));
    }
}
