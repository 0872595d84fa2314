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
//! **Notifications** use sharded pub/sub: the scripts announce with `SPUBLISH` on the lock key's
//! name, whose slot is the lock's, and waiters `SSUBSCRIBE` over a RESP3 cluster connection of
//! their own. A subscription the server ends (its slot moved) is reported and made again where
//! the slot lives; a node's connection lost ends the whole subscriber connection, so waiters
//! poll (with a bound) and subscribe anew.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{PushKind, Value};

use super::{BoxFuture, Channels, Message, Messages, Replicas, Route, ScriptCall, Subscribe};
use crate::conn::{self, lock, Failed, Reached, Timeouts};
use crate::error::LockError;

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
    timeouts: Timeouts,
    endpoint: String,
    replicas: Option<Replicas>,
}

impl Cluster {
    pub(crate) fn new(
        urls: &[String],
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
            let (info, endpoint) = conn::parse_url(url)?;
            seeds.push(info);
            shown.push(endpoint);
        }
        let invalid = |e: redis::RedisError| LockError::InvalidConfig {
            what: "cluster",
            reason: e.to_string(),
        };
        let client = builder(&seeds, timeouts).build().map_err(invalid)?;
        let replicated = match replicas {
            Some(replicas) => {
                let client = builder(&seeds, timeouts)
                    .overall_response_timeout(Some(timeouts.response + replicas.timeout))
                    .response_timeout(timeouts.response + replicas.timeout)
                    .build()
                    .map_err(invalid)?;
                Some((client, Mutex::new(None)))
            }
            None => None,
        };
        Ok(Self {
            client,
            conn: Mutex::new(None),
            replicated,
            seeds,
            timeouts,
            endpoint: format!("cluster [{}]", shown.join(", ")),
            replicas,
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

    /// Runs `call` and, with `min_replicas`, `WAIT`s after it (see [`Cluster::confirm`]).
    async fn run_call(&self, call: &ScriptCall) -> Result<Value, Failed> {
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
        let slot = call.keys().first().map_or(0, |key| slot(key));
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
                        .map_err(|source| conn::failed(op, source, after))?;
                    // The script's own error (NOSCRIPT, say) fails the call.
                    if let Some(Err(source)) = values.first().cloned().map(Value::extract_error) {
                        return Err(conn::failed(op, source, after));
                    }
                    Ok(Value::Array(values))
                }
            })
            .await?;
        let (answer, acked) = match answer {
            Value::Array(mut values) if values.len() == 2 => {
                let acked = match values.pop() {
                    Some(Value::Int(n)) => usize::try_from(n).unwrap_or(0),
                    _ => 0,
                };
                (values.pop().unwrap_or(Value::Nil), acked)
            }
            _ => {
                return Err(Failed {
                    error: LockError::Redis {
                        op,
                        source: redis::RedisError::from((
                            redis::ErrorKind::Parse,
                            "unexpected answer to a write and WAIT",
                        )),
                    },
                    reached: Reached::Answered,
                })
            }
        };
        super::confirmed(call, answer, acked, replicas, |undo| self.run_plain(undo)).await
    }
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
            answer => return answer.map_err(|source| conn::failed(op, source, after)),
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

/// A cluster client builder for `seeds` with bounded timeouts and retries.
fn builder(seeds: &[redis::ConnectionInfo], timeouts: Timeouts) -> ClusterClientBuilder {
    ClusterClientBuilder::new(seeds.to_vec())
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
            timeouts: self.timeouts,
        }))
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
    timeouts: Timeouts,
}

impl Subscribe for ClusterSubscriber {
    fn open(&self) -> BoxFuture<'_, redis::RedisResult<(Arc<dyn Channels>, Messages)>> {
        Box::pin(async move {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            // Dropped when a node's connection is lost: the receiver then ends (the client
            // ignores what the push sender returns).
            let tx = Mutex::new(Some(tx));
            let pushes = move |push: redis::PushInfo| -> Result<(), ()> {
                let message = match push.kind {
                    PushKind::SMessage | PushKind::Message => {
                        let mut data = push.data.into_iter();
                        let (Some(channel), Some(payload)) = (data.next(), data.next()) else {
                            return Ok(());
                        };
                        let (Ok(channel), Ok(payload)) = (
                            redis::from_redis_value::<String>(channel),
                            redis::from_redis_value::<Vec<u8>>(payload),
                        ) else {
                            return Ok(());
                        };
                        Message::Published { channel, payload }
                    }
                    PushKind::SUnsubscribe => {
                        let Some(Ok(channel)) = push
                            .data
                            .into_iter()
                            .next()
                            .map(redis::from_redis_value::<String>)
                        else {
                            return Ok(());
                        };
                        Message::Dropped { channel }
                    }
                    PushKind::Disconnection => {
                        // A node's connection was lost, and the subscriptions on it: the
                        // receiver ends, and the notifier opens a new subscriber connection.
                        lock(&tx).take();
                        return Err(());
                    }
                    _ => return Ok(()),
                };
                match &*lock(&tx) {
                    Some(tx) => tx.send(message).map_err(drop),
                    None => Err(()),
                }
            };
            let client = builder(&self.seeds, self.timeouts)
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(pushes)
                .build()?;
            let conn = client.get_async_connection().await?;
            Ok((Arc::new(ClusterChannels(conn)) as Arc<dyn Channels>, rx))
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
pub(crate) fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
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
