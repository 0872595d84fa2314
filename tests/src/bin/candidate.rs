//! A separate OS process of election candidates, for the election tests.
//!
//! `candidate URL NAME LABEL TTL_MS HOLD_MS [COUNT]`: COUNT candidates (default 1), tasks of one
//! manager labelled LABEL, each serving the election NAME with `Election::run` and a ttl of
//! TTL_MS. Prints `ready` once they are started. A candidate that leads prints
//! `lead FENCING_TOKEN`, appends the token to the list `office:{NAME}:terms` and writes it to
//! `office:{NAME}` (the "storage" the leader works on), then, every 20 ms for HOLD_MS (for ever
//! when 0), reads `office:{NAME}` back: finding another leader's token there while its own term
//! is still valid means two valid terms at once, and adds one to `office:{NAME}:violations`.
//! After HOLD_MS its function returns, which resigns the term.

use std::io::Write;
use std::time::Duration;

use distlock_runtime::{LockManager, Term};
use redis::AsyncCommands;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// One term in office (see the module docs).
async fn lead(
    mut conn: redis::aio::MultiplexedConnection,
    name: &str,
    hold: Duration,
    term: Term,
) -> Result<(), redis::RedisError> {
    let token = term.fencing_token();
    say(&format!("lead {token}"));
    let office = format!("office:{{{name}}}");
    conn.rpush::<_, _, ()>(format!("{office}:terms"), token)
        .await?;
    conn.set::<_, _, ()>(&office, token).await?;
    let started = tokio::time::Instant::now();
    while hold.is_zero() || started.elapsed() < hold {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let found: Option<u64> = conn.get(&office).await?;
        if found != Some(token) && !term.is_lost() {
            conn.incr::<_, _, ()>(format!("{office}:violations"), 1)
                .await?;
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, name, label, ttl_ms, hold_ms, rest @ ..] = args.as_slice() else {
        return Err("usage: candidate URL NAME LABEL TTL_MS HOLD_MS [COUNT]".into());
    };
    let count: usize = rest.first().map_or(Ok(1), |c| c.parse())?;
    let ttl = Duration::from_millis(ttl_ms.parse()?);
    let hold = Duration::from_millis(hold_ms.parse()?);
    let locks = LockManager::builder()
        .url(url.as_str())
        .holder_label(label.as_str())
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()?;
    let conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let election = locks.election(name.as_str()).ttl(ttl);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..count {
        let (election, conn, name) = (election.clone(), conn.clone(), name.clone());
        tasks.spawn(async move {
            election
                .run(|term| {
                    let (conn, name) = (conn.clone(), name.clone());
                    async move {
                        if let Err(error) = lead(conn, &name, hold, term).await {
                            say(&format!("error {error}"));
                        }
                    }
                })
                .await
        });
    }
    say("ready");
    if let Some(ended) = tasks.join_next().await {
        say(&format!("stopped {ended:?}"));
    }
    Ok(())
}
