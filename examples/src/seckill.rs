//! The seckill (flash-sale) service: products with limited stock, one unit per buyer, sold
//! over HTTP by several instances at once. Stock, sales and buyers live in Redis.
//!
//! The purchase is the classic read-check-write that oversells without a lock. Four strategies
//! run it side by side:
//! - `lock`: the read-check-write inside a `#[distributed_lock("seckill:{product_id}")]` fn,
//!   on a manager whose requests are fair by default (buyers served in arrival order; a quorum
//!   refuses fair requests, so there they are not), its read and write fenced (below);
//! - `none`: the same code with no lock and no fencing (shows the oversell);
//! - `optimistic`: `WATCH` / `MULTI` / `EXEC`, retried on conflict;
//! - `lua`: one atomic script (the ceiling a lock cannot reach: no lock round trips at all).
//!
//! # Why the `lock` strategy fences its read and its write
//!
//! A lease cannot stop a holder that stops running. A holder paused past its ttl (a GC pause, a
//! blocked thread, SIGSTOP, a suspended VM) has lost its lock in Redis, and another buyer holds
//! it, but the paused holder does not know until it runs again, and by then its next command may
//! already be on the wire: an unfenced write would land on top of the newer holder's work and
//! oversell. distlock then reports the lease lost (`LockError::LeaseLost`), but only once it
//! runs again, which can be after the write went out: renewal and lease-loss detection make the
//! window short, only the storage can close it. So every access of the `lock` strategy to a
//! product carries the lease's fencing token (`lease = lease` in the attribute gives the body
//! its lease; every later holder of the key has a greater token), and the product keeps the
//! newest token that touched it (its `fence` field). One script
//! (`FENCED_READ`) reads the product and records the token there, refusing a token older than
//! the recorded one; another (`FENCED_WRITE`) writes only if no newer token has touched the
//! product since. The read is fenced too, not only the write: fencing the write alone still lets
//! a stale write land between a newer holder's read and its write, which then writes from a
//! stock it read before the stale sale. A refused access changes nothing and the purchase fails
//! with [`ShopError::Stale`] (HTTP 503, `"stale"`): the buyer may simply try again.
//!
//! This is the pattern to copy: the lock makes buyers take turns, the fencing token makes a
//! turn that ran out harmless.
//!
//! # Reading while a restock writes
//!
//! A product also has a price and a batch number. A restock ([`Shop::restock`],
//! `POST /products/{id}/restock`) adds units at a new price and starts the product's next
//! batch, in two writes: the price first, then, after an await, the units and the batch number.
//! That is deliberately not atomic (like the purchase's read-check-write): in between, the
//! product is half-written, the new batch's price beside the old batch's stock and number. The
//! read path ([`Shop::offer`], `GET /products/{id}/offer`: price, stock and batch) takes the
//! product's key shared (`#[distributed_lock(read = "seckill:{product_id}")]`), the restock
//! takes it exclusively: readers run side by side, and never while a restock holds the key, so
//! none sees a half-written product. A `lock` purchase keeps taking the key exclusively,
//! because it writes the stock: it waits for the readers in the section, and they for it.
//!
//! The restock's two writes are fenced like the purchase's (each refused once a newer lease has
//! used the product, and each recording its token). The read is checked against the product's
//! `fence` but records nothing (readers do not exclude one another). A reader whose lease ran
//! out while it was paused, and in the meantime a restock began, is refused instead of reading
//! the half-written product: by the runtime, which finds the lease lost, or, for a read
//! already sent, by the fence ([`ShopError::Stale`]). Fencing cannot undo a first write,
//! though: a restock that dies between its two writes, or whose lease runs out there while a
//! newer holder uses the product, leaves the product half-written until the next restock. The
//! `none` strategy takes no lock and no fencing on this path either (readers then do see
//! half-written products); every other strategy reads and restocks under the read-write lock.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use distlock_runtime::{distributed_lock, LockError, LockManager};
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};

/// How a purchase is made safe (or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Strategy {
    /// A distributed lock per product (distlock).
    Lock,
    /// No protection at all.
    None,
    /// `WATCH` / `MULTI` / `EXEC` with retries.
    Optimistic,
    /// One Lua script.
    Lua,
}

impl Strategy {
    /// Every strategy, in the order the demo runs them.
    pub const ALL: [Strategy; 4] = [Self::Lock, Self::None, Self::Optimistic, Self::Lua];

    /// The name used on the command line and in output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Lock => "lock",
            Self::None => "none",
            Self::Optimistic => "optimistic",
            Self::Lua => "lua",
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How long a buyer waits for the product's lock (or retries a conflicting transaction)
/// before the service answers 503 busy.
pub const BUSY_AFTER: Duration = Duration::from_secs(10);

/// One service instance: its Redis connections, its lock manager and its strategy.
#[derive(Clone)]
pub struct Shop {
    inner: Arc<ShopInner>,
}

struct ShopInner {
    locks: LockManager,
    /// Reconnects by itself after Redis restarts.
    conn: ConnectionManager,
    pool: deadpool_redis::Pool,
    strategy: Strategy,
    prefix: String,
    /// Test-only: hooks that run at the points a [`Pause`] names (see [`Shop::pause_at`]).
    pauses: [OnceLock<Hook>; Pause::COUNT],
}

/// A test's hook: the future it returns is awaited where the hook runs.
type Hook = Box<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Test-only: the points of a request where [`Shop::pause_at`] runs a hook.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// A purchase, between its checks and its write.
    PurchaseWrite,
    /// A read of the product's offer, inside its lock (if any), just before it reads.
    OfferRead,
    /// A restock, between its first write (the price) and its second (units and batch).
    RestockSecondWrite,
}

impl Pause {
    const COUNT: usize = 3;
}

/// What a purchase came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// One unit bought.
    Bought {
        /// Units left after this purchase.
        remaining: i64,
    },
    /// No stock left.
    SoldOut,
    /// This user already bought one.
    AlreadyBought,
    /// No such product.
    UnknownProduct,
}

/// Why a purchase could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    /// The product's lock could not be had in time, or Redis was unavailable to the lock.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// A Redis command failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The pool had no connection for the optimistic strategy.
    #[error("connection pool: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
    /// The optimistic strategy kept conflicting until its deadline.
    #[error("too many conflicting buyers; try again")]
    Busy,
    /// The request's lease ran out before its read or write reached the product, and a newer
    /// lease has used the product since: the product refused this stale access. A refused
    /// purchase bought nothing and a refused read read nothing; a restock refused at its second
    /// write has written its price already. Trying again is safe.
    #[error(
        "product {product}: this request's lease ran out and a newer holder (fencing token \
         {newest}) has used the product since, so its access with token {token} was refused \
         (a refused purchase bought nothing); try again"
    )]
    Stale {
        /// The product.
        product: u64,
        /// The fencing token of this purchase's lease.
        token: u64,
        /// The newest fencing token the product has seen.
        newest: u64,
    },
}

impl Shop {
    /// A shop on the Redis at `url`, with its own lock manager, keeping its keys under `prefix`.
    ///
    /// # Errors
    /// When the URL is unusable, Redis cannot be reached, or it refuses the settings
    /// ([`LockManager::ping`]).
    pub async fn connect(url: &str, strategy: Strategy, prefix: &str) -> Result<Self, ShopError> {
        // Fair, the default: buyers are served in the order they queued.
        let locks = LockManager::builder().url(url);
        Self::connect_with_locks(url, locks, strategy, prefix).await
    }

    /// A shop whose products live on the Redis at `url` and whose locks come from `locks` (a
    /// builder with its topology chosen: a cluster, a Sentinel group, a quorum, or `url` too,
    /// and its fairness: fair by default, except on a quorum).
    ///
    /// # Errors
    /// As [`Shop::connect`].
    pub async fn connect_with_locks(
        url: &str,
        locks: distlock_runtime::LockManagerBuilder,
        strategy: Strategy,
        prefix: &str,
    ) -> Result<Self, ShopError> {
        // distlock reports through the `metrics` facade; this process serves them.
        prometheus();
        let locks = locks
            .prefix(format!("{prefix}lock:"))
            .default_wait(BUSY_AFTER)
            .build()?;
        // Wrong credentials, database or server version fail here, at startup, not at the
        // first purchase.
        locks.ping().await?;
        let conn = redis::Client::open(url)?.get_connection_manager().await?;
        let pool = deadpool_redis::Config::from_url(url)
            .builder()
            .map_err(|e| {
                redis::RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "pool",
                    e.to_string(),
                ))
            })?
            .max_size(64)
            .runtime(deadpool_redis::Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(5)))
            .create_timeout(Some(Duration::from_secs(2)))
            .recycle_timeout(Some(Duration::from_secs(2)))
            .build()
            .map_err(|e| {
                redis::RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "pool",
                    e.to_string(),
                ))
            })?;
        Ok(Self {
            inner: Arc::new(ShopInner {
                locks,
                conn,
                pool,
                strategy,
                prefix: prefix.to_owned(),
                pauses: Default::default(),
            }),
        })
    }

    /// Test-only: `hook` runs at the point `at` of every request that passes it, on the
    /// request's thread, and the future it returns is awaited there (at most one hook per point
    /// and shop; later calls are ignored). A hook that blocks the thread plays a holder paused
    /// past its lease (GC pause, SIGSTOP), which the fencing must make harmless; one whose
    /// future sleeps plays a slow request: see `examples/tests/seckill.rs`.
    #[doc(hidden)]
    pub fn pause_at<F, Fut>(&self, at: Pause, hook: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let hook: Hook = Box::new(move || Box::pin(hook()));
        let _ = self.inner.pauses[at as usize].set(hook);
    }

    /// This shop's strategy.
    pub fn strategy(&self) -> Strategy {
        self.inner.strategy
    }

    /// The HTTP service.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/products/{id}", post(create_product).get(show_product))
            .route("/products/{id}/buy", post(buy))
            .route("/products/{id}/offer", get(show_offer))
            .route("/products/{id}/restock", post(restock))
            .route("/metrics", get(metrics))
            .fallback(|| async { error(StatusCode::NOT_FOUND, "no such route") })
            .method_not_allowed_fallback(|| async {
                error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "method not allowed on this route",
                )
            })
            .with_state(self.clone())
    }

    /// Creates (or resets) a product: `product.stock` units at `product.price_cents`, batch 0.
    /// A reset keeps the product's `fence`, so a holder whose lease ran out before the reset
    /// still cannot write after it.
    ///
    /// # Errors
    /// When Redis fails.
    pub async fn create(&self, product_id: u64, product: CreateProduct) -> Result<(), ShopError> {
        let keys = self.inner.keys(product_id);
        let mut conn = self.inner.conn.clone();
        let price = i64::try_from(product.price_cents).unwrap_or(i64::MAX);
        redis::pipe()
            .atomic()
            .del(&keys.buyers)
            .hset_multiple(
                &keys.product,
                &[
                    ("stock", i64::from(product.stock)),
                    ("initial", i64::from(product.stock)),
                    ("restocked", 0),
                    ("sold", 0),
                    ("price", price),
                    ("batch", 0),
                ],
            )
            .exec_async(&mut conn)
            .await?;
        Ok(())
    }

    /// The product's counts, or `None` if there is no such product.
    ///
    /// # Errors
    /// When Redis fails.
    pub async fn report(&self, product_id: u64) -> Result<Option<ProductReport>, ShopError> {
        let keys = self.inner.keys(product_id);
        let mut conn = self.inner.conn.clone();
        let (fields, buyers): (Vec<Option<i64>>, u64) = redis::pipe()
            .cmd("HMGET")
            .arg(&keys.product)
            .arg(&["stock", "sold", "initial", "restocked"])
            .scard(&keys.buyers)
            .query_async(&mut conn)
            .await?;
        let [Some(stock), Some(sold), Some(initial), restocked] = fields[..] else {
            return Ok(None);
        };
        let restocked = restocked.unwrap_or(0);
        Ok(Some(ProductReport {
            product: product_id,
            stock,
            sold,
            initial,
            restocked,
            oversold: (sold - initial - restocked).max(0),
            buyers,
        }))
    }

    /// The product's offer (price, stock and the batch they belong to), or `None` if there is
    /// no such product. Under every strategy but `none`, read under the product's key held
    /// shared: beside other readers, never during a restock (or a `lock` purchase).
    ///
    /// # Errors
    /// [`ShopError::Lock`] when the shared lock could not be had (a restock or purchase held it
    /// throughout the wait, or Redis is down) or was lost; [`ShopError::Stale`] when this
    /// read's lease ran out and a newer holder used the product first; Redis errors.
    pub async fn offer(&self, product_id: u64) -> Result<Option<Offer>, ShopError> {
        let shop = &*self.inner;
        match shop.strategy {
            Strategy::None => shop.read_offer(product_id, None).await,
            Strategy::Lock | Strategy::Optimistic | Strategy::Lua => {
                offer_locked(shop, product_id).await
            }
        }
    }

    /// Adds `restock.units` at `restock.price_cents` and starts the product's next batch;
    /// returns the offer as this restock left it, or `None` if there is no such product. Two
    /// writes, deliberately not atomic (see the module docs); under every strategy but `none`,
    /// made under the product's key held exclusively, so no reader sees the product between
    /// them.
    ///
    /// # Errors
    /// As [`Shop::offer`]; a restock refused as [`ShopError::Stale`] at its second write has
    /// written its price already.
    pub async fn restock(
        &self,
        product_id: u64,
        restock: Restock,
    ) -> Result<Option<Offer>, ShopError> {
        let shop = &*self.inner;
        match shop.strategy {
            Strategy::None => shop.restock_in_two_writes(product_id, restock, None).await,
            Strategy::Lock | Strategy::Optimistic | Strategy::Lua => {
                restock_locked(shop, product_id, restock).await
            }
        }
    }

    /// One purchase of one unit by `user_id`, with this shop's strategy.
    ///
    /// # Errors
    /// [`ShopError::Lock`] when the lock could not be had (busy, or Redis down) or was lost;
    /// [`ShopError::Stale`] when the lock's lease ran out and a newer holder used the product
    /// first; [`ShopError::Busy`] when optimistic retries ran out; Redis errors.
    pub async fn purchase(&self, product_id: u64, user_id: u64) -> Result<Outcome, ShopError> {
        let shop = &*self.inner;
        match shop.strategy {
            Strategy::Lock => purchase_locked(shop, product_id, user_id).await,
            Strategy::None => shop.read_check_write(product_id, user_id, None).await,
            Strategy::Optimistic => shop.optimistic(product_id, user_id).await,
            Strategy::Lua => shop.scripted(product_id, user_id).await,
        }
    }
}

/// The purchase under the product's distributed lock: at most one buyer per product at a
/// time, fleet-wide, while leases hold; the lease's fencing token makes the product refuse this
/// buyer's read-check-write once a newer holder has used it (see the module docs).
#[distributed_lock("seckill:{product_id}", ttl = 5, manager = &shop.locks, lease = lease)]
async fn purchase_locked(
    shop: &ShopInner,
    product_id: u64,
    user_id: u64,
) -> Result<Outcome, ShopError> {
    shop.read_check_write(product_id, user_id, Some(lease.fencing_token()))
        .await
}

/// The read of the product's offer under its key held shared: beside other readers, never
/// while a restock (or a purchase) holds the key. The lease's fencing token makes the product
/// refuse this read once a newer lease has used it (see the module docs).
#[distributed_lock(read = "seckill:{product_id}", ttl = 5, manager = &shop.locks, lease = lease)]
async fn offer_locked(shop: &ShopInner, product_id: u64) -> Result<Option<Offer>, ShopError> {
    shop.read_offer(product_id, Some(lease.fencing_token()))
        .await
}

/// The restock under the product's key held exclusively: no reader, purchase or other restock
/// runs between its two writes while its lease holds; its fencing token makes the product refuse
/// each write once a newer lease has used it.
#[distributed_lock("seckill:{product_id}", ttl = 5, manager = &shop.locks, lease = lease)]
async fn restock_locked(
    shop: &ShopInner,
    product_id: u64,
    restock: Restock,
) -> Result<Option<Offer>, ShopError> {
    shop.restock_in_two_writes(product_id, restock, Some(lease.fencing_token()))
        .await
}

struct Keys {
    product: String,
    buyers: String,
}

/// A read of the offer under a shared lease: refused once a newer lease used the product,
/// else the product's price, stock and batch, in one command. Records nothing: readers do not
/// exclude one another, and a later writer's token is greater than every reader's before it.
///
/// KEYS[1]: the product hash. ARGV[1]: the lease's fencing token, in decimal.
/// Returns `{0, newest, false, false}` when the product's `fence` holds a newer token,
/// `newest` (nothing read); else `{1, price, stock, batch}` (stock nil: no such product).
static FENCED_OFFER: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local newest = redis.call('HGET', KEYS[1], 'fence')
if newest and tonumber(newest) > tonumber(ARGV[1]) then return {0, newest, false, false} end
local offer = redis.call('HMGET', KEYS[1], 'price', 'stock', 'batch')
return {1, offer[1], offer[2], offer[3]}
",
    )
});

/// A restock's first write: the new price, unless a newer lease used the product.
///
/// KEYS[1]: the product hash. ARGV[1]: the lease's fencing token, in decimal; ARGV[2]: the
/// price in cents.
/// Returns `{0, newest}` when the product's `fence` holds a newer token, `newest` (nothing
/// written); `{1, 0}` when there is no such product (nothing written); `{2, 0}` once the price
/// is written and the token recorded in `fence`.
static FENCED_PRICE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local newest = redis.call('HGET', KEYS[1], 'fence')
if newest and tonumber(newest) > tonumber(ARGV[1]) then return {0, newest} end
if redis.call('HEXISTS', KEYS[1], 'stock') == 0 then return {1, 0} end
redis.call('HSET', KEYS[1], 'price', ARGV[2], 'fence', ARGV[1])
return {2, 0}
",
    )
});

/// A restock's second write: the units and the next batch, unless a newer lease used the
/// product since the restock's [`FENCED_PRICE`].
///
/// KEYS[1]: the product hash. ARGV[1]: the lease's fencing token, in decimal; ARGV[2]: the
/// units added.
/// Returns `{0, newest, 0}` when the product's `fence` holds a newer token, `newest` (nothing
/// written); else `{1, stock, batch}` once `stock` and `restocked` grew by the units, `batch`
/// by one, and the token is recorded in `fence`.
static FENCED_UNITS: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local newest = redis.call('HGET', KEYS[1], 'fence')
if newest and tonumber(newest) > tonumber(ARGV[1]) then return {0, newest, 0} end
local stock = redis.call('HINCRBY', KEYS[1], 'stock', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'restocked', ARGV[2])
local batch = redis.call('HINCRBY', KEYS[1], 'batch', 1)
redis.call('HSET', KEYS[1], 'fence', ARGV[1])
return {1, stock, batch}
",
    )
});

/// The `lock` strategy's read: refused once a newer lease used the product, else records this
/// lease's token in the product's `fence`, so that older leases are refused from then on.
///
/// KEYS[1]: the product hash; KEYS[2]: its buyers set.
/// ARGV[1]: the lease's fencing token, in decimal; ARGV[2]: the user id.
/// Returns `{0, newest, 0}` when the product's `fence` holds a newer token, `newest` (nothing
/// read or recorded); else `{1, stock, bought}`: the stock (nil: no such product, and nothing
/// is recorded) and 1 if the user bought already, 0 if not.
///
/// Tokens are compared as Lua numbers, exact for every token below 2^53 (Redis server time in
/// microseconds is about 2^51); the token is stored as the decimal string it came as.
static FENCED_READ: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local newest = redis.call('HGET', KEYS[1], 'fence')
if newest and tonumber(newest) > tonumber(ARGV[1]) then return {0, newest, 0} end
local stock = redis.call('HGET', KEYS[1], 'stock')
if stock then redis.call('HSET', KEYS[1], 'fence', ARGV[1]) end
return {1, stock, redis.call('SISMEMBER', KEYS[2], ARGV[2])}
",
    )
});

/// The `lock` strategy's write: the sale, unless a newer lease used the product since this
/// lease's [`FENCED_READ`].
///
/// KEYS[1]: the product hash; KEYS[2]: its buyers set.
/// ARGV[1]: the lease's fencing token, in decimal; ARGV[2]: the user id; ARGV[3]: the new stock.
/// Returns nil once the sale is written (stock set, `sold` + 1, buyer added, token recorded in
/// `fence`); the newest token the product has seen, when it is newer than ARGV[1] (nothing
/// written). An equal token is this lease's own read.
static FENCED_WRITE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local newest = redis.call('HGET', KEYS[1], 'fence')
if newest and tonumber(newest) > tonumber(ARGV[1]) then return newest end
redis.call('HSET', KEYS[1], 'stock', ARGV[3], 'fence', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'sold', 1)
redis.call('SADD', KEYS[2], ARGV[2])
return false
",
    )
});

impl ShopInner {
    fn keys(&self, product_id: u64) -> Keys {
        Keys {
            product: format!("{}product:{product_id}", self.prefix),
            buyers: format!("{}product:{product_id}:buyers", self.prefix),
        }
    }

    /// Runs the test's hook for `at`, if it set one.
    async fn pause(&self, at: Pause) {
        if let Some(hook) = self.pauses[at as usize].get() {
            hook().await;
        }
    }

    /// The product's price, stock and batch, in one command. With a fencing token, through
    /// [`FENCED_OFFER`], which refuses it (as [`ShopError::Stale`]) once a newer token has used
    /// the product.
    async fn read_offer(
        &self,
        product_id: u64,
        fencing_token: Option<u64>,
    ) -> Result<Option<Offer>, ShopError> {
        self.pause(Pause::OfferRead).await;
        let keys = self.keys(product_id);
        let mut conn = self.conn.clone();
        let (price, stock, batch): (Option<u64>, Option<i64>, Option<u64>) = match fencing_token {
            None => {
                redis::cmd("HMGET")
                    .arg(&keys.product)
                    .arg(&["price", "stock", "batch"])
                    .query_async(&mut conn)
                    .await?
            }
            Some(token) => {
                // The second value is the price when read, the newest token when refused.
                let (read, price, stock, batch): (i64, Option<u64>, Option<i64>, Option<u64>) =
                    FENCED_OFFER
                        .key(&keys.product)
                        .arg(token)
                        .invoke_async(&mut conn)
                        .await?;
                if read == 0 {
                    return Err(ShopError::Stale {
                        product: product_id,
                        token,
                        newest: price.unwrap_or_default(),
                    });
                }
                (price, stock, batch)
            }
        };
        Ok(stock.map(|stock| Offer {
            product: product_id,
            price_cents: price.unwrap_or_default(),
            stock,
            batch: batch.unwrap_or_default(),
        }))
    }

    /// The restock: the price, then (after an await) the units and the next batch. Two writes,
    /// deliberately not atomic: correct only when nobody reads or writes the product between
    /// them. With a fencing token, they go through [`FENCED_PRICE`] and [`FENCED_UNITS`], which
    /// refuse them (as [`ShopError::Stale`]) once a newer token has used the product.
    async fn restock_in_two_writes(
        &self,
        product_id: u64,
        restock: Restock,
        fencing_token: Option<u64>,
    ) -> Result<Option<Offer>, ShopError> {
        let keys = self.keys(product_id);
        let mut conn = self.conn.clone();
        let stale = |token, newest| ShopError::Stale {
            product: product_id,
            token,
            newest,
        };
        match fencing_token {
            None => {
                let exists: bool = redis::cmd("HEXISTS")
                    .arg(&keys.product)
                    .arg("stock")
                    .query_async(&mut conn)
                    .await?;
                if !exists {
                    return Ok(None);
                }
                redis::cmd("HSET")
                    .arg(&keys.product)
                    .arg("price")
                    .arg(restock.price_cents)
                    .exec_async(&mut conn)
                    .await?;
            }
            Some(token) => {
                let (written, newest): (i64, u64) = FENCED_PRICE
                    .key(&keys.product)
                    .arg(token)
                    .arg(restock.price_cents)
                    .invoke_async(&mut conn)
                    .await?;
                match written {
                    0 => return Err(stale(token, newest)),
                    1 => return Ok(None),
                    _ => {}
                }
            }
        }
        // The new batch is counted in: other requests run meanwhile.
        tokio::task::yield_now().await;
        self.pause(Pause::RestockSecondWrite).await;
        let (stock, batch): (i64, u64) = match fencing_token {
            None => {
                let (stock, _, batch): (i64, i64, u64) = redis::pipe()
                    .hincr(&keys.product, "stock", restock.units)
                    .hincr(&keys.product, "restocked", restock.units)
                    .hincr(&keys.product, "batch", 1)
                    .query_async(&mut conn)
                    .await?;
                (stock, batch)
            }
            Some(token) => {
                // The second value is the stock when written, the newest token when refused.
                let (written, value, batch): (i64, i64, u64) = FENCED_UNITS
                    .key(&keys.product)
                    .arg(token)
                    .arg(restock.units)
                    .invoke_async(&mut conn)
                    .await?;
                if written == 0 {
                    return Err(stale(token, u64::try_from(value).unwrap_or_default()));
                }
                (value, batch)
            }
        };
        Ok(Some(Offer {
            product: product_id,
            price_cents: restock.price_cents,
            stock,
            batch,
        }))
    }

    /// Read the stock, check it and the buyer, write the new stock: correct only when nobody
    /// else runs it for the same product at the same time. With a fencing token, the read and
    /// the write go through [`FENCED_READ`] and [`FENCED_WRITE`], which refuse them (as
    /// [`ShopError::Stale`]) once a newer token has used the product.
    async fn read_check_write(
        &self,
        product_id: u64,
        user_id: u64,
        fencing_token: Option<u64>,
    ) -> Result<Outcome, ShopError> {
        let keys = self.keys(product_id);
        let mut conn = self.conn.clone();
        let stale = |token, newest| ShopError::Stale {
            product: product_id,
            token,
            newest,
        };
        let (stock, bought): (Option<i64>, bool) = match fencing_token {
            None => {
                redis::pipe()
                    .hget(&keys.product, "stock")
                    .sismember(&keys.buyers, user_id)
                    .query_async(&mut conn)
                    .await?
            }
            Some(token) => {
                // The second value is the stock when read, the newest token when refused.
                let (read, value, bought): (i64, Option<i64>, bool) = FENCED_READ
                    .key(&keys.product)
                    .key(&keys.buyers)
                    .arg(token)
                    .arg(user_id)
                    .invoke_async(&mut conn)
                    .await?;
                if read == 0 {
                    let newest = value
                        .and_then(|n| u64::try_from(n).ok())
                        .unwrap_or_default();
                    return Err(stale(token, newest));
                }
                (value, bought)
            }
        };
        let Some(stock) = stock else {
            return Ok(Outcome::UnknownProduct);
        };
        if bought {
            return Ok(Outcome::AlreadyBought);
        }
        if stock <= 0 {
            return Ok(Outcome::SoldOut);
        }
        // The order is "processed" here: other buyers run meanwhile.
        tokio::task::yield_now().await;
        self.pause(Pause::PurchaseWrite).await;
        let remaining = stock - 1;
        match fencing_token {
            None => {
                redis::pipe()
                    .hset(&keys.product, "stock", remaining)
                    .hincr(&keys.product, "sold", 1)
                    .sadd(&keys.buyers, user_id)
                    .exec_async(&mut conn)
                    .await?;
            }
            Some(token) => {
                let newest: Option<u64> = FENCED_WRITE
                    .key(&keys.product)
                    .key(&keys.buyers)
                    .arg(token)
                    .arg(user_id)
                    .arg(remaining)
                    .invoke_async(&mut conn)
                    .await?;
                if let Some(newest) = newest {
                    return Err(stale(token, newest));
                }
            }
        }
        Ok(Outcome::Bought { remaining })
    }

    /// The same check under `WATCH`, committed with `MULTI`/`EXEC`, retried when another buyer
    /// changed the product first.
    async fn optimistic(&self, product_id: u64, user_id: u64) -> Result<Outcome, ShopError> {
        let keys = self.keys(product_id);
        let deadline = tokio::time::Instant::now() + BUSY_AFTER;
        let mut backoff = Duration::from_millis(1);
        // A pooled connection is ours alone while held: WATCH state cannot mix with others'.
        let mut conn = self.pool.get().await?;
        loop {
            redis::cmd("WATCH")
                .arg(&keys.product)
                .arg(&keys.buyers)
                .exec_async(&mut conn)
                .await?;
            let (stock, bought): (Option<i64>, bool) = redis::pipe()
                .hget(&keys.product, "stock")
                .sismember(&keys.buyers, user_id)
                .query_async(&mut conn)
                .await?;
            let verdict = match stock {
                None => Some(Outcome::UnknownProduct),
                Some(_) if bought => Some(Outcome::AlreadyBought),
                Some(stock) if stock <= 0 => Some(Outcome::SoldOut),
                Some(_) => None,
            };
            if let Some(verdict) = verdict {
                redis::cmd("UNWATCH").exec_async(&mut conn).await?;
                return Ok(verdict);
            }
            let remaining = stock.unwrap_or(0) - 1;
            let committed: Option<()> = redis::pipe()
                .atomic()
                .hset(&keys.product, "stock", remaining)
                .ignore()
                .hincr(&keys.product, "sold", 1)
                .ignore()
                .sadd(&keys.buyers, user_id)
                .ignore()
                .query_async(&mut conn)
                .await?;
            if committed.is_some() {
                return Ok(Outcome::Bought { remaining });
            }
            if tokio::time::Instant::now() + backoff > deadline {
                return Err(ShopError::Busy);
            }
            tokio::time::sleep(backoff.mul_f64(0.5 + fastrand::f64())).await;
            backoff = (backoff * 2).min(Duration::from_millis(50));
        }
    }

    /// The whole purchase as one script: atomic on the server, no lock needed.
    async fn scripted(&self, product_id: u64, user_id: u64) -> Result<Outcome, ShopError> {
        static PURCHASE: LazyLock<redis::Script> = LazyLock::new(|| {
            // KEYS[1]: product hash, KEYS[2]: buyers set. ARGV[1]: user id.
            // Returns -1 unknown product, -2 already bought, -3 sold out, else the stock left.
            redis::Script::new(
                r"
local stock = tonumber(redis.call('HGET', KEYS[1], 'stock'))
if not stock then return -1 end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return -2 end
if stock <= 0 then return -3 end
redis.call('HSET', KEYS[1], 'stock', stock - 1)
redis.call('HINCRBY', KEYS[1], 'sold', 1)
redis.call('SADD', KEYS[2], ARGV[1])
return stock - 1
",
            )
        });
        let keys = self.keys(product_id);
        let mut conn = self.conn.clone();
        let answer: i64 = PURCHASE
            .key(&keys.product)
            .key(&keys.buyers)
            .arg(user_id)
            .invoke_async(&mut conn)
            .await?;
        Ok(match answer {
            -1 => Outcome::UnknownProduct,
            -2 => Outcome::AlreadyBought,
            -3 => Outcome::SoldOut,
            remaining => Outcome::Bought { remaining },
        })
    }
}

/// `GET /products/{id}`: a product's counts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProductReport {
    /// Product id.
    pub product: u64,
    /// Units left.
    pub stock: i64,
    /// Units sold.
    pub sold: i64,
    /// Units the product was created with.
    pub initial: i64,
    /// Units added by restocks since.
    #[serde(default)]
    pub restocked: i64,
    /// Units sold beyond those the product was created with and restocked.
    pub oversold: i64,
    /// Distinct buyers.
    pub buyers: u64,
}

/// `POST /products/{id}` body.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct CreateProduct {
    /// Units for sale.
    pub stock: u32,
    /// The price of a unit, in cents; [`CreateProduct::DEFAULT_PRICE_CENTS`] if left out.
    #[serde(default = "CreateProduct::default_price_cents")]
    pub price_cents: u64,
}

impl CreateProduct {
    /// The price of a product created without one: 1.00.
    pub const DEFAULT_PRICE_CENTS: u64 = 100;

    /// `stock` units at the default price.
    pub fn with_stock(stock: u32) -> Self {
        Self {
            stock,
            price_cents: Self::DEFAULT_PRICE_CENTS,
        }
    }

    fn default_price_cents() -> u64 {
        Self::DEFAULT_PRICE_CENTS
    }
}

/// `POST /products/{id}/restock` body.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Restock {
    /// Units added to the stock.
    pub units: u32,
    /// The price of a unit from this batch on, in cents.
    pub price_cents: u64,
}

/// `GET /products/{id}/offer` and the `POST /products/{id}/restock` answer: what a product sells
/// at, read together.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Offer {
    /// Product id.
    pub product: u64,
    /// The price of a unit, in cents, as the batch `batch` set it.
    pub price_cents: u64,
    /// Units left.
    pub stock: i64,
    /// The batch: 0 when the product was created, one more at each restock.
    pub batch: u64,
}

/// `POST /products/{id}/buy` body.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct BuyRequest {
    /// Who buys.
    pub user_id: u64,
}

/// The JSON body of every purchase answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BuyResponse {
    /// `bought`, `sold_out`, `already_bought`, `busy`, `stale` (a lease ran out and the
    /// product refused the purchase; nothing was bought, try again), `unknown_product` or
    /// `error`.
    pub status: String,
    /// Units left, when bought.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub remaining: Option<i64>,
    /// What went wrong, for errors.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub message: Option<String>,
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "status": "error", "message": message.into() });
    (status, Json(body)).into_response()
}

/// A request the service refuses before doing anything: a 4xx JSON answer.
struct Rejected {
    status: StatusCode,
    message: String,
}

impl IntoResponse for Rejected {
    fn into_response(self) -> Response {
        error(self.status, self.message)
    }
}

fn product_id(path: Result<Path<u64>, PathRejection>) -> Result<u64, Rejected> {
    path.map(|Path(id)| id).map_err(|rejection| Rejected {
        status: StatusCode::BAD_REQUEST,
        message: format!(
            "product id must be a non-negative integer: {}",
            rejection.body_text()
        ),
    })
}

fn json_body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, Rejected> {
    body.map(|Json(body)| body).map_err(|rejection| Rejected {
        status: rejection.status(),
        message: rejection.body_text(),
    })
}

async fn create_product(
    State(shop): State<Shop>,
    path: Result<Path<u64>, PathRejection>,
    body: Result<Json<CreateProduct>, JsonRejection>,
) -> Response {
    let (id, body) = match (product_id(path), json_body(body)) {
        (Ok(id), Ok(body)) => (id, body),
        (Err(rejected), _) | (_, Err(rejected)) => return rejected.into_response(),
    };
    match shop.create(id, body).await {
        Ok(()) => (
            StatusCode::CREATED,
            Json(serde_json::json!({
                "product": id,
                "stock": body.stock,
                "price_cents": body.price_cents,
            })),
        )
            .into_response(),
        Err(e) => failed(e),
    }
}

async fn show_product(
    State(shop): State<Shop>,
    path: Result<Path<u64>, PathRejection>,
) -> Response {
    let id = match product_id(path) {
        Ok(id) => id,
        Err(rejected) => return rejected.into_response(),
    };
    match shop.report(id).await {
        Ok(Some(report)) => Json(report).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, format!("no product {id}")),
        Err(e) => failed(e),
    }
}

async fn show_offer(State(shop): State<Shop>, path: Result<Path<u64>, PathRejection>) -> Response {
    let id = match product_id(path) {
        Ok(id) => id,
        Err(rejected) => return rejected.into_response(),
    };
    match shop.offer(id).await {
        Ok(Some(offer)) => Json(offer).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, format!("no product {id}")),
        Err(e) => failed(e),
    }
}

async fn restock(
    State(shop): State<Shop>,
    path: Result<Path<u64>, PathRejection>,
    body: Result<Json<Restock>, JsonRejection>,
) -> Response {
    let (id, body) = match (product_id(path), json_body(body)) {
        (Ok(id), Ok(body)) => (id, body),
        (Err(rejected), _) | (_, Err(rejected)) => return rejected.into_response(),
    };
    match shop.restock(id, body).await {
        Ok(Some(offer)) => Json(offer).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, format!("no product {id}")),
        Err(e) => failed(e),
    }
}

async fn buy(
    State(shop): State<Shop>,
    path: Result<Path<u64>, PathRejection>,
    body: Result<Json<BuyRequest>, JsonRejection>,
) -> Response {
    let (id, body) = match (product_id(path), json_body(body)) {
        (Ok(id), Ok(body)) => (id, body),
        (Err(rejected), _) | (_, Err(rejected)) => return rejected.into_response(),
    };
    let answer =
        |status: StatusCode, word: &str, remaining: Option<i64>, message: Option<String>| {
            let body = BuyResponse {
                status: word.to_owned(),
                remaining,
                message,
            };
            (status, Json(body)).into_response()
        };
    match shop.purchase(id, body.user_id).await {
        Ok(Outcome::Bought { remaining }) => {
            answer(StatusCode::OK, "bought", Some(remaining), None)
        }
        Ok(Outcome::SoldOut) => answer(StatusCode::CONFLICT, "sold_out", None, None),
        Ok(Outcome::AlreadyBought) => answer(StatusCode::CONFLICT, "already_bought", None, None),
        Ok(Outcome::UnknownProduct) => answer(
            StatusCode::NOT_FOUND,
            "unknown_product",
            None,
            Some(format!("no product {id}")),
        ),
        Err(e) => failed(e),
    }
}

/// The answer to a failed request: `{"status": word, "message": ...}`, the word from [`word`].
/// A lock failure gets the status the runtime's `IntoResponse` for `LockError` gives it (409
/// busy, 503 unavailable with `Retry-After` where known, 500 to fix; logged there), and keeps
/// its `Retry-After`; the shop's own failures are answered here, a server error logged.
fn failed(e: ShopError) -> Response {
    let body = Json(serde_json::json!({ "status": word(&e), "message": e.to_string() }));
    let status = match e {
        ShopError::Lock(lock) => {
            let (mut parts, _) = lock.into_response().into_parts();
            // The JSON body brings its own.
            parts.headers.remove(axum::http::header::CONTENT_TYPE);
            return (parts, body).into_response();
        }
        ShopError::Busy => StatusCode::CONFLICT,
        // Nothing was written: the buyer may try again.
        ShopError::Stale { .. } | ShopError::Redis(_) | ShopError::Pool(_) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
    };
    if status.is_server_error() {
        tracing::warn!(error = %e, "seckill request failed");
    }
    (status, body).into_response()
}

/// The word a failed request answers with, by the kind of failure (see `ErrorClass` in the
/// runtime's docs): somebody else is buying (`busy`: try again), the lock service or the store
/// is unavailable or the lease ran out (`unavailable`, `stale`: try again later, nothing was
/// bought), the lock settings or this service are wrong (`misconfigured`, `bug`: retrying will
/// not help).
fn word(e: &ShopError) -> &'static str {
    use distlock_runtime::ErrorClass;
    match e {
        ShopError::Busy => "busy",
        ShopError::Stale { .. } => "stale",
        ShopError::Redis(_) | ShopError::Pool(_) => "unavailable",
        ShopError::Lock(e) => match e.class() {
            ErrorClass::Contention => "busy",
            ErrorClass::Unavailable => "unavailable",
            ErrorClass::Misconfigured => "misconfigured",
            _ => "bug",
        },
    }
}

/// The process's Prometheus recorder, installed on first use: every shop in the process (and
/// every lock manager) reports to it. `None` if another recorder was installed first.
fn prometheus() -> Option<&'static metrics_exporter_prometheus::PrometheusHandle> {
    static HANDLE: OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
        OnceLock::new();
    HANDLE
        .get_or_init(|| {
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .ok()
        })
        .as_ref()
}

/// `GET /metrics`: distlock's metrics (and anything else recorded) in the Prometheus text format.
async fn metrics() -> Response {
    match prometheus() {
        Some(handle) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            handle.render(),
        )
            .into_response(),
        None => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "another metrics recorder is installed in this process",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The status, the `Retry-After` and the JSON body's word of a failed request.
    async fn answer(e: ShopError) -> (u16, Option<String>, String) {
        let response = failed(e);
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(axum::http::header::RETRY_AFTER)
            .map(|value| value.to_str().unwrap().to_owned());
        assert_eq!(
            response.headers()[axum::http::header::CONTENT_TYPE],
            "application/json"
        );
        let body = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        (
            status,
            retry_after,
            body["status"].as_str().unwrap().to_owned(),
        )
    }

    /// Each class of lock failure gets the status the runtime's `IntoResponse` gives it
    /// (contention 409, unavailable and a lost lease 503, a misconfiguration or a caller's bug
    /// 500), its `Retry-After`, and the word the load generator counts.
    #[tokio::test]
    async fn each_class_of_lock_failure_maps_to_its_status() {
        let key = || "seckill:7".to_owned();
        let redis = || redis::RedisError::from((redis::ErrorKind::Io, "refused"));
        let cases = [
            (LockError::NotAcquired { key: key() }, 409, None, "busy"),
            (
                LockError::Timeout {
                    key: key(),
                    waited: Duration::from_secs(1),
                },
                409,
                None,
                "busy",
            ),
            (
                LockError::LeaseLost { keys: vec![key()] },
                503,
                None,
                "unavailable",
            ),
            (
                LockError::Redis {
                    op: "acquire",
                    source: redis(),
                },
                503,
                None,
                "unavailable",
            ),
            (
                LockError::RedisTimeout {
                    op: "acquire",
                    after: Duration::from_secs(1),
                },
                503,
                Some("1"),
                "unavailable",
            ),
            (
                LockError::Misconfigured {
                    op: "acquire",
                    problem: distlock_runtime::Misconfiguration::Permissions,
                    detail: String::new(),
                    source: redis(),
                },
                500,
                None,
                "misconfigured",
            ),
            (
                LockError::WrongType {
                    op: "acquire",
                    key: key(),
                    found: "a list".to_owned(),
                },
                500,
                None,
                "misconfigured",
            ),
            (LockError::NotConfigured, 500, None, "misconfigured"),
            (LockError::HeldByThisTask { key: key() }, 500, None, "bug"),
        ];
        for (error, status, retry_after, word) in cases {
            let got = answer(ShopError::Lock(error.clone())).await;
            let want = (status, retry_after.map(str::to_owned), word.to_owned());
            assert_eq!(got, want, "{error:?}");
        }
        assert_eq!(
            answer(ShopError::Busy).await,
            (409, None, "busy".to_owned())
        );
        let stale = ShopError::Stale {
            product: 7,
            token: 1,
            newest: 2,
        };
        assert_eq!(answer(stale).await, (503, None, "stale".to_owned()));
    }
}
