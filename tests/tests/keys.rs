//! Key layout: every Redis key and the channel of one lock hash to one Redis Cluster slot, and a
//! key template may choose a slot on purpose; a caller's values never can.

use std::time::Duration;

use distlock_runtime::{current_lease, distributed_lock, LockError, LockManager};
use distlock_tests::RedisServer;

/// A Redis Cluster node (no slots assigned): enough to ask `CLUSTER KEYSLOT`. Its cluster
/// config file (in the temp dir) goes with it.
struct ClusterNode {
    server: Option<RedisServer>,
    config: std::path::PathBuf,
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        // Stopped first: a server may write its config file as it exits.
        drop(self.server.take());
        let _ = std::fs::remove_file(&self.config);
    }
}

fn cluster_node() -> ClusterNode {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let name = format!("distlock-keys-{}-{nanos}.conf", std::process::id());
    let server =
        RedisServer::start_with(&["--cluster-enabled", "yes", "--cluster-config-file", &name]);
    ClusterNode {
        server: Some(server),
        config: std::env::temp_dir().join(name),
    }
}

/// The cluster slot of `key`, as Redis computes it.
fn slot(node: &ClusterNode, key: &str) -> String {
    let server = node.server.as_ref().expect("running");
    let answer = server.command(&["CLUSTER", "KEYSLOT", key]);
    assert!(answer.starts_with(':'), "{answer}");
    answer.trim().to_owned()
}

#[tokio::test]
async fn every_key_and_the_channel_of_a_lock_share_its_slot() {
    let server = RedisServer::start();
    let node = cluster_node();
    let locks = server.manager();
    // A fair holder and a queued fair waiter: the lock, its counter, the queue and its entries.
    let held = locks.lock("order:42").fair(true).acquire().await.unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .lock("order:42")
                .fair(true)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        }
    });
    let conn = server.client().await;
    distlock_tests::until_queued(&conn, "order:42", 1).await;
    let mut keys: Vec<String> = server
        .command(&["KEYS", "distlock:*"])
        .lines()
        .filter(|line| line.starts_with("distlock:"))
        .map(str::to_owned)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "distlock:fence:{order:42}",
            "distlock:lock:{order:42}",
            "distlock:queue:{order:42}",
            "distlock:waiters:{order:42}",
        ]
    );
    // The release channel is the lock key's name.
    let channel = locks.redis_key("order:42");
    let expected = slot(&node, &channel);
    for key in &keys {
        assert_eq!(slot(&node, key), expected, "{key}");
    }
    // Another lock hashes elsewhere (these two differ; most do).
    assert_ne!(slot(&node, &locks.redis_key("order:43")), expected);
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
}

#[distributed_lock("{{user:{id}}}:wallet", manager = locks)]
async fn wallet(locks: &LockManager, id: &str) -> Result<String, LockError> {
    Ok(current_lease().unwrap().keys()[0].clone())
}

#[distributed_lock("{{user:{id}}}:cart", manager = locks)]
async fn cart(locks: &LockManager, id: &str) -> Result<String, LockError> {
    Ok(current_lease().unwrap().keys()[0].clone())
}

#[tokio::test]
async fn a_template_may_choose_a_slot_but_a_value_never_does() {
    let server = RedisServer::start();
    let node = cluster_node();
    let locks = server.manager();
    let wallet_key = wallet(&locks, "7").await.unwrap();
    let cart_key = cart(&locks, "7").await.unwrap();
    assert_eq!(wallet_key, "{user:7}:wallet");
    assert_eq!(cart_key, "{user:7}:cart");
    // The template's own braces make the tag: one user's wallet and cart share a slot...
    let wallet_slot = slot(&node, &locks.redis_key(&wallet_key));
    assert_eq!(wallet_slot, slot(&node, &locks.redis_key(&cart_key)));
    // ...so both can be locked together, in one atomic script.
    let both = locks
        .lock_all([wallet_key.clone(), cart_key.clone()])
        .acquire()
        .await;
    both.unwrap().release().await.unwrap();
    // Another user's do not (these two differ).
    let other = wallet(&locks, "8").await.unwrap();
    assert_ne!(slot(&node, &locks.redis_key(&other)), wallet_slot);
    // A value with braces is escaped: it cannot pick the slot of another user's keys.
    let forged = wallet(&locks, "7}:x{").await.unwrap();
    assert_eq!(forged, "{user:7%7D%3Ax%7B}:wallet");
    assert_ne!(slot(&node, &locks.redis_key(&forged)), wallet_slot);
}
