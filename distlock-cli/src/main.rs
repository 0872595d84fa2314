//! `distlock`: the operator's command-line tool for distlock's locks.
//!
//! ```text
//! cargo install --path distlock-cli
//! export REDIS_URL=redis://127.0.0.1:6379
//! distlock inspect order:42 order:43
//! distlock list 'order:*'
//! distlock release order:42 --force
//! distlock leader scheduler mailer
//! distlock --cluster redis://10.0.0.5:7000 --cluster redis://10.0.0.6:7000 list --json
//! distlock --url redis://127.0.0.1:6379 watch order:42 --election scheduler >> locks.log
//! distlock --url redis://127.0.0.1:6379 top
//! ```
//!
//! It connects the way a service's `LockManager` does (one server, a cluster, Sentinel or a
//! quorum; the same key prefix), prints a table, or one JSON document with `--json`. Exit
//! status: 0 on success, 1 when Redis could not be asked, 2 on bad arguments.
//!
//! Every option can come from the environment instead (`--help` names each variable; a flag
//! beats its variable): `REDIS_URL` for `--url`, read only when no topology is given otherwise,
//! and `DISTLOCK_CLUSTER`, `DISTLOCK_SENTINEL`, `DISTLOCK_SENTINEL_URLS`, `DISTLOCK_QUORUM`
//! (URLs comma-separated), `DISTLOCK_PREFIX`, `DISTLOCK_TLS_CA`, `DISTLOCK_TLS_CERT`,
//! `DISTLOCK_TLS_KEY`, `DISTLOCK_TIMEOUT_MS`. A URL given with `--url` or `REDIS_URL` is asked
//! what it is (one `HELLO`): a Redis Cluster node is used as a seed of its cluster, a Sentinel
//! that monitors one primary as that primary's Sentinel (several: refused, naming them), and a
//! line on stderr says so. See `docs/operations.md`.
//!
//! Two commands stay and follow changes:
//!
//! - `watch KEY...` prints one line per change of each lock, as it happens (read every
//!   `--interval-ms`, 150 ms by default): `taken`, `released` (freed before its expiry),
//!   `expired` (gone at its expiry), `handed over` (a new holder without a free moment seen),
//!   holders `joined`/`left` (shared keys, permits), the fair queue's length, and for an
//!   election (`election:NAME`, or `--election NAME`) its leader. Each line starts with a UTC
//!   timestamp and the key, and is flushed at once; `--json` prints one object per line. While
//!   Redis cannot be read, one line says so, and one when it answers again.
//! - `top` is a terminal UI of every held lock (mode, holders and their labels, ttl, fencing
//!   token, the fair queue in order) and every election's leader, read about once a second:
//!   `s` cycles the sort column, `r` reverses it, `/` types a key filter (a glob such as
//!   `order:*`, or any part of a key; Enter applies, Esc cancels), `q` or Ctrl-C quits. An
//!   outage shows in the status line and the screen recovers when Redis answers.

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use distlock_runtime::{LeaderInfo, LockError, LockInfo, LockManager, LockMode};
use serde::Serialize;

mod connect;
mod reading;
mod top;
mod watch;

#[derive(Parser)]
#[command(
    name = "distlock",
    version,
    about = "Who holds distlock's locks, who leads its elections, and breaking a lock by hand"
)]
struct Cli {
    #[command(flatten)]
    connection: connect::Connection,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Who holds each key, for how long, with which fencing token, and how many wait.
    Inspect {
        /// Lock keys, as the services name them (`order:42`).
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// The locks held now whose key matches a glob pattern (found with SCAN, never KEYS).
    List {
        /// A glob over lock keys: `order:*`, `*` (the default).
        #[arg(default_value = "*")]
        pattern: String,
    },
    /// Delete a lock whoever holds it. Dangerous: the holder may still be running, and learns
    /// of the loss only at its next renewal; only fencing tokens protect the storage.
    Release {
        /// The lock key.
        key: String,
        /// Required: says you mean it.
        #[arg(long)]
        force: bool,
    },
    /// Who leads each election, in which term (its fencing token), for how long, and how many
    /// candidates queue.
    Leader {
        /// Election names, as the services name them (`scheduler`, not `election:scheduler`).
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Print one line per change of each lock (taken, released, expired, handed over, holders
    /// joining or leaving) or election leader, as it happens, until stopped.
    Watch {
        /// Lock keys (`order:42`); an election's as `election:NAME`.
        keys: Vec<String>,
        /// An election to follow by name (repeat for more): its key `election:NAME`.
        #[arg(long = "election", value_name = "NAME")]
        elections: Vec<String>,
        /// How often each key is read, in milliseconds (one script call per key each time).
        #[arg(long, default_value_t = 150, value_parser = clap::value_parser!(u64).range(10..))]
        interval_ms: u64,
    },
    /// A terminal UI of every held lock and every election's leader, read about once a second.
    Top {
        /// How often every lock is read, in milliseconds.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..))]
        interval_ms: u64,
    },
}

/// One lock, as printed.
#[derive(Serialize)]
struct Row {
    key: String,
    held: bool,
    /// `exclusive`, `shared` or `permits`.
    mode: Option<&'static str>,
    /// The semaphore's permits, for `permits`.
    permits: Option<u32>,
    /// How many leases hold it.
    holders: Option<usize>,
    /// The election's name, for a held `election:NAME` key (its holder leads it).
    election: Option<String>,
    /// Every holder's label, where set.
    holder_labels: Vec<String>,
    holder: Option<String>,
    token_prefix: Option<String>,
    remaining_ms: Option<u64>,
    fencing_token: Option<u64>,
    waiters: Option<usize>,
}

impl Row {
    fn held(info: &LockInfo) -> Self {
        Self {
            key: info.key.clone(),
            held: true,
            mode: Some(reading::mode_name(info.mode)),
            permits: match info.mode {
                LockMode::Permits(n) => Some(n),
                _ => None,
            },
            holders: Some(info.holders),
            election: info.key.strip_prefix(ELECTION_KEY).map(str::to_owned),
            holder_labels: info.holder_labels.clone(),
            holder: info.holder.clone(),
            token_prefix: Some(info.token_prefix.clone()),
            remaining_ms: Some(millis(info.remaining)),
            fencing_token: Some(info.fencing_token),
            waiters: Some(info.waiters),
        }
    }

    fn free(key: &str) -> Self {
        Self {
            key: key.to_owned(),
            held: false,
            mode: None,
            permits: None,
            holders: None,
            election: None,
            holder_labels: Vec::new(),
            holder: None,
            token_prefix: None,
            remaining_ms: None,
            fencing_token: None,
            waiters: None,
        }
    }
}

/// What the runtime puts before an election's name to make its lock key
/// ([`Election::key`](distlock_runtime::Election::key)).
const ELECTION_KEY: &str = "election:";

/// One election, as printed.
#[derive(Serialize)]
struct LeaderRow {
    election: String,
    /// Whether anyone leads it.
    led: bool,
    /// The leader's holder label, where set.
    label: Option<String>,
    token_prefix: Option<String>,
    /// The term's fencing token.
    fencing_token: Option<u64>,
    remaining_ms: Option<u64>,
    /// Candidates queued to lead next.
    candidates: Option<usize>,
}

impl LeaderRow {
    fn led(info: &LeaderInfo) -> Self {
        Self {
            election: info.election.clone(),
            led: true,
            label: info.label.clone(),
            token_prefix: Some(info.token_prefix.clone()),
            fencing_token: Some(info.fencing_token),
            remaining_ms: Some(millis(info.remaining)),
            candidates: Some(info.candidates),
        }
    }

    fn unled(name: &str) -> Self {
        Self {
            election: name.to_owned(),
            led: false,
            label: None,
            token_prefix: None,
            fencing_token: None,
            remaining_ms: None,
            candidates: None,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    // The matches too: they tell an option given as a flag from one read from the environment.
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let outcome = match connect::manager(&cli.connection, &matches).await {
        Ok(locks) => run(&cli, &locks).await,
        Err(failure) => Err(failure),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("distlock: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Redis(error)) => {
            eprintln!("distlock: {error}");
            ExitCode::FAILURE
        }
    }
}

enum Failure {
    Usage(String),
    Redis(LockError),
}

impl From<LockError> for Failure {
    fn from(error: LockError) -> Self {
        Self::Redis(error)
    }
}

async fn run(cli: &Cli, locks: &LockManager) -> Result<(), Failure> {
    match &cli.command {
        Command::Inspect { keys } => {
            let mut rows = Vec::with_capacity(keys.len());
            for key in keys {
                rows.push(match locks.inspect(key).await? {
                    Some(info) => Row::held(&info),
                    None => Row::free(key),
                });
            }
            print_rows(cli.json, &rows);
        }
        Command::List { pattern } => {
            let rows: Vec<Row> = locks
                .held_locks(pattern)
                .await?
                .iter()
                .map(Row::held)
                .collect();
            print_rows(cli.json, &rows);
        }
        Command::Release { key, force } => {
            if !force {
                return Err(Failure::Usage(format!(
                    "refusing to release {key:?} without --force: its holder may still be \
                     running, and another caller could then run beside it"
                )));
            }
            let released = locks.force_release(key).await?;
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({ "key": key, "released": released })
                );
            } else if released {
                println!("released {key}");
            } else {
                println!("{key} was not held");
            }
        }
        Command::Leader { names } => {
            let mut rows = Vec::with_capacity(names.len());
            for name in names {
                rows.push(match locks.election(name.as_str()).leader().await? {
                    Some(info) => LeaderRow::led(&info),
                    None => LeaderRow::unled(name),
                });
            }
            print_leaders(cli.json, &rows);
        }
        Command::Watch {
            keys,
            elections,
            interval_ms,
        } => {
            let mut keys = keys.clone();
            keys.extend(
                elections
                    .iter()
                    .map(|name| locks.election(name.as_str()).key()),
            );
            if keys.is_empty() {
                return Err(Failure::Usage(
                    "say what to watch: lock keys, or --election NAME".to_owned(),
                ));
            }
            let options = watch::Options {
                keys,
                every: Duration::from_millis(*interval_ms),
                json: cli.json,
            };
            watch::run(locks, options).await?;
        }
        Command::Top { interval_ms } => {
            top::run(locks, Duration::from_millis(*interval_ms))
                .await
                .map_err(Failure::Usage)?;
        }
    }
    Ok(())
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `1.5s`, as the tables show a remaining ttl.
fn seconds(ms: u64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

fn print_rows(json: bool, rows: &[Row]) {
    if json {
        println!(
            "{}",
            serde_json::to_string(rows).unwrap_or_else(|_| "[]".to_owned())
        );
        return;
    }
    if rows.is_empty() {
        println!("no locks held");
        return;
    }
    let width = rows.iter().map(|r| r.key.len()).max().unwrap_or(3).max(3);
    println!(
        "{:<width$}  {:<10}  {:>7}  {:>10}  {:>18}  {:>7}  {:<8}  holder",
        "key", "mode", "holders", "remaining", "fencing token", "waiters", "token"
    );
    for row in rows {
        if !row.held {
            println!("{:<width$}  {:>10}", row.key, "free");
            continue;
        }
        let remaining = row.remaining_ms.map_or_else(String::new, seconds);
        let mode = match (row.mode, row.permits, &row.election) {
            (_, _, Some(_)) => "election".to_owned(),
            (Some("permits"), Some(n), None) => format!("{n} permits"),
            (mode, _, None) => mode.unwrap_or("").to_owned(),
        };
        // A shared key or a semaphore: every holder's label, the first holder's otherwise.
        let holder = if row.holder_labels.len() > 1 {
            row.holder_labels.join(",")
        } else {
            row.holder.clone().unwrap_or_else(|| "-".to_owned())
        };
        println!(
            "{:<width$}  {:<10}  {:>7}  {:>10}  {:>18}  {:>7}  {:<8}  {}",
            row.key,
            mode,
            row.holders.unwrap_or(0),
            remaining,
            row.fencing_token.unwrap_or(0),
            row.waiters.unwrap_or(0),
            row.token_prefix.as_deref().unwrap_or(""),
            holder,
        );
    }
}

fn print_leaders(json: bool, rows: &[LeaderRow]) {
    if json {
        println!(
            "{}",
            serde_json::to_string(rows).unwrap_or_else(|_| "[]".to_owned())
        );
        return;
    }
    let width = rows
        .iter()
        .map(|r| r.election.len())
        .max()
        .unwrap_or(8)
        .max(8);
    println!(
        "{:<width$}  {:>10}  {:>18}  {:>10}  {:<8}  leader",
        "election", "remaining", "fencing token", "candidates", "token"
    );
    for row in rows {
        if !row.led {
            println!("{:<width$}  {:>10}", row.election, "no leader");
            continue;
        }
        println!(
            "{:<width$}  {:>10}  {:>18}  {:>10}  {:<8}  {}",
            row.election,
            row.remaining_ms.map_or_else(String::new, seconds),
            row.fencing_token.unwrap_or(0),
            row.candidates.unwrap_or(0),
            row.token_prefix.as_deref().unwrap_or(""),
            row.label.as_deref().unwrap_or("-"),
        );
    }
}
