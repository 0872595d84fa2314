//! The seckill service against a real redis-server: over HTTP (two instances, each with its own
//! lock manager, 500 buyers, stock 100), and the `lock` strategy's fencing against a holder
//! paused past its lease.

use std::collections::HashSet;
use std::sync::mpsc;
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use distlock_examples::seckill::{BuyResponse, Outcome, ProductReport, Shop, ShopError, Strategy};
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

/// Starts an instance on a loopback port; returns its base URL.
async fn instance(redis_url: &str) -> String {
    let shop = Shop::connect(redis_url, Strategy::Lock, "seckill-test:")
        .await
        .unwrap();
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

/// A `lock` purchase on an instance of its own, whose holder stops dead between its checks and
/// its write, as in a GC pause or SIGSTOP: the instance runs on its own thread and
/// current-thread runtime, and the pause blocks that thread, so nothing of it runs (renewal
/// included) until [`PausedPurchase::resume`].
struct PausedPurchase {
    paused: mpsc::Receiver<()>,
    resume: mpsc::Sender<()>,
    thread: JoinHandle<Result<Outcome, ShopError>>,
}

impl PausedPurchase {
    /// Starts the purchase and returns once it holds the lock, has read, and is paused.
    fn start(redis_url: String, product: u64, user: u64) -> Self {
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
                shop.pause_before_write(move || {
                    let _ = paused_tx.send(());
                    let _ = resume_rx
                        .lock()
                        .unwrap()
                        .recv_timeout(Duration::from_secs(60));
                });
                shop.purchase(product, user).await
            })
        });
        let purchase = Self {
            paused,
            resume,
            thread,
        };
        purchase
            .paused
            .recv_timeout(Duration::from_secs(20))
            .expect("the purchase reaches its write and pauses");
        purchase
    }

    /// Lets the paused holder run on; returns what its purchase came to.
    fn resume(self) -> Result<Outcome, ShopError> {
        let Self { resume, thread, .. } = self;
        resume.send(()).unwrap();
        thread.join().unwrap()
    }
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
    runtime.block_on(shop.create(9, 2)).unwrap();
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
    let paused = PausedPurchase::start(server.url(), 9, 1);
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
    let stale = PausedPurchase::start(server.url(), 9, 1);
    let newer = PausedPurchase::start(server.url(), 9, 2);
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
