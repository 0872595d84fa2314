//! The primary that Redis Sentinel names, followed across failovers.
//!
//! It asks the sentinels (`SENTINEL GET-MASTER-ADDR-BY-NAME`, one after the other until
//! one answers; one that names a server that is not a primary is asked last next time) where
//! the primary is, connects, and checks with `ROLE` that the server is a primary before using
//! it. No connection to a demoted primary is reused once the switch is known, and a write that
//! reaches one before is refused there (`READONLY`) and sent on:
//! - the command connection is dropped, and the primary asked for again, on a broken
//!   connection, on `READONLY` (a demoted primary refused a write before running it: the call is
//!   sent once more to the new primary), and on `+switch-master`. (Sentinel itself closes the
//!   ordinary client connections of a primary it demotes, but only some 10 s after the switch,
//!   and a primary can be demoted by hand; pub/sub connections it leaves open.)
//! - a watcher task subscribes to `+switch-master` on a sentinel (the next one when it stops
//!   answering a `PING`, sent after 5 s of silence); when it arrives, the command connection is
//!   dropped and the subscriber connection (release notifications) is closed, so waiters poll
//!   briefly and subscribe again on the new primary;
//! - there is no pool: writes that wait for replicas (`min_replicas`) use connections of
//!   their own, which a switch drops with the rest (one checked out across the switch is not
//!   put back), and which follow `READONLY` too (deadpool-redis #372: a pool keeps connections
//!   to a demoted primary).
//!
//! A read-only check (`LockManager::ping`) can still succeed on a demoted primary that has not
//! been noticed yet; every write cannot.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once, OnceLock, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{ConnectionInfo, Value};
use tokio::sync::watch;

use super::connect::within;
use super::one::open_plain;
use super::Replicas;
use super::{Channels, Deployment, Ended, OnMessage, Subscribe};
use super::{Dial, Link, Timeouts};
use crate::call::BoxFuture;
use crate::error::LockError;
use crate::tls::Tls;

/// Finds the primary through the sentinels, and says when it changed.
struct Resolver {
    master: String,
    /// The first one's user, password and database are the primary's too, and the primary is
    /// reached as it is: over TLS, with its certificates, when it is a `rediss://` URL; else over
    /// plain TCP.
    sentinels: Vec<ConnectionInfo>,
    timeouts: Timeouts,
    /// The sentinel that answered last is asked first.
    next: AtomicUsize,
    /// Bumped on every `+switch-master` for this primary.
    switched: watch::Sender<u64>,
    /// The link to the primary, whose connection a switch drops.
    link: OnceLock<Weak<Link>>,
    /// The `+switch-master` watcher runs (started at the first dial: it needs a runtime).
    watching: Once,
}

/// A Sentinel-managed primary: `master` as the sentinels at `urls` name it.
pub(crate) fn primary(
    master: String,
    urls: &[String],
    tls: &Tls,
    timeouts: Timeouts,
    replicas: Option<Replicas>,
) -> Result<Deployment, LockError> {
    if urls.is_empty() || master.is_empty() {
        return Err(LockError::InvalidConfig {
            what: "sentinel",
            reason: "give the primary's name and at least one sentinel URL".to_owned(),
        });
    }
    let (sentinels, shown): (Vec<_>, Vec<_>) = urls
        .iter()
        .map(|url| super::parse_url(url, tls))
        .collect::<Result<_, _>>()?;
    let mut commands = vec!["ROLE".to_owned()];
    if sentinels[0].redis_settings().db() != 0 {
        commands.push("SELECT 0".to_owned());
    }
    if replicas.is_some() {
        commands.push("WAIT 0 0".to_owned());
    }
    let resolver = Arc::new(Resolver {
        master: master.clone(),
        sentinels,
        timeouts,
        next: AtomicUsize::new(0),
        switched: watch::Sender::new(0),
        link: OnceLock::new(),
        watching: Once::new(),
    });
    let dial = Sentinel(Arc::clone(&resolver));
    let link = Arc::new(Link::new(Box::new(dial), timeouts, true, replicas));
    let _ = resolver.link.set(Arc::downgrade(&link));
    Ok(super::one::reached_by(
        link,
        format!("sentinel {master} [{}]", shown.join(", ")),
        Some(Arc::new(Sentinel(resolver))),
        commands,
    ))
}

impl Resolver {
    /// Starts watching for switches of the primary, once (when a runtime runs).
    fn watch(self: &Arc<Self>) {
        if tokio::runtime::Handle::try_current().is_ok() {
            // Detached: it ends by itself once the manager is dropped.
            self.watching
                .call_once(|| drop(tokio::spawn(watch_switches(Arc::downgrade(self)))));
        }
    }

    /// The primary's address, from the first sentinel that answers.
    async fn primary(&self, op: &'static str) -> Result<ConnectionInfo, LockError> {
        let (count, first) = (self.sentinels.len(), self.next.load(Ordering::Relaxed));
        let mut last_error = LockError::NotConfigured;
        for i in (0..count).map(|i| (first + i) % count) {
            match self.ask(i, op).await {
                Ok(address) => {
                    self.next.store(i, Ordering::Relaxed);
                    return Ok(address);
                }
                Err(error) => last_error = error,
            }
        }
        Err(last_error)
    }

    async fn ask(&self, sentinel: usize, op: &'static str) -> Result<ConnectionInfo, LockError> {
        let client = super::client(self.sentinels[sentinel].clone())?;
        let mut conn = super::dial(&client, self.timeouts, op).await?;
        let master = &self.master;
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(master);
        let answer = cmd.query_async::<Option<(String, u16)>>(&mut conn);
        let Some((host, port)) = within(op, self.timeouts.response, answer).await? else {
            return Err(LockError::InvalidConfig {
                what: "sentinel",
                reason: format!("the sentinels do not monitor a primary named {master:?}"),
            });
        };
        // As the first sentinel is reached, with its user, password and database.
        let first = &self.sentinels[0];
        let addr = crate::tls::address_like(first.addr(), host, port);
        Ok(first.clone().set_addr(addr))
    }

    /// A connection to the primary, checked with `ROLE` to be one.
    async fn dial_primary(&self, op: &'static str) -> Result<MultiplexedConnection, LockError> {
        let client = super::client(self.primary(op).await?)?;
        let mut conn = super::dial(&client, self.timeouts, op).await?;
        let cmd = redis::cmd("ROLE");
        let role: Vec<Value> =
            within(op, self.timeouts.response, cmd.query_async(&mut conn)).await?;
        if matches!(role.first(), Some(Value::BulkString(r)) if r == b"master") {
            return Ok(conn);
        }
        // That sentinel may lag behind the others: ask the next one first next time.
        let next = (self.next.load(Ordering::Relaxed) + 1) % self.sentinels.len();
        self.next.store(next, Ordering::Relaxed);
        let kind = redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
        let what = "the server Sentinel named is not a primary (a failover is under way)";
        let source = redis::RedisError::from((kind, what));
        Err(LockError::Redis { op, source })
    }
}

/// The primary Sentinel names, as its link dials it and its subscribers connect to it.
struct Sentinel(Arc<Resolver>);

impl Dial for Sentinel {
    fn dial(&self, op: &'static str) -> BoxFuture<'_, Result<MultiplexedConnection, LockError>> {
        self.0.watch();
        Box::pin(self.0.dial_primary(op))
    }

    fn read_only(&self) -> super::ReadOnly {
        super::ReadOnly::Failover
    }

    fn server(&self) -> String {
        format!("the primary Sentinel names `{}`", self.0.master)
    }
}

/// Listens for `+switch-master` on one sentinel after another until the manager is dropped
/// (then ends, with `None`); on a switch of this primary, drops the command connection and ends
/// subscriber connections.
async fn watch_switches(resolver: Weak<Resolver>) -> Option<()> {
    let mut next = 0usize;
    loop {
        let current = resolver.upgrade()?;
        let info = current.sentinels[next % current.sentinels.len()].clone();
        let master = current.master.clone();
        let pause = current.timeouts.connect.min(Duration::from_secs(1));
        let response = current.timeouts.response;
        drop(current);
        next += 1;
        let client = super::client(info).ok()?;
        let subscribed = async {
            let pubsub = tokio::time::timeout(pause * 2, client.get_async_pubsub()).await;
            let (mut sink, messages) = pubsub.ok()?.ok()?.split();
            let subscribed = tokio::time::timeout(response, sink.subscribe("+switch-master")).await;
            subscribed.ok()?.ok().map(|()| (sink, messages))
        };
        let Some((mut sink, mut messages)) = subscribed.await else {
            tokio::time::sleep(pause).await;
            continue;
        };
        loop {
            use futures_util::StreamExt;
            // Wake now and then to notice that the manager was dropped, and that the sentinel
            // still answers (one that stopped would never say the primary switched).
            let message = tokio::time::timeout(Duration::from_secs(5), messages.next()).await;
            let resolver = resolver.upgrade()?;
            match message {
                Err(_) => {
                    let pong = tokio::time::timeout(response, sink.ping::<Value>()).await;
                    if !matches!(pong, Ok(Ok(_))) {
                        break;
                    }
                }
                Ok(None) => break,
                Ok(Some(message)) => {
                    let payload: String = message.get_payload().unwrap_or_default();
                    // "<name> <old-ip> <old-port> <new-ip> <new-port>"
                    if payload.split(' ').next() == Some(master.as_str()) {
                        tracing::info!(primary = %master, switch = %payload, "distlock: Sentinel switched the primary; reconnecting");
                        if let Some(link) = resolver.link.get().and_then(Weak::upgrade) {
                            link.forget_current();
                        }
                        resolver.switched.send_modify(|n| *n += 1);
                    }
                }
            }
        }
    }
}

/// Subscribes on the current primary, until Sentinel switches it.
impl Subscribe for Sentinel {
    fn open(
        &self,
        on_message: OnMessage,
    ) -> BoxFuture<'_, redis::RedisResult<(Arc<dyn Channels>, Ended)>> {
        Box::pin(async move {
            let mut switched = self.0.switched.subscribe();
            let address = self.0.primary("subscribe").await.map_err(|e| {
                redis::RedisError::from((redis::ErrorKind::Io, "sentinel", e.to_string()))
            })?;
            let client = redis::Client::open(address)?;
            let end = async move {
                let _ = switched.changed().await;
            };
            open_plain(&client, end, on_message).await
        })
    }
}
