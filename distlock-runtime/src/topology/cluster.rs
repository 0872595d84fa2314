//! A Redis Cluster, routed by distlock itself: a [`Link`] per node, and the slot map.
//!
//! **Why not redis-rs's cluster client.** Its connection recovers from a failover inside one
//! shared object: the slot refresh waits for a write lock on its table of node connections,
//! while requests it stopped polling can hold read permits of that lock (with tokio 1.54, a
//! request that runs out of its task's budget keeps the permit it just took). A process so
//! wedged stayed wedged for good: every key, every `ping()`, every background release timed out
//! while other processes on the same cluster served. Nothing here waits on another request's
//! progress: calls to different nodes share nothing but the slot map, a plain value read and
//! swapped under a short std lock, and every wait is bounded by the manager's timeouts.
//!
//! **The slot map** (`CLUSTER SLOTS`) is fetched over the node links: from up to
//! [`ASK_AT_ONCE`] known nodes at once (the primaries of the current map first, then the seeds,
//! then the other nodes seen), each within the response timeout; the view most of the answering
//! nodes share is installed (a primary restarted with an old `nodes.conf` may answer with its
//! stale view for a moment). A fetch runs in a task of its own, one at a time and at most every
//! [`REFETCH_EVERY`], and a caller that needs the map waits for it up to its own deadline only.
//! It is fetched at the first call, and again whenever an answer shows it stale: `MOVED`, a node
//! that refuses connections, `CLUSTERDOWN`, `TRYAGAIN`, `READONLY`.
//!
//! **A call** goes to the link of its slot's primary. `MOVED` sends it to the node named (and
//! corrects that slot's entry at once), `ASK` sends it once to the node named after `ASKING`,
//! and `TRYAGAIN`, `CLUSTERDOWN`, `READONLY` or a node that refuses connections send it again
//! 20 ms later, where the map says the slot lives then: each of these answers means nothing ran.
//! No try starts later than one response timeout after the first, and each is bounded by its
//! link's timeouts. A node that does not answer in time is an error at once (the call may have
//! run), its link replaces the connection (see `link.rs`), and the slot map is fetched again:
//! the cluster may have failed that node over. Every distlock script may be sent twice (an acquire that finds its own token
//! takes the key as it is), and `NOSCRIPT` (a promoted replica) is answered with `EVAL` on the
//! same node.
//!
//! **`min_replicas`**: each node's link runs writes followed by `WAIT` on connections of their
//! own (see `replicas.rs`), so a slow replica stalls no other call.
//!
//! **Notifications** use sharded pub/sub: the scripts announce with `SPUBLISH` on the lock key's
//! name, whose slot is the lock's, and waiters `SSUBSCRIBE` on a RESP3 connection to the primary
//! of that slot (one per node, opened when first needed). A subscription the server ends (its
//! slot moved) is reported and made again where the slot lives; a node's subscriber connection
//! lost ends the whole subscriber connection, so waiters poll (with a bound) and subscribe anew.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::time::Duration;

use futures_util::FutureExt;
use redis::aio::MultiplexedConnection;
use redis::ServerErrorKind::{ClusterDown, Moved};
use redis::{ErrorKind, ProtocolVersion::RESP3, Value};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::link::Hop;
use super::Replicas;
use super::{push_handler, Channels, Ended, Message, OnMessage, Scope, Subscribe};
use super::{Deployment, Dial, Grant, Link, Serial, Timeouts};
use crate::call::{BoxFuture, ScriptCall};
use crate::error::{LockError, Misconfiguration};
use crate::failed::{Failed, Reached};
use crate::retry::{Address, Decision, Redirect, Retry, Tried};
use crate::sync::lock;
use crate::tls::Tls;

/// How many nodes a fetch of the slot map asks at once.
const ASK_AT_ONCE: usize = 8;

/// After the first answer to a fetch, how long the other nodes asked have to answer before the
/// views are compared.
const OTHER_VIEWS: Duration = Duration::from_millis(20);

/// The least time between two fetches of the slot map: one fetched during a failover may still
/// be stale, and asking again at once would only load the nodes.
const REFETCH_EVERY: Duration = Duration::from_millis(100);

/// How long a fetch of the slot map may seem to run before another may start: far longer
/// than a fetch and its cool-down take (each node's answer is bounded by the response timeout).
const FETCH_STUCK: Duration = Duration::from_secs(30);

/// What a fetch of the slot map is called in messages.
const SLOTS_OP: &str = "cluster slot map (CLUSTER SLOTS)";

/// Slots in a Redis Cluster.
const SLOTS: usize = 16384;

/// One slot range of `CLUSTER SLOTS`: first and last slot, and its primary.
type Range = (u16, u16, Address);

/// A Redis Cluster.
pub(crate) struct Cluster {
    nodes: Arc<Nodes>,
    endpoint: String,
}

/// Where each slot lives, and a link to each node: shared with the task that fetches the map.
struct Nodes {
    /// Where the slot map is asked for when no node of a map answers.
    seeds: Vec<Address>,
    /// The first seed's: every node is reached as it is, over TLS (with its certificates) or
    /// plain TCP, with its user, password and database.
    first: redis::ConnectionInfo,
    timeouts: Timeouts,
    replicas: Option<Replicas>,
    routing: RwLock<Routing>,
    /// Counts fetches of the map that ended, installed or not: callers waiting for one watch it.
    fetched: watch::Sender<u64>,
    /// Since when a fetch runs (or cools down, see [`REFETCH_EVERY`]). One that has run for
    /// longer than [`FETCH_STUCK`] is taken for dead (its runtime no longer driven) and
    /// another may start.
    fetching: Mutex<Option<Instant>>,
    /// Why the last fetch got no map, if it got none.
    failure: Mutex<Option<LockError>>,
}

/// The slot map and the nodes seen.
#[derive(Default)]
struct Routing {
    /// The primary of each slot (`None` for a slot no primary serves), once fetched.
    slots: Option<Box<[Option<Arc<Node>>]>>,
    /// Every node of the map, the seeds and the nodes redirections named, by address.
    nodes: HashMap<Address, Arc<Node>>,
}

/// One cluster node.
struct Node {
    address: Address,
    link: Link,
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
        let seeds: Vec<(Address, redis::ConnectionInfo, String)> = urls
            .iter()
            .map(|url| {
                let (info, endpoint) = super::parse_url(url, tls)?;
                let (redis::ConnectionAddr::Tcp(host, port)
                | redis::ConnectionAddr::TcpTls { host, port, .. }) = info.addr()
                else {
                    return Err(LockError::InvalidConfig {
                        what: "cluster",
                        reason: format!(
                            "{endpoint} is not a TCP address: a cluster's nodes name each other \
                             by host and port, so give redis:// or rediss:// seed URLs"
                        ),
                    });
                };
                Ok(((host.clone(), *port), info, endpoint))
            })
            .collect::<Result<_, _>>()?;
        let (_, first, _) = &seeds[0];
        let nodes = Arc::new(Nodes {
            first: first.clone(),
            seeds: seeds.iter().map(|(address, ..)| address.clone()).collect(),
            timeouts,
            replicas,
            routing: RwLock::new(Routing::default()),
            fetched: watch::Sender::new(0),
            fetching: Mutex::new(None),
            failure: Mutex::new(None),
        });
        let shown: Vec<&str> = seeds.iter().map(|(.., shown)| shown.as_str()).collect();
        let endpoint = format!("cluster [{}]", shown.join(", "));
        Ok(Self { nodes, endpoint })
    }

    /// Runs `call` on the primary of its slot, following the cluster's redirections (see the
    /// module docs) as its policy says ([`Retry::routed`]), all within one response timeout.
    pub(crate) async fn run(&self, call: &ScriptCall) -> Result<Value, Failed> {
        let slot = call.first_key().map_or(0, slot);
        // Taken before the first try: every try counts against one response timeout. (A clock
        // read per call; the map lookup below is the other cost a call has here.)
        let until = Instant::now() + self.nodes.timeouts.response;
        let (retry, mut tried) = (Retry::routed(until), Tried::default());
        // A node a redirection named, and the hop it takes there.
        let mut redirected: Option<(Arc<Node>, Hop)> = None;
        // Whether an earlier try may have reached Redis (and so run): the final failure says
        // so too, or an acquire would skip its in-doubt release.
        let mut maybe = false;
        loop {
            let primary = self.nodes.primary_by(slot, until, call.op);
            let (node, hop) = match redirected.take() {
                Some(target) => target,
                None => (primary.await?, Hop::Direct),
            };
            let mut failed = match node.link.run_via(call, hop).await {
                Ok(answer) => return Ok(answer),
                Err(failed) => failed,
            };
            if maybe && matches!(failed.reached, Reached::No | Reached::Refused) {
                failed.reached = Reached::Maybe;
            }
            maybe |= failed.reached == Reached::Maybe;
            match retry.decide(&failed, &mut tried, Instant::now()) {
                Decision::Redirect(Redirect::Moved(address)) => {
                    redirected = Some((self.nodes.moved(slot, address, &node), Hop::Direct));
                }
                Decision::Redirect(Redirect::Ask(address)) => {
                    redirected = Some((self.nodes.node_at(address, &node), Hop::Asking));
                }
                Decision::After(pause) => {
                    self.nodes.refetch();
                    tokio::time::sleep(pause).await;
                }
                _ => {
                    // A node that does not answer in time may have been failed over (paused,
                    // cut off): the map is fetched again, from the other nodes too, so the next
                    // call goes where the slot lives now. This one may have run: not sent again.
                    if failed.error.is_unavailable() {
                        self.nodes.refetch();
                    }
                    return Err(failed);
                }
            }
        }
    }

    /// The keys matching `pattern` on every primary.
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>, LockError> {
        let mut found = Vec::new();
        for node in self.nodes.primaries("scan (CLUSTER SLOTS)").await? {
            found.extend(node.link.scan(pattern).await?);
        }
        Ok(found)
    }

    /// Runs `call` on every primary: each one's address and answer.
    pub(crate) async fn run_on_every_server(
        &self,
        call: &ScriptCall,
    ) -> Vec<(String, Result<Value, Failed>)> {
        let primaries = match self.nodes.primaries(call.op).await {
            Ok(primaries) => primaries,
            Err(error) => {
                let reached = Reached::No;
                return vec![(self.endpoint.clone(), Err(Failed { error, reached }))];
            }
        };
        let answers = primaries.iter().map(|node| async move {
            let (host, port) = &node.address;
            (format!("{host}:{port}"), node.link.run(call).await)
        });
        futures_util::future::join_all(answers).await
    }
}

impl From<Cluster> for Deployment {
    fn from(cluster: Cluster) -> Self {
        let nodes = Arc::clone(&cluster.nodes);
        let waits_for_replicas = nodes.replicas.is_some();
        let mut commands = vec!["CLUSTER SLOTS".to_owned(), "ASKING".to_owned()];
        if waits_for_replicas {
            commands.push("WAIT 0 0".to_owned());
        }
        Self {
            endpoint: cluster.endpoint.clone(),
            response_timeout: nodes.timeouts.response,
            commands,
            pool: None,
            waits_for_replicas,
            grant: Grant::Serial(Serial::Sharded(cluster)),
            subscriber: Some(Arc::new(ClusterSubscriber(nodes))),
        }
    }
}

impl Routing {
    /// The distinct primaries of the slot map, in slot order.
    fn primaries(&self) -> Vec<Arc<Node>> {
        let mut primaries: Vec<Arc<Node>> = Vec::new();
        for node in self.slots.iter().flatten().flatten() {
            if !primaries.iter().any(|p| p.address == node.address) {
                primaries.push(Arc::clone(node));
            }
        }
        primaries
    }
}

impl Nodes {
    fn routing(&self) -> RwLockReadGuard<'_, Routing> {
        self.routing.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The primary serving `slot` in the map, if one is known.
    fn primary(&self, slot: u16) -> Option<Arc<Node>> {
        self.routing()
            .slots
            .as_ref()?
            .get(usize::from(slot))?
            .clone()
    }

    /// The primary serving `slot`, fetching the map first when none is known, waiting for
    /// that until `until` at the latest. Fails at once when the nodes refused the fetch
    /// (credentials, an ACL): waiting would not help. Fails at `until` with the last fetch's
    /// failure when no map could be had, else as a slot no primary serves now.
    async fn primary_by(
        self: &Arc<Self>,
        slot: u16,
        until: Instant,
        op: &'static str,
    ) -> Result<Arc<Node>, Failed> {
        if let Some(node) = self.primary(slot) {
            return Ok(node);
        }
        let mut fetched = self.fetched.subscribe();
        let error = loop {
            fetched.mark_unchanged();
            self.refetch();
            if let Some(node) = self.primary(slot) {
                return Ok(node);
            }
            fetch_ended(&mut fetched, until).await;
            if let Some(node) = self.primary(slot) {
                return Ok(node);
            }
            let refused = lock(&self.failure)
                .as_ref()
                .filter(|error| error.is_misconfigured())
                .cloned();
            match refused {
                Some(error) => break error,
                None if Instant::now() < until => {}
                None if self.routing().slots.is_none() => break self.no_map(SLOTS_OP),
                None => {
                    let detail =
                        format!("slot {slot}: the cluster is failing over or missing a primary");
                    let source = cluster_down("no primary serves the slot", detail);
                    break LockError::Redis { op, source };
                }
            }
        };
        let reached = Reached::No;
        Err(Failed { error, reached })
    }

    /// Why no slot map could be had: the last fetch's failure, else a fetch out of time.
    fn no_map(&self, op: &'static str) -> LockError {
        let after = self.timeouts.response;
        lock(&self.failure)
            .clone()
            .unwrap_or(LockError::RedisTimeout { op, after })
    }

    /// `MOVED`: `slot` lives at `address` now (the node `asked` answered so). Corrects that
    /// slot's entry at once and has the whole map fetched again: the move is most likely a
    /// failover or a migration, which moved other slots too.
    fn moved(self: &Arc<Self>, slot: u16, address: Address, asked: &Node) -> Arc<Node> {
        let node = self.node_at(address, asked);
        let mut routing = self.routing.write().unwrap_or_else(|e| e.into_inner());
        if let Some(slots) = &mut routing.slots {
            slots[usize::from(slot)] = Some(Arc::clone(&node));
        }
        drop(routing);
        self.refetch();
        node
    }

    /// The node at `address` (an empty host: the one `asked` is on), added if new.
    fn node_at(&self, (host, port): Address, asked: &Node) -> Arc<Node> {
        let host = if host.is_empty() || host == "?" {
            asked.address.0.clone()
        } else {
            host
        };
        let mut routing = self.routing.write().unwrap_or_else(|e| e.into_inner());
        self.node_in(&mut routing, (host, port))
    }

    fn node_in(&self, routing: &mut Routing, address: Address) -> Arc<Node> {
        let node = routing.nodes.entry(address).or_insert_with_key(|address| {
            let dial = NodeDial {
                info: self.info(address),
                timeouts: self.timeouts,
            };
            let link = Link::new(Box::new(dial), self.timeouts, true, self.replicas);
            let address = address.clone();
            Arc::new(Node { address, link })
        });
        Arc::clone(node)
    }

    /// How the node at `address` is reached: as the first seed, with its settings.
    fn info(&self, (host, port): &Address) -> redis::ConnectionInfo {
        let address = crate::tls::address_like(self.first.addr(), host.clone(), *port);
        self.first.clone().set_addr(address)
    }

    /// Starts a fetch of the slot map in a task of its own, unless one runs or the last ended
    /// less than [`REFETCH_EVERY`] ago.
    fn refetch(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut fetching = lock(&self.fetching);
            let now = Instant::now();
            if fetching.is_some_and(|since| now < since + FETCH_STUCK) {
                return;
            }
            *fetching = Some(now);
        }
        let nodes = Arc::clone(self);
        runtime.spawn(async move {
            // Cleared however the task ends, also when it is dropped with its runtime.
            let _done = Fetching(&nodes);
            let fetched = nodes.fetch().await;
            if let Ok(ranges) = &fetched {
                nodes.install(ranges);
            }
            *lock(&nodes.failure) = fetched.err();
            nodes.fetched.send_modify(|n| *n += 1);
            tokio::time::sleep(REFETCH_EVERY).await;
        });
    }

    /// Asks known nodes for the slot map at once (see the module docs); the view most of the
    /// answering nodes share, or why none answered (a refusal first: it says what to fix).
    async fn fetch(&self) -> Result<Vec<Range>, LockError> {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        let candidates = self.candidates();
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let mut answers: FuturesUnordered<_> = candidates
            .iter()
            .map(|node| {
                let cmd = &cmd;
                async move {
                    let answer = node
                        .link
                        .query(SLOTS_OP, cmd)
                        .await
                        .map_err(|f| slots_refused(f.error))?;
                    parse_slots(answer, &node.address).ok_or_else(|| LockError::Redis {
                        op: SLOTS_OP,
                        source: redis::RedisError::from((
                            redis::ErrorKind::Parse,
                            "unexpected CLUSTER SLOTS answer",
                        )),
                    })
                }
            })
            .collect();
        let mut views: Vec<(Vec<Range>, usize)> = Vec::new();
        let mut failure: Option<LockError> = None;
        let mut until = None;
        loop {
            let next = answers.next();
            let answer = match until {
                Some(until) => tokio::time::timeout_at(until, next).await.ok().flatten(),
                None => next.await,
            };
            let view = match answer {
                None => break,
                Some(Ok(view)) => view,
                Some(Err(error)) => {
                    if !failure.as_ref().is_some_and(LockError::is_misconfigured) {
                        failure = Some(error);
                    }
                    continue;
                }
            };
            until.get_or_insert_with(|| Instant::now() + OTHER_VIEWS);
            match views.iter_mut().find(|(known, _)| *known == view) {
                Some((_, count)) => *count += 1,
                None => views.push((view, 1)),
            }
        }
        // The most shared view; the first to arrive among equals (`max_by_key` takes the last).
        let (op, after) = (SLOTS_OP, self.timeouts.response);
        views
            .into_iter()
            .rev()
            .max_by_key(|(_, count)| *count)
            .map(|(view, _)| view)
            .ok_or_else(|| failure.unwrap_or(LockError::RedisTimeout { op, after }))
    }

    /// The nodes to ask for the slot map, at most [`ASK_AT_ONCE`]: half of them primaries of
    /// the current map, then the seeds (always some: when every node's address changed, a
    /// seed such as a DNS name is what still leads to the cluster), then the other primaries
    /// and nodes seen.
    fn candidates(&self) -> Vec<Arc<Node>> {
        let mut routing = self.routing.write().unwrap_or_else(|e| e.into_inner());
        let primaries = routing.primaries();
        let seeds: Vec<Arc<Node>> = self
            .seeds
            .iter()
            .map(|seed| self.node_in(&mut routing, seed.clone()))
            .collect();
        let first = primaries.iter().take(ASK_AT_ONCE / 2);
        let mut chosen: Vec<Arc<Node>> = Vec::new();
        for node in first
            .chain(&seeds)
            .chain(&primaries)
            .chain(routing.nodes.values())
        {
            if chosen.len() < ASK_AT_ONCE && !chosen.iter().any(|c| c.address == node.address) {
                chosen.push(Arc::clone(node));
            }
        }
        chosen
    }

    /// Installs a slot map; forgets the nodes that are neither in it nor seeds.
    fn install(&self, ranges: &[Range]) {
        let mut routing = self.routing.write().unwrap_or_else(|e| e.into_inner());
        let mut slots: Vec<Option<Arc<Node>>> = vec![None; SLOTS];
        for (first, last, address) in ranges {
            let node = self.node_in(&mut routing, address.clone());
            for entry in &mut slots[usize::from(*first)..=usize::from(*last)] {
                *entry = Some(Arc::clone(&node));
            }
        }
        routing.nodes.retain(|address, _| {
            self.seeds.contains(address) || ranges.iter().any(|(_, _, a)| a == address)
        });
        routing.slots = Some(slots.into_boxed_slice());
    }

    /// The distinct primaries of the slot map, fetched anew first (within the response
    /// timeout; the map known already otherwise).
    async fn primaries(self: &Arc<Self>, op: &'static str) -> Result<Vec<Arc<Node>>, LockError> {
        let until = Instant::now() + self.timeouts.response;
        let mut fetched = self.fetched.subscribe();
        // A fetch that ends from now on (one in its cool-down starts none: try again shortly).
        while Instant::now() < until {
            self.refetch();
            if fetch_ended(&mut fetched, until).await {
                break;
            }
        }
        let routing = self.routing();
        if routing.slots.is_none() {
            return Err(self.no_map(op));
        }
        Ok(routing.primaries())
    }
}

/// Waits for a fetch of the slot map to end, until `until` and at most [`REFETCH_EVERY`] (a
/// fetch asked for in a cool-down starts none: look again then): whether one ended.
async fn fetch_ended(fetched: &mut watch::Receiver<u64>, until: Instant) -> bool {
    let pause = until.min(Instant::now() + REFETCH_EVERY);
    let changed = tokio::time::timeout_at(pause, fetched.changed()).await;
    matches!(changed, Ok(Ok(())))
}

/// Marks the fetch of [`Nodes`] ended when dropped.
struct Fetching<'a>(&'a Nodes);

impl Drop for Fetching<'_> {
    fn drop(&mut self) {
        *lock(&self.0.fetching) = None;
    }
}

/// What a refused `CLUSTER SLOTS` means: `NOPERM` (an ACL user without `+cluster|slots`), or
/// `ERR unknown command` from a proxy in front of a cluster that offers no `CLUSTER` command at
/// all (as some managed services present a cluster). Either way a misconfiguration that says
/// what to do, never an outage to wait out.
fn slots_refused(error: LockError) -> LockError {
    match error {
        LockError::Misconfigured {
            op,
            problem: problem @ (Misconfiguration::Permissions | Misconfiguration::Unsupported),
            source,
            ..
        } => LockError::Misconfigured {
            op,
            problem,
            detail: crate::refusal::refused_own_command("CLUSTER SLOTS", problem),
            source,
        },
        other => other,
    }
}

/// Reads a `CLUSTER SLOTS` answer from the node at `asked`: each range's primary. An empty or
/// unknown host (`?`) is the asked node's.
fn parse_slots(answer: Value, asked: &Address) -> Option<Vec<Range>> {
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
        let host = match std::str::from_utf8(host).ok()? {
            "" | "?" => asked.0.clone(),
            host => host.to_owned(),
        };
        let first = u16::try_from(*first).ok()?;
        let last = u16::try_from(*last).ok()?.min(SLOTS as u16 - 1);
        if first > last {
            return None;
        }
        parsed.push((first, last, (host, u16::try_from(*port).ok()?)));
    }
    parsed.sort();
    Some(parsed)
}

/// Dials one cluster node.
struct NodeDial {
    info: redis::ConnectionInfo,
    timeouts: Timeouts,
}

impl Dial for NodeDial {
    fn read_only(&self) -> super::ReadOnly {
        super::ReadOnly::Routed
    }

    fn server(&self) -> String {
        self.info.addr().to_string()
    }

    fn dial(&self, op: &'static str) -> BoxFuture<'_, Result<MultiplexedConnection, LockError>> {
        Box::pin(async move {
            let client = super::client(self.info.clone())?;
            super::dial(&client, self.timeouts, op).await
        })
    }
}

/// Subscribes with `SSUBSCRIBE` on a RESP3 connection to the primary of each channel's slot.
struct ClusterSubscriber(Arc<Nodes>);

impl Subscribe for ClusterSubscriber {
    fn open(
        &self,
        on_message: OnMessage,
    ) -> BoxFuture<'_, redis::RedisResult<(Arc<dyn Channels>, Ended)>> {
        // Nothing to dial yet: each node's connection is opened by the first subscription to
        // one of its slots.
        let lost = CancellationToken::new();
        let ended: Ended = Box::pin(lost.clone().cancelled_owned());
        let channels = Arc::new(ShardChannels {
            nodes: Arc::clone(&self.0),
            on_message,
            lost,
            open: Mutex::default(),
            subscribed: Mutex::default(),
            everywhere: Mutex::default(),
        });
        Box::pin(async move { Ok((channels as Arc<dyn Channels>, ended)) })
    }
}

/// The subscriber connections to the nodes of one cluster subscriber, and which node each
/// channel is subscribed on.
struct ShardChannels {
    nodes: Arc<Nodes>,
    on_message: OnMessage,
    /// Cancelled when one node's connection is lost: the whole subscriber connection ends.
    lost: CancellationToken,
    open: Mutex<HashMap<Address, MultiplexedConnection>>,
    /// Each lock's channel subscribed, and the node (and its connection) it is subscribed on.
    subscribed: Mutex<HashMap<String, (Address, MultiplexedConnection)>>,
    /// Likewise each channel of the whole cluster ([`Scope::Everywhere`]): subscribed on the
    /// primary of its name's slot, though any node would do, and left there when the slot
    /// moves (every node carries its messages).
    everywhere: Mutex<HashMap<String, MultiplexedConnection>>,
}

impl ShardChannels {
    /// Ends each subscription made on another node than the one the slot map now names for
    /// its channel's slot, as if that node had ended it: the notifier wakes the channel's
    /// waiters, and the next one subscribes where the key lives now. The old subscription is
    /// `SUNSUBSCRIBE`d in the background (its answer, or the lack of one, changes nothing).
    ///
    /// A primary cut off from the rest of its cluster does not know that its replica was
    /// promoted in its place: it never ends its subscribers' subscriptions (as a primary that
    /// hands a slot over does, with a `SUNSUBSCRIBE` push) and answers their `PING`s, while
    /// releases are published on the new primary. Run with each check of the subscriber
    /// connection (every 2 s), so waiters hear of releases again within that of the slot map
    /// naming the new primary, without following every fetch of a map still settling.
    fn drop_moved(&self) {
        let moved: Vec<_> = lock(&self.subscribed)
            .extract_if(|channel, (address, _)| {
                let primary = self.nodes.primary(slot(channel));
                primary.is_some_and(|node| node.address != *address)
            })
            .collect();
        for (channel, (_, mut conn)) in moved {
            let sent = channel.clone();
            tokio::spawn(async move {
                let _ = send_one(&mut conn, "SUNSUBSCRIBE", &sent).await;
            });
            (self.on_message)(Message::Dropped { channel });
        }
    }

    /// The subscriber connection to the node at `address`, opened if there is none yet.
    async fn connection(&self, node: &Node) -> redis::RedisResult<MultiplexedConnection> {
        if let Some(conn) = lock(&self.open).get(&node.address) {
            return Ok(conn.clone());
        }
        let info = self.nodes.info(&node.address);
        let settings = info.redis_settings().clone().set_protocol(RESP3);
        let client = redis::Client::open(info.set_redis_settings(settings))?;
        let (pushes, ended) = push_handler(Arc::clone(&self.on_message));
        let config = self.nodes.timeouts.config().set_push_sender(pushes);
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let mut open = lock(&self.open);
        if let Some(existing) = open.get(&node.address) {
            // Another subscription opened one meanwhile: this one is dropped, unwatched.
            return Ok(existing.clone());
        }
        open.insert(node.address.clone(), conn.clone());
        drop(open);
        let lost = self.lost.clone();
        tokio::spawn(ended.map(move |()| lost.cancel()));
        Ok(conn)
    }
}

/// Sends a subscribe-like command for one channel: its one confirmation (a RESP3 push that is
/// also the command's reply) or its error.
async fn send_one(
    conn: &mut MultiplexedConnection,
    command: &str,
    channel: &str,
) -> redis::RedisResult<()> {
    let mut cmd = redis::cmd(command);
    cmd.arg(channel);
    conn.send_packed_command(&cmd)
        .await
        .and_then(Value::extract_error)
        .map(drop)
}

/// A `CLUSTERDOWN` error: no primary serves a slot, or a subscription found no node to make it
/// on (the channel's waiters poll a while).
fn cluster_down(what: &'static str, detail: String) -> redis::RedisError {
    redis::RedisError::from((ErrorKind::Server(ClusterDown), what, detail))
}

impl Channels for ShardChannels {
    fn subscribe<'a>(
        &'a self,
        channel: &'a str,
        scope: Scope,
    ) -> BoxFuture<'a, redis::RedisResult<()>> {
        Box::pin(async move {
            let until = Instant::now() + self.nodes.timeouts.response;
            let primary = self.nodes.primary_by(slot(channel), until, "subscribe");
            let node = primary.await.map_err(|failed| {
                cluster_down("no node for the channel's slot", failed.error.to_string())
            })?;
            let mut conn = self.connection(&node).await.map_err(|error| {
                // That node only: its channels poll a while, the others keep their
                // subscriptions; and the node may be gone from the map.
                self.nodes.refetch();
                cluster_down("subscriber node", error.to_string())
            })?;
            if scope == Scope::Everywhere {
                send_one(&mut conn, "SUBSCRIBE", channel).await?;
                lock(&self.everywhere).insert(channel.to_owned(), conn);
                return Ok(());
            }
            send_one(&mut conn, "SSUBSCRIBE", channel)
                .await
                .inspect_err(|error| {
                    if matches!(error.kind(), ErrorKind::Server(Moved | ClusterDown)) {
                        self.nodes.refetch();
                    }
                })?;
            let subscribed = (node.address.clone(), conn);
            lock(&self.subscribed).insert(channel.to_owned(), subscribed);
            Ok(())
        })
    }

    fn unsubscribe<'a>(
        &'a self,
        channel: &'a str,
        scope: Scope,
    ) -> BoxFuture<'a, redis::RedisResult<()>> {
        Box::pin(async move {
            if scope == Scope::Everywhere {
                let Some(mut conn) = lock(&self.everywhere).remove(channel) else {
                    return Ok(());
                };
                return send_one(&mut conn, "UNSUBSCRIBE", channel).await;
            }
            let Some((_, mut conn)) = lock(&self.subscribed).remove(channel) else {
                return Ok(());
            };
            send_one(&mut conn, "SUNSUBSCRIBE", channel).await
        })
    }

    fn check(&self) -> BoxFuture<'_, redis::RedisResult<()>> {
        self.drop_moved();
        let conns: Vec<MultiplexedConnection> = lock(&self.open).values().cloned().collect();
        // Any answer will do, a refusal too (an ACL user without `+ping`): it came.
        Box::pin(async move {
            for mut conn in conns {
                conn.send_packed_command(&redis::cmd("PING")).await?;
            }
            Ok(())
        })
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
    crc16(tagged.unwrap_or(bytes)) % SLOTS as u16
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
    use super::*;

    /// A refused `CLUSTER SLOTS`, as an ACL rule and as a proxy in front of a cluster word it,
    /// is a misconfiguration that says to build the manager with `.url` behind a proxy; an
    /// outage is left as it is.
    #[test]
    fn a_refused_slot_map_says_what_to_configure_instead() {
        let reply = |text: &str| {
            let value = redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap();
            let error = value.extract_error().unwrap_err();
            slots_refused(LockError::from_redis(
                "cluster slot map (CLUSTER SLOTS)",
                error,
            ))
        };
        for (text, problem, said) in [
            (
                "NOPERM User app has no permissions to run the 'cluster|slots' command",
                Misconfiguration::Permissions,
                "ACL SETUSER <user> +cluster|slots",
            ),
            (
                "ERR unknown command 'CLUSTER', with args beginning with: 'SLOTS'",
                Misconfiguration::Unsupported,
                "it does not offer CLUSTER SLOTS",
            ),
        ] {
            match reply(text) {
                LockError::Misconfigured {
                    problem: p, detail, ..
                } => {
                    assert_eq!(p, problem);
                    assert!(detail.contains(said), "{detail}");
                    assert!(detail.contains("LockManagerBuilder::url"), "{detail}");
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(reply("LOADING Redis is loading the dataset in memory").is_unavailable());
    }

    #[test]
    fn slots_match_cluster_keyslot() {
        // redis-cli CLUSTER KEYSLOT <key>
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("123456789"), 12739);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        // An empty tag is no tag; only the first `{` counts.
        assert_eq!(slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(slot("foo{{bar}}zap"), slot("{bar"));
        assert_eq!(slot("distlock:lock:{{user:7}:wallet}"), slot("{user:7"));
    }

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn a_slot_map_reads_each_ranges_primary_and_fills_in_an_unknown_host() {
        let answer = Value::Array(vec![
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node("", 7001)]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000),
                node("10.0.0.2", 7003),
            ]),
        ]);
        let asked = ("10.0.0.9".to_owned(), 7009);
        assert_eq!(
            parse_slots(answer, &asked),
            Some(vec![
                (0, 5460, ("10.0.0.1".to_owned(), 7000)),
                (5461, 16383, ("10.0.0.9".to_owned(), 7001)),
            ])
        );
        // Not a slot map at all, or a range that ends before it starts.
        assert_eq!(parse_slots(Value::Int(1), &asked), None);
        let backwards = Value::Array(vec![Value::Array(vec![
            Value::Int(9),
            Value::Int(3),
            node("h", 1),
        ])]);
        assert_eq!(parse_slots(backwards, &asked), None);
    }
}
