//! The seckill service against a real redis-server: over HTTP (two instances, each with its own
//! lock manager, 500 buyers, stock 100; readers of a product's offer while it is restocked), and
//! the `lock` strategy's fencing against a holder paused past its lease.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use distlock_examples::seckill::{
    BuyResponse, CreateProduct, Offer, Outcome, Pause, ProductReport, Restock, Shop, ShopError,
    Strategy,
};
use distlock_runtime::LockError;
use distlock_tests::RedisServer;

/// The tests of this file share the process's metrics recorder; the one that checks the
/// counters runs alone (the others hold this too).
static METRICS: Mutex<()> = Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    METRICS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The value of the Prometheus sample `name{labels}` in `text`, 0 when absent.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(name) && !line.starts_with('#'))
        .filter(|line| {
            let (series, _) = line.rsplit_once(' ').unwrap_or((line, ""));
            series.split('{').next() == Some(name)
                && labels
                    .iter()
                    .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

async fn scrape(base: &str) -> String {
    let response = reqwest::get(format!("{base}/metrics")).await.unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

/// Starts a `lock` instance on a loopback port; returns its base URL.
async fn instance(redis_url: &str) -> String {
    let shop = Shop::connect(redis_url, Strategy::Lock, "seckill-test:")
        .await
        .unwrap();
    serve(shop).await
}

/// Serves `shop` on a loopback port; returns its base URL.
async fn serve(shop: Shop) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, shop.router()).await });
    format!("http://{addr}")
}

/// Runs a body under a lease labelled `label` (in this process's metrics) on `server`, and
/// breaks the lock from outside, so the body ends with `LeaseLost`.
async fn lose_a_lease(server: &RedisServer, label: &'static str) {
    let (locks, breaker) = (server.manager(), server.manager());
    let running = tokio::spawn(async move {
        locks
            .lock("seckill-test-canary")
            .metrics_label(label)
            .ttl(Duration::from_millis(300))
            .run(tokio::time::sleep(Duration::from_secs(10)))
            .await
    });
    let held = distlock_tests::eventually(Duration::from_secs(5), || async {
        breaker
            .inspect("seckill-test-canary")
            .await
            .unwrap()
            .is_some()
    })
    .await;
    assert!(held.is_some(), "the canary lease was taken");
    assert!(breaker.force_release("seckill-test-canary").await.unwrap());
    let lost = running.await.unwrap().unwrap_err();
    assert!(matches!(lost, LockError::LeaseLost { .. }), "{lost:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // held for the whole test, to run it alone
async fn five_hundred_buyers_two_instances_exactly_one_hundred_sold() {
    let _alone = alone();
    let server = RedisServer::start();
    let instances = [instance(&server.url()).await, instance(&server.url()).await];
    let template = [("template", "seckill:{product_id}")];
    let before = scrape(&instances[0]).await;
    let client = reqwest::Client::new();
    let created = client
        .post(format!("{}/products/7", instances[0]))
        .json(&serde_json::json!({ "stock": 100 }))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);

    let mut buyers = tokio::task::JoinSet::new();
    for user in 0..500_u64 {
        let url = format!("{}/products/7/buy", instances[(user % 2) as usize]);
        let client = client.clone();
        buyers.spawn(async move {
            let response = client
                .post(url)
                .json(&serde_json::json!({ "user_id": user }))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body: BuyResponse = response.json().await.unwrap();
            (user, status, body)
        });
    }
    let mut winners = HashSet::new();
    let (mut sold_out, mut other) = (0, Vec::new());
    while let Some(joined) = buyers.join_next().await {
        let (user, status, body) = joined.unwrap();
        match (status, body.status.as_str()) {
            (200, "bought") => assert!(winners.insert(user), "user {user} bought twice"),
            (409, "sold_out") => sold_out += 1,
            _ => other.push((user, status, body)),
        }
    }
    assert!(other.is_empty(), "unexpected answers: {other:?}");
    assert_eq!(winners.len(), 100);
    assert_eq!(sold_out, 400);

    // GET /metrics agrees with the demo's own counts: every buyer's purchase ran under the
    // lock once (at once or after waiting), and held it once.
    let after = scrape(&instances[1]).await;
    let delta = |name: &str, labels: &[(&str, &str)]| {
        sample(&after, name, labels) - sample(&before, name, labels)
    };
    let acquired = delta(
        "distlock_acquisitions_total",
        &[template[0], ("outcome", "acquired")],
    ) + delta(
        "distlock_acquisitions_total",
        &[template[0], ("outcome", "contended")],
    );
    assert_eq!(acquired, 500.0, "{after}");
    assert_eq!(delta("distlock_hold_seconds_count", &template), 500.0);
    assert_eq!(delta("distlock_wait_seconds_count", &template), 500.0);
    // No rendered key ever becomes a label.
    assert!(!after.contains("seckill:7"), "{after}");

    // No lease was lost. A counter appears at its first increment, so a sample read as 0
    // proves nothing by itself: a lease lost now, under a label of its own, must show in the
    // same scrape beside the purchases' zero.
    let canary = [("template", "seckill-test:canary")];
    lose_a_lease(&server, canary[0].1).await;
    let checked = scrape(&instances[1]).await;
    assert!(
        checked.contains("# TYPE distlock_leases_lost_total counter"),
        "{checked}"
    );
    let lost = |labels: &[(&str, &str)]| {
        sample(&checked, "distlock_leases_lost_total", labels)
            - sample(&before, "distlock_leases_lost_total", labels)
    };
    assert_eq!(lost(&canary), 1.0, "{checked}");
    assert_eq!(lost(&template), 0.0, "{checked}");

    let report: ProductReport = client
        .get(format!("{}/products/7", instances[1]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (report.stock, report.sold, report.oversold, report.buyers),
        (0, 100, 0, 100)
    );

    // One unit per user: a winner trying again is refused.
    let winner = *winners.iter().next().unwrap();
    let again = client
        .post(format!("{}/products/7/buy", instances[0]))
        .json(&serde_json::json!({ "user_id": winner }))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 409);
    let body: BuyResponse = again.json().await.unwrap();
    assert_eq!(body.status, "already_bought");
}

#[tokio::test]
#[allow(clippy::await_holding_lock)] // held for the whole test, to run it alone
async fn malformed_requests_get_4xx_json_errors() {
    let _alone = alone();
    let server = RedisServer::start();
    let base = instance(&server.url()).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let json_post = |path: &str, body: &'static str| {
        client
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body)
    };
    let cases = [
        (
            "unknown product",
            json_post("/products/404/buy", r#"{"user_id": 1}"#),
            404,
        ),
        (
            "malformed JSON",
            json_post("/products/1/buy", r#"{"user_id": "#),
            400,
        ),
        (
            "non-numeric user",
            json_post("/products/1/buy", r#"{"user_id": "ann"}"#),
            422,
        ),
        (
            "non-numeric product",
            json_post("/products/abc/buy", r#"{"user_id": 1}"#),
            400,
        ),
        (
            "negative product",
            json_post("/products/-1/buy", r#"{"user_id": 1}"#),
            400,
        ),
        (
            "missing body",
            client.post(format!("{base}/products/1/buy")),
            415,
        ),
        (
            "bad stock",
            json_post("/products/1", r#"{"stock": -5}"#),
            422,
        ),
        ("unknown route", client.get(format!("{base}/nope")), 404),
        (
            "wrong method",
            client.delete(format!("{base}/products/1")),
            405,
        ),
        (
            "unknown product report",
            client.get(format!("{base}/products/999")),
            404,
        ),
        (
            "unknown product offer",
            client.get(format!("{base}/products/999/offer")),
            404,
        ),
        (
            "unknown product restock",
            json_post(
                "/products/999/restock",
                r#"{"units": 1, "price_cents": 100}"#,
            ),
            404,
        ),
        (
            "bad restock units",
            json_post(
                "/products/1/restock",
                r#"{"units": -1, "price_cents": 100}"#,
            ),
            422,
        ),
        (
            "restock without a price",
            json_post("/products/1/restock", r#"{"units": 1}"#),
            422,
        ),
    ];
    for (what, request, expected) in cases {
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(response.status().as_u16(), expected, "{what}");
        let body: serde_json::Value = response
            .json()
            .await
            .unwrap_or_else(|e| panic!("{what}: body is not JSON: {e}"));
        assert!(body.get("status").is_some(), "{what}: {body}");
    }
}

/// A request on a `lock` instance of its own that stops dead at a [`Pause`] point, as in a GC
/// pause or SIGSTOP: the instance runs on its own thread and current-thread runtime, and the
/// pause blocks that thread, so nothing of it runs (renewal included) until
/// [`Paused::resume`].
struct Paused<T> {
    paused: mpsc::Receiver<()>,
    resume: mpsc::Sender<()>,
    thread: JoinHandle<T>,
}

impl<T: Send + 'static> Paused<T> {
    /// Starts `request` on the instance and returns once it reached `at` and is paused.
    fn start<F, Fut>(redis_url: String, at: Pause, request: F) -> Self
    where
        F: FnOnce(Shop) -> Fut + Send + 'static,
        Fut: Future<Output = T>,
    {
        let (paused_tx, paused) = mpsc::channel();
        let (resume, resume_rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let shop = Shop::connect(&redis_url, Strategy::Lock, "seckill-test:")
                    .await
                    .unwrap();
                let resume_rx = Mutex::new(resume_rx);
                shop.pause_at(at, move || {
                    let _ = paused_tx.send(());
                    let _ = resume_rx
                        .lock()
                        .unwrap()
                        .recv_timeout(Duration::from_secs(60));
                    async {}
                });
                request(shop).await
            })
        });
        let request = Self {
            paused,
            resume,
            thread,
        };
        request
            .paused
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("the request reaches {at:?} and pauses"));
        request
    }

    /// Lets the paused request run on; returns what it came to.
    fn resume(self) -> T {
        let Self { resume, thread, .. } = self;
        resume.send(()).unwrap();
        thread.join().unwrap()
    }
}

/// A `lock` purchase that holds the lock, has read, and is paused before its write.
fn paused_purchase(
    redis_url: String,
    product: u64,
    user: u64,
) -> Paused<Result<Outcome, ShopError>> {
    Paused::start(redis_url, Pause::PurchaseWrite, move |shop| async move {
        shop.purchase(product, user).await
    })
}

/// A paused holder's purchase must fail, not report a sale: refused by the product
/// ([`ShopError::Stale`]), or stopped by the runtime when it notices the lease is gone.
fn assert_refused(late: &Result<Outcome, ShopError>) {
    assert!(
        matches!(
            late,
            Err(ShopError::Stale { .. } | ShopError::Lock(LockError::LeaseLost { .. }))
        ),
        "the paused holder's purchase must fail as stale (or lease lost), got {late:?}"
    );
}

/// A `lock` instance on `server`, on a runtime of the test's, with product 9 in stock twice.
fn lock_shop(server: &RedisServer) -> (tokio::runtime::Runtime, Shop) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let shop = runtime
        .block_on(Shop::connect(
            &server.url(),
            Strategy::Lock,
            "seckill-test:",
        ))
        .unwrap();
    runtime
        .block_on(shop.create(9, CreateProduct::with_stock(2)))
        .unwrap();
    (runtime, shop)
}

/// The `lock` strategy's write is fenced: a holder that stopped running past its lease, while
/// others bought, cannot land its write when it runs again (the lease alone cannot stop it).
#[test]
fn a_holder_paused_past_its_lease_cannot_sell_after_newer_holders_did() {
    let _alone = alone();
    let server = RedisServer::start();
    let (runtime, shop) = lock_shop(&server);

    // User 1's holder read stock 2 and stops dead before writing 1.
    let paused = paused_purchase(server.url(), 9, 1);
    // Its lease (ttl 5 s) lapses in Redis unrenewed; meanwhile another instance sells the two
    // units, each buyer under a newer lease.
    for (user, remaining) in [(2, 1), (3, 0)] {
        let outcome = runtime.block_on(shop.purchase(9, user));
        assert_eq!(
            outcome.unwrap(),
            Outcome::Bought { remaining },
            "user {user}"
        );
    }
    // The paused holder resumes with its write (stock 1, one more sold) on the way.
    let late = paused.resume();

    let report = runtime.block_on(shop.report(9)).unwrap().unwrap();
    assert_eq!(
        (report.stock, report.sold, report.oversold, report.buyers),
        (0, 2, 0, 2),
        "(stock, sold, oversold, buyers) after the paused holder resumed: its late write \
         landed (stock went back up, one unit oversold); it returned {late:?}"
    );
    assert_refused(&late);
}

/// The `lock` strategy's read is fenced too: a newer holder's read already refuses the stale
/// holder, so its write cannot slip in before the newer holder's write.
#[test]
fn a_stale_write_between_a_newer_holders_read_and_write_is_refused() {
    let _alone = alone();
    let server = RedisServer::start();
    let (runtime, shop) = lock_shop(&server);
    // A first sale (the product's `fence` now holds an older token than both holders below).
    let first = runtime.block_on(shop.purchase(9, 0));
    assert_eq!(first.unwrap(), Outcome::Bought { remaining: 1 });

    // User 1's holder read stock 1 and stops dead; its lease lapses; user 2's holder gets the
    // lock, reads stock 1 too, and pauses just before its own write.
    let stale = paused_purchase(server.url(), 9, 1);
    let newer = paused_purchase(server.url(), 9, 2);
    // The stale holder's write comes between the newer holder's read and write: fencing the
    // write alone would let both land (the last unit sold twice), so the read is fenced too.
    let late = stale.resume();
    assert_eq!(newer.resume().unwrap(), Outcome::Bought { remaining: 0 });

    let report = runtime.block_on(shop.report(9)).unwrap().unwrap();
    assert_eq!(
        (report.stock, report.sold, report.oversold, report.buyers),
        (0, 2, 0, 2),
        "(stock, sold, oversold, buyers) after a stale write between a newer holder's read and \
         write; the stale purchase returned {late:?}"
    );
    assert_refused(&late);
}

/// Readers of product 5's offer, each reading in a loop while it is restocked (the harness of
/// the read-write tests below, [`read_during_restocks`]).
const READERS: usize = 32;
/// Restocks of product 5, made one after another by one task.
const RESTOCKS: u64 = 20;
/// How long each reader stays inside its read section (the test's hook), so that readers that
/// may share the section overlap.
const READ_HOLD: Duration = Duration::from_millis(50);
/// How long each restock takes between its two writes (the test's hook), so that the
/// half-written product is there long enough for an unlocked reader to find it.
const RESTOCK_GAP: Duration = Duration::from_millis(20);

/// What the readers saw while the product was restocked.
struct ReadsDuringRestocks {
    /// Every offer a reader was given.
    reads: Vec<Offer>,
    /// The offer each batch was created or restocked with, by batch.
    batches: BTreeMap<u64, Offer>,
    /// The most readers inside their read section at once.
    most_readers: usize,
    /// The most readers inside their read section while a restock was between its two writes.
    readers_during_restock: usize,
    /// The product's counts at the end.
    report: ProductReport,
}

impl ReadsDuringRestocks {
    /// The reads whose price and stock are not those of the batch they name.
    fn half_written(&self) -> Vec<Offer> {
        self.reads
            .iter()
            .filter(|read| self.batches.get(&read.batch) != Some(read))
            .copied()
            .collect()
    }
}

/// Leaves the read section (decrements the count) however the reader's body ends.
struct Inside(Arc<AtomicUsize>);

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs [`READERS`] readers in a loop through two `strategy` instances, each counted inside its
/// read section for [`READ_HOLD`], while one task makes [`RESTOCKS`] restocks of product 5 one
/// after another, each [`RESTOCK_GAP`] long between its two writes.
async fn read_during_restocks(server: &RedisServer, strategy: Strategy) -> ReadsDuringRestocks {
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let during = Arc::new(AtomicUsize::new(0));
    let mut instances = Vec::new();
    for _ in 0..2 {
        let shop = Shop::connect(&server.url(), strategy, "seckill-test:")
            .await
            .unwrap();
        let (reading, most) = (inside.clone(), most.clone());
        shop.pause_at(Pause::OfferRead, move || {
            let (reading, most) = (reading.clone(), most.clone());
            async move {
                let now = reading.fetch_add(1, Ordering::SeqCst) + 1;
                let _leaves = Inside(reading);
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(READ_HOLD).await;
            }
        });
        let (reading, during) = (inside.clone(), during.clone());
        shop.pause_at(Pause::RestockSecondWrite, move || {
            let (reading, during) = (reading.clone(), during.clone());
            async move {
                during.fetch_max(reading.load(Ordering::SeqCst), Ordering::SeqCst);
                tokio::time::sleep(RESTOCK_GAP).await;
                during.fetch_max(reading.load(Ordering::SeqCst), Ordering::SeqCst);
            }
        });
        instances.push(serve(shop).await);
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let created = CreateProduct {
        stock: 10,
        price_cents: 1000,
    };
    let answer = client
        .post(format!("{}/products/5", instances[0]))
        .json(&created)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201);
    let mut batches = BTreeMap::from([(
        0,
        Offer {
            product: 5,
            price_cents: 1000,
            stock: 10,
            batch: 0,
        },
    )]);

    let done = Arc::new(AtomicBool::new(false));
    let mut readers = tokio::task::JoinSet::new();
    for reader in 0..READERS {
        let url = format!("{}/products/5/offer", instances[reader % 2]);
        let (client, done) = (client.clone(), done.clone());
        readers.spawn(async move {
            let mut reads = Vec::new();
            while !done.load(Ordering::SeqCst) {
                let answer = client.get(&url).send().await.unwrap();
                let status = answer.status();
                let body = answer.text().await.unwrap();
                assert_eq!(status, 200, "reader {reader}: {body}");
                reads.push(serde_json::from_str::<Offer>(&body).unwrap());
            }
            reads
        });
    }
    // The readers are in full swing before the first restock, and still after the last.
    tokio::time::sleep(READ_HOLD * 2).await;
    for k in 1..=RESTOCKS {
        let restock = Restock {
            units: u32::try_from(k).unwrap(),
            price_cents: 1000 + 10 * k,
        };
        let answer = client
            .post(format!(
                "{}/products/5/restock",
                instances[(k % 2) as usize]
            ))
            .json(&restock)
            .send()
            .await
            .unwrap();
        let status = answer.status();
        let body = answer.text().await.unwrap();
        assert_eq!(status, 200, "restock {k}: {body}");
        let offer: Offer = serde_json::from_str(&body).unwrap();
        assert_eq!(offer.price_cents, restock.price_cents, "restock {k}");
        assert!(
            batches.insert(offer.batch, offer).is_none(),
            "restock {k} started batch {} again",
            offer.batch
        );
    }
    tokio::time::sleep(READ_HOLD * 2).await;
    done.store(true, Ordering::SeqCst);
    let mut reads = Vec::new();
    while let Some(joined) = readers.join_next().await {
        reads.extend(joined.unwrap());
    }
    let report = client
        .get(format!("{}/products/5", instances[1]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    ReadsDuringRestocks {
        reads,
        batches,
        most_readers: most.load(Ordering::SeqCst),
        readers_during_restock: during.load(Ordering::SeqCst),
        report,
    }
}

/// The read path takes the product's key shared and the restock takes it exclusively: readers
/// run side by side, none runs while a restock is between its two writes, and every read sees
/// the price and stock of one batch, never the new price beside the old stock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // held for the whole test, to run it alone
async fn readers_share_the_product_and_never_see_a_half_written_restock() {
    let _alone = alone();
    let server = RedisServer::start();
    let run = read_during_restocks(&server, Strategy::Lock).await;

    let half_written = run.half_written();
    assert!(
        half_written.is_empty(),
        "{} of {} reads saw a half-written product, e.g. {:?} (batches: {:?})",
        half_written.len(),
        run.reads.len(),
        &half_written[..half_written.len().min(5)],
        run.batches
    );
    assert_eq!(
        run.readers_during_restock, 0,
        "readers were inside their section while a restock was between its writes"
    );
    // Readers held the section together: one reader at a time would be 1.
    assert!(
        run.most_readers >= READERS / 4,
        "at most {} of {READERS} readers were inside the section at once",
        run.most_readers
    );
    // The reads interleaved with the restocks: they saw the product before, between and after.
    let seen: BTreeSet<u64> = run.reads.iter().map(|read| read.batch).collect();
    assert!(
        seen.contains(&0) && seen.contains(&RESTOCKS) && seen.len() > 2,
        "batches read: {seen:?}"
    );
    let added: i64 = (1..=RESTOCKS).map(|k| k as i64).sum();
    assert_eq!(
        (run.report.stock, run.report.restocked, run.report.oversold),
        (10 + added, added, 0)
    );
}

/// The check above can fail: with no lock (the `none` strategy), readers run during a restock
/// and some see the new batch's price beside the old batch's stock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // held for the whole test, to run it alone
async fn without_the_lock_readers_see_half_written_products() {
    let _alone = alone();
    let server = RedisServer::start();
    let run = read_during_restocks(&server, Strategy::None).await;
    assert!(
        !run.half_written().is_empty(),
        "none of {} unlocked reads saw a half-written product",
        run.reads.len()
    );
    assert!(run.readers_during_restock > 0);
}

/// Restocks between purchases, both holding the product's key exclusively: nothing is oversold
/// and no unit is lost (every unit created or restocked is either sold or in stock).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // held for the whole test, to run it alone
async fn restocks_between_purchases_neither_oversell_nor_lose_a_unit() {
    let _alone = alone();
    let server = RedisServer::start();
    let instances = [instance(&server.url()).await, instance(&server.url()).await];
    let client = reqwest::Client::new();
    let created = client
        .post(format!("{}/products/6", instances[0]))
        .json(&CreateProduct::with_stock(10))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);

    let mut buyers = tokio::task::JoinSet::new();
    for user in 0..200_u64 {
        let url = format!("{}/products/6/buy", instances[(user % 2) as usize]);
        let client = client.clone();
        buyers.spawn(async move {
            let response = client
                .post(url)
                .json(&serde_json::json!({ "user_id": user }))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body: BuyResponse = response.json().await.unwrap();
            (status, body)
        });
    }
    for k in 1..=10_u64 {
        let answer = client
            .post(format!(
                "{}/products/6/restock",
                instances[(k % 2) as usize]
            ))
            .json(&Restock {
                units: 10,
                price_cents: 100 + k,
            })
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "restock {k}");
    }
    let (mut bought, mut other) = (0, Vec::new());
    while let Some(joined) = buyers.join_next().await {
        match joined.unwrap() {
            (200, body) if body.status == "bought" => bought += 1,
            (409, body) if body.status == "sold_out" => {}
            answer => other.push(answer),
        }
    }
    assert!(other.is_empty(), "unexpected answers: {other:?}");

    let report: ProductReport = client
        .get(format!("{}/products/6", instances[1]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            report.sold,
            report.buyers,
            report.restocked,
            report.oversold
        ),
        (bought, bought as u64, 100, 0)
    );
    assert_eq!(report.stock + report.sold, 110, "{report:?}");
}

/// A reader that stops dead inside its section past its lease, while a restock takes the key
/// and writes its price, is refused when it runs again (the runtime finds its lease lost, or the
/// product's fence refuses the read), instead of reading the new price beside the old stock.
#[test]
fn a_reader_paused_past_its_lease_cannot_read_a_half_written_restock() {
    let _alone = alone();
    let server = RedisServer::start();
    let (runtime, shop) = lock_shop(&server);
    let before = runtime.block_on(shop.offer(9)).unwrap().unwrap();

    // The reader holds the key shared and stops dead before reading.
    let reader = Paused::start(server.url(), Pause::OfferRead, |shop| async move {
        shop.offer(9).await
    });
    // Its lease (ttl 5 s) lapses unrenewed; a restock then takes the key, writes the new price
    // and stops dead before its second write.
    let restock = Restock {
        units: 3,
        price_cents: 250,
    };
    let restocking = Paused::start(
        server.url(),
        Pause::RestockSecondWrite,
        move |shop| async move { shop.restock(9, restock).await },
    );
    let late = reader.resume();
    assert!(
        matches!(
            late,
            Err(ShopError::Stale { .. } | ShopError::Lock(LockError::LeaseLost { .. }))
        ),
        "the paused reader must be refused (stale, or lease lost), got {late:?} (the product \
         before the restock: {before:?})"
    );
    let restocked = restocking.resume().unwrap().unwrap();
    assert_eq!(
        (restocked.price_cents, restocked.stock, restocked.batch),
        (250, before.stock + 3, before.batch + 1)
    );
    assert_eq!(runtime.block_on(shop.offer(9)).unwrap(), Some(restocked));
}

/// The read and the restock are fenced: once a newer lease has used the product (its `fence`
/// holds a greater token than any lease this test takes), both are refused and the restock
/// writes nothing; a read that goes through records nothing.
#[test]
fn reads_and_restocks_are_refused_once_a_newer_lease_used_the_product() {
    let _alone = alone();
    let server = RedisServer::start();
    let (runtime, shop) = lock_shop(&server);
    let product = "seckill-test:product:9";

    let before = runtime.block_on(shop.offer(9)).unwrap().unwrap();
    // Readers do not exclude one another: a read leaves no token behind.
    assert_eq!(server.command(&["HEXISTS", product, "fence"]), ":0\r\n");

    // A token above every lease's (they are about 2^51: microseconds of Redis time).
    let newest = 1_u64 << 52;
    server.command(&["HSET", product, "fence", &newest.to_string()]);
    let read = runtime.block_on(shop.offer(9));
    assert!(
        matches!(read, Err(ShopError::Stale { newest: n, .. }) if n == newest),
        "{read:?}"
    );
    let restock = Restock {
        units: 3,
        price_cents: 250,
    };
    let refused = runtime.block_on(shop.restock(9, restock));
    assert!(
        matches!(refused, Err(ShopError::Stale { newest: n, .. }) if n == newest),
        "{refused:?}"
    );

    // Nothing of the refused restock was written.
    server.command(&["HDEL", product, "fence"]);
    assert_eq!(runtime.block_on(shop.offer(9)).unwrap(), Some(before));
}
