//! One primary: a server (or a caller's pool), or the one Sentinel names (see `sentinel.rs`).
//! Every call on one multiplexed connection ([`Link`]), taken from a deadpool pool (see
//! [`take_from_pool`]) or dialled where the sentinels say; release announcements by `PUBLISH`,
//! subscribed on a connection of their own. Also the plain pub/sub subscriber the quorum
//! reuses.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use deadpool_redis::Pool;
use futures_util::future::{select, FutureExt};
use redis::aio::MultiplexedConnection;

use super::{push_handler, Channels, Ended, OnMessage, Scope, Subscribe};
use super::{take_from_pool, Deployment, Dial, Grant, Link, Replicas, Serial, Timeouts};
use crate::call::BoxFuture;
use crate::error::LockError;

/// One server through `pool`. `client`: the same server, for the subscriber connection
/// (`None`: waiters poll). `bounded_connections`: the pool's connections carry the response
/// timeout themselves.
pub(crate) fn server(
    pool: Pool,
    client: Option<redis::Client>,
    timeouts: Timeouts,
    bounded_connections: bool,
    endpoint: String,
    replicas: Option<Replicas>,
) -> Deployment {
    let dial = PoolDial {
        pool: pool.clone(),
        timeouts,
        server: endpoint.clone(),
    };
    let link = Link::new(Box::new(dial), timeouts, bounded_connections, replicas);
    let subscriber = client.map(|client| plain_subscriber(vec![client]));
    let mut commands = vec!["SELECT 0".to_owned()];
    if link.waits_for_replicas() {
        commands.push("WAIT 0 0".to_owned());
    }
    Deployment {
        pool: Some(pool),
        ..reached_by(Arc::new(link), endpoint, subscriber, commands)
    }
}

/// One primary reached through `link`, without a pool (the primary Sentinel names; a server
/// adds its pool).
pub(crate) fn reached_by(
    link: Arc<Link>,
    endpoint: String,
    subscriber: Option<Arc<dyn Subscribe>>,
    commands: Vec<String>,
) -> Deployment {
    Deployment {
        endpoint,
        response_timeout: link.timeouts().response,
        subscriber,
        commands,
        pool: None,
        waits_for_replicas: link.waits_for_replicas(),
        grant: Grant::Serial(Serial::One(link)),
    }
}

/// Dials by taking a connection out of a pool.
pub(crate) struct PoolDial {
    pub(crate) pool: Pool,
    pub(crate) timeouts: Timeouts,
    /// Its URL without the password, as messages name it.
    pub(crate) server: String,
}

impl Dial for PoolDial {
    fn dial(&self, op: &'static str) -> BoxFuture<'_, Result<MultiplexedConnection, LockError>> {
        Box::pin(take_from_pool(&self.pool, self.timeouts, op))
    }

    fn server(&self) -> String {
        self.server.clone()
    }
}

/// Subscribes with `SUBSCRIBE` on a pub/sub connection to one of `clients` (a quorum has
/// several servers, any one of which announces every release).
struct PlainSubscriber {
    clients: Vec<redis::Client>,
    /// The server the last connection went to.
    next: AtomicUsize,
}

/// A [`PlainSubscriber`] to one of `clients`.
pub(crate) fn plain_subscriber(clients: Vec<redis::Client>) -> Arc<dyn Subscribe> {
    let next = AtomicUsize::new(0);
    Arc::new(PlainSubscriber { clients, next })
}

impl Subscribe for PlainSubscriber {
    /// Dials every server at once and keeps the first connection made: a server that does not
    /// answer (hung, or cut off by the network: its connect only times out) costs nothing while
    /// another answers. One tried at a time, a cut-off server was tried again and again, its
    /// connect cut short each time by the notifier's own timeout before the next was chosen.
    fn open(
        &self,
        on_message: OnMessage,
    ) -> BoxFuture<'_, redis::RedisResult<(Arc<dyn Channels>, Ended)>> {
        let count = self.clients.len();
        let last = self.next.load(Ordering::Relaxed);
        let attempts: Vec<_> = (0..count)
            .map(|k| {
                // The last server first: on one that answers at once it wins the race.
                let i = (last + k) % count;
                let (client, on_message) = (&self.clients[i], Arc::clone(&on_message));
                Box::pin(async move {
                    open_plain(client, std::future::pending(), on_message)
                        .await
                        .map(|opened| (i, opened))
                })
            })
            .collect();
        Box::pin(async move {
            let ((i, opened), _others) = futures_util::future::select_ok(attempts).await?;
            self.next.store(i, Ordering::Relaxed);
            Ok(opened)
        })
    }
}

/// Opens a subscriber connection to `client`'s server over RESP3, whose pushes go to
/// `on_message` on the connection's own task; it ends when the connection is lost or `end`
/// completes (the server is no longer the primary).
pub(crate) async fn open_plain(
    client: &redis::Client,
    end: impl std::future::Future<Output = ()> + Send + 'static,
    on_message: OnMessage,
) -> redis::RedisResult<(Arc<dyn Channels>, Ended)> {
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let client = redis::Client::open(info.set_redis_settings(settings))?;
    let (pushes, lost) = push_handler(on_message);
    let config = redis::AsyncConnectionConfig::new().set_push_sender(pushes);
    let conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    let ended = select(lost, Box::pin(end)).map(drop);
    Ok((Arc::new(PlainChannels(conn)), Box::pin(ended)))
}

/// `SUBSCRIBE` / `UNSUBSCRIBE` on a RESP3 subscriber connection.
struct PlainChannels(MultiplexedConnection);

impl Channels for PlainChannels {
    /// Every channel is plain here, whatever its scope.
    fn subscribe<'a>(
        &'a self,
        channel: &'a str,
        _: Scope,
    ) -> BoxFuture<'a, redis::RedisResult<()>> {
        let mut conn = self.0.clone();
        Box::pin(async move { conn.subscribe(channel).await })
    }

    fn unsubscribe<'a>(
        &'a self,
        channel: &'a str,
        _: Scope,
    ) -> BoxFuture<'a, redis::RedisResult<()>> {
        let mut conn = self.0.clone();
        Box::pin(async move { conn.unsubscribe(channel).await })
    }

    fn check(&self) -> BoxFuture<'_, redis::RedisResult<()>> {
        let mut conn = self.0.clone();
        // Any answer will do, a refusal too (an ACL user without `+ping`): it came.
        Box::pin(async move {
            conn.send_packed_command(&redis::cmd("PING"))
                .await
                .map(drop)
        })
    }
}
