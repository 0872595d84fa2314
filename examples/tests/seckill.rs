//! The seckill service over HTTP, against a real redis-server: two instances, each with its own
//! lock manager, 500 buyers, stock 100.

use std::collections::HashSet;
use std::time::Duration;

use distlock_examples::seckill::{BuyResponse, ProductReport, Shop, Strategy};
use distlock_tests::RedisServer;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_hundred_buyers_two_instances_exactly_one_hundred_sold() {
    let server = RedisServer::start();
    let instances = [instance(&server.url()).await, instance(&server.url()).await];
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
async fn malformed_requests_get_4xx_json_errors() {
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
