//! A job scheduler that ticks only on the leader: `cargo run --example leader -- --demo`.
//!
//! `--name a` runs one instance: it campaigns for the election `scheduler` with
//! [`Election::run`], and while it leads it ticks every 500 ms (`tick N by a (term T)`, T the
//! term's fencing token). It says when it starts leading and when it loses the term; Ctrl-C (or
//! SIGTERM) resigns the term, which hands it at once to the next candidate. Start it in three
//! terminals with the same `REDIS_URL` (or `--redis-url`; one of the two is required, since
//! the instances must share a Redis).
//!
//! `--demo` tells the whole story in one command: it starts a throwaway `redis-server` (unless
//! `REDIS_URL` is set), three instances of this program named a, b and
//! c, and follows the election with [`Election::watch`]. Once one leads and the other two
//! queue, it kills the leader with SIGKILL (no release: its term has to expire), prints who took
//! over and how long after the kill, then asks the new leader to resign (by closing its stdin)
//! and prints the immediate hand-off to the third. It checks that the failover took at most
//! ttl + ttl/3 (the ttl plus one renewal interval) and the hand-off under a second, stops
//! everything, and exits non-zero if either check failed.

use std::collections::BTreeMap;
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{ArgGroup, Parser};
use distlock_examples::local_redis::LocalRedis;
use distlock_runtime::{Election, LockManager, Term};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, watch, Notify};

#[derive(Parser)]
#[command(about = "A scheduler that ticks only on the leader of an election")]
#[command(group(ArgGroup::new("mode").required(true).args(["name", "demo"])))]
struct Cli {
    /// Run one instance under this name (its holder label).
    #[arg(long)]
    name: Option<String>,
    /// Start Redis and three instances, kill the leader, then have the next one resign.
    #[arg(long)]
    demo: bool,
    /// Redis URL (default: REDIS_URL; for the demo, else a throwaway redis-server; instances
    /// must share one, so an instance needs one of the two).
    #[arg(long)]
    redis_url: Option<String>,
    /// Key prefix of the election (the demo adds its process id).
    #[arg(long, default_value = "leader-demo:")]
    prefix: String,
    /// The term's ttl in milliseconds: a dead leader is replaced within it plus a third.
    #[arg(long, default_value_t = 3000)]
    ttl_ms: u64,
    /// Resign and exit when stdin closes (how the demo stops an instance).
    #[arg(long, hide = true)]
    until_stdin_closes: bool,
}

/// The election every instance campaigns in.
const ELECTION: &str = "scheduler";
/// How often the leader runs the job.
const TICK: Duration = Duration::from_millis(500);
/// The demo's names for its three instances.
const NAMES: [&str; 3] = ["a", "b", "c"];
/// The longest hand-off the demo accepts after asking a leader to resign.
const HANDOFF_LIMIT: Duration = Duration::from_secs(1);

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "distlock_runtime=warn".into()),
        )
        .init();
    let cli = Cli::parse();
    let ttl = Duration::from_millis(cli.ttl_ms);
    let outcome = match &cli.name {
        Some(name) => instance(&cli, name, ttl).await,
        None => demo(&cli, ttl).await,
    };
    match outcome {
        Ok(code) => code,
        Err(message) => {
            eprintln!("leader: {message}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One instance

/// Serves as a candidate until stopped; a stop while leading resigns first.
async fn instance(cli: &Cli, name: &str, ttl: Duration) -> Result<ExitCode, String> {
    // Kept alive for the instance's life when it is a throwaway server.
    let (url, _redis) = match &cli.redis_url {
        Some(url) => (url.clone(), None),
        None => {
            let redis = LocalRedis::shared()?;
            println!("{name}: Redis: {}", redis.origin);
            (redis.url.clone(), Some(redis))
        }
    };
    let locks = LockManager::builder()
        .url(url)
        .prefix(cli.prefix.clone())
        .holder_label(name)
        .build()
        .map_err(|e| e.to_string())?;
    let election = locks.election(ELECTION).ttl(ttl);
    println!(
        "{name} campaigns for {ELECTION:?} (ttl {ttl:?}, a tick every {TICK:?} while it leads)"
    );

    let (stop_tx, stop) = watch::channel(false);
    let shared = Arc::new(Shared {
        name: name.into(),
        stop,
        ticks: AtomicU64::new(0),
        leading: AtomicBool::new(false),
        resigned: Notify::new(),
    });
    let serve = {
        let shared = Arc::clone(&shared);
        async move { election.run(|term| lead(Arc::clone(&shared), term)).await }
    };
    tokio::pin!(serve);
    tokio::select! {
        outcome = &mut serve => {
            let Err(error) = outcome;
            return Err(format!("{name} cannot campaign: {error}"));
        }
        () = stop_requested(cli.until_stdin_closes) => {}
    }
    let _ = stop_tx.send(true);
    if shared.leading.load(Ordering::SeqCst) {
        // The leader's future resigns; keep `run` polled until it has.
        tokio::select! {
            biased;
            () = shared.resigned.notified() => {}
            () = tokio::time::sleep(ttl) => println!("{name} could not resign in time; its term expires"),
            _ = &mut serve => {}
        }
    }
    println!("{name} stops");
    Ok(ExitCode::SUCCESS)
}

/// What an instance's leader futures share with its main task.
struct Shared {
    name: Arc<str>,
    /// Becomes true when the instance is asked to stop.
    stop: watch::Receiver<bool>,
    /// Ticks run by this instance, over all its terms.
    ticks: AtomicU64,
    leading: AtomicBool,
    resigned: Notify,
}

/// One term as leader: ticks until the term is lost (then `run` drops this future, and
/// [`Leading`] says so) or the instance is asked to stop (then it resigns).
async fn lead(shared: Arc<Shared>, term: Term) {
    let who = &shared.name;
    let token = term.fencing_token();
    println!("{who} leads (term {token})");
    let mut leading = Leading {
        shared: &shared,
        token,
        resigning: false,
    };
    shared.leading.store(true, Ordering::SeqCst);
    let mut stop = shared.stop.clone();
    let mut every = tokio::time::interval(TICK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => break,
            _ = every.tick() => {
                // The job. A real one would hand `token` to whatever it writes, so that a
                // leader that lost its term unawares cannot overwrite its successor's work.
                let n = shared.ticks.fetch_add(1, Ordering::SeqCst) + 1;
                println!("tick {n} by {who} (term {token})");
            }
        }
    }
    leading.resigning = true;
    match term.resign().await {
        Ok(()) => println!("{who} resigned term {token}"),
        Err(error) => println!("{who} could not resign term {token} ({error}); it expires"),
    }
    shared.leading.store(false, Ordering::SeqCst);
    shared.resigned.notify_one();
    // Not returning: `run` would campaign again, and this instance is on its way out.
    std::future::pending::<()>().await;
}

/// Says that a term ended without a resignation (the future was dropped by `run`, which does
/// that when the term is lost).
struct Leading<'a> {
    shared: &'a Shared,
    token: u64,
    resigning: bool,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        if !self.resigning {
            self.shared.leading.store(false, Ordering::SeqCst);
            println!(
                "{} lost term {}; it stopped ticking and campaigns again",
                self.shared.name, self.token
            );
        }
    }
}

/// Resolves on Ctrl-C, SIGTERM, or (with `stdin`) when stdin closes.
async fn stop_requested(stdin: bool) {
    let closed = async {
        if !stdin {
            return std::future::pending().await;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        // A thread, not tokio's stdin, which would hold the runtime's shutdown on a read.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            let _ = tx.send(());
        });
        let _ = rx.await;
    };
    #[cfg(unix)]
    let terminated = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminated = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminated => {}
        () = closed => {}
    }
}

// ---------------------------------------------------------------------------------------------
// The demo

/// A line an instance printed, as the demo received it.
struct Said {
    who: &'static str,
    at: Duration,
    line: String,
}

/// The demo's running instances and what they print.
struct Fleet {
    start: Instant,
    children: BTreeMap<&'static str, Child>,
    stdins: BTreeMap<&'static str, ChildStdin>,
    said: mpsc::UnboundedReceiver<Said>,
}

/// `[  2.104s] ` from the demo's start: every line the demo prints starts with it.
fn stamp(at: Duration) -> String {
    format!("[{:>8.3}s]", at.as_secs_f64())
}

/// `a leads (term 17)` -> `("a", 17)`.
fn parse_leads(line: &str) -> Option<(&str, u64)> {
    let (who, rest) = line.split_once(" leads (term ")?;
    Some((who, rest.strip_suffix(')')?.parse().ok()?))
}

impl Fleet {
    fn say(&self, text: &str) {
        println!("{} {text}", stamp(self.start.elapsed()));
    }

    /// Starts the three instances; their lines are printed (stamped) as they come.
    fn spawn(start: Instant, url: &str, prefix: &str, ttl: Duration) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
        let (tx, said) = mpsc::unbounded_channel();
        let mut fleet = Self {
            start,
            children: BTreeMap::new(),
            stdins: BTreeMap::new(),
            said,
        };
        for who in NAMES {
            let ttl_ms = ttl.as_millis().to_string();
            let mut child = Command::new(&exe)
                .args(["--name", who, "--redis-url", url, "--prefix", prefix])
                .args(["--ttl-ms", &ttl_ms, "--until-stdin-closes"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("cannot start instance {who}: {e}"))?;
            let stdin = child.stdin.take().ok_or("no stdin for an instance")?;
            let stdout = child.stdout.take().ok_or("no stdout for an instance")?;
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let at = start.elapsed();
                    println!("{} {line}", stamp(at));
                    let _ = tx.send(Said { who, at, line });
                }
            });
            fleet.stdins.insert(who, stdin);
            fleet.children.insert(who, child);
        }
        Ok(fleet)
    }

    /// Waits (until `deadline`, from the start) for an instance's line that `wanted` accepts;
    /// returns who said it, when, and what `wanted` made of it.
    async fn until_said<T>(
        &mut self,
        deadline: Duration,
        mut wanted: impl FnMut(&Said) -> Option<T>,
    ) -> Option<(&'static str, Duration, T)> {
        let until = tokio::time::Instant::from_std(self.start + deadline);
        loop {
            let said = tokio::time::timeout_at(until, self.said.recv())
                .await
                .ok()??;
            if let Some(found) = wanted(&said) {
                return Some((said.who, said.at, found));
            }
        }
    }

    /// Waits for an instance other than `besides` to say it leads with a term above `above`.
    async fn next_leader(
        &mut self,
        besides: &[&str],
        above: u64,
        deadline: Duration,
    ) -> Option<(&'static str, Duration, u64)> {
        self.until_said(deadline, |said| {
            let (who, term) = parse_leads(&said.line)?;
            (who == said.who && !besides.contains(&who) && term > above).then_some(term)
        })
        .await
    }

    /// Waits for `who`'s tick `n` of `term` (counting its ticks from 1 in each term), then half
    /// a tick more: what the demo does next happens between two ticks, so no line of `who`'s
    /// crosses it on the way here.
    async fn between_ticks(&mut self, who: &str, term: u64, n: u64, deadline: Duration) -> bool {
        let suffix = format!(" by {who} (term {term})");
        let mut seen = 0;
        let ticked = self
            .until_said(deadline, |said| {
                if said.line.starts_with("tick ") && said.line.ends_with(&suffix) {
                    seen += 1;
                }
                (seen >= n).then_some(())
            })
            .await;
        tokio::time::sleep(TICK / 2).await;
        ticked.is_some()
    }

    /// Closes the instance's stdin: it resigns (if it leads) and exits.
    fn ask_to_stop(&mut self, who: &str) {
        self.stdins.remove(who);
    }

    /// Asks every instance to stop, waits up to `within` for them, and kills what is left.
    async fn stop(&mut self, within: Duration) {
        self.stdins.clear();
        let until = tokio::time::Instant::now() + within;
        for (who, child) in &mut self.children {
            if tokio::time::timeout_at(until, child.wait()).await.is_err() {
                println!(
                    "{} {who} did not stop in time: killed",
                    stamp(self.start.elapsed())
                );
                let _ = child.kill().await;
            }
        }
        // Every instance's last lines are printed before the demo's next one.
        let drained = async { while self.said.recv().await.is_some() {} };
        let _ = tokio::time::timeout(Duration::from_secs(1), drained).await;
    }
}

/// Follows the election and prints each change of leader.
fn print_changes(election: &Election, start: Instant) {
    let mut leaders = election.watch();
    tokio::spawn(async move {
        loop {
            let line = match &*leaders.borrow_and_update() {
                Some(leader) => format!(
                    "watch: leader is {} (term {})",
                    leader.label.as_deref().unwrap_or(&leader.token_prefix),
                    leader.fencing_token
                ),
                None => "watch: no leader".to_owned(),
            };
            println!("{} {line}", stamp(start.elapsed()));
            if leaders.changed().await.is_err() {
                return;
            }
        }
    });
}

async fn demo(cli: &Cli, ttl: Duration) -> Result<ExitCode, String> {
    let start = Instant::now();
    // The demo writes only to a Redis it was given or started: never to one it happens to find.
    let redis = match cli
        .redis_url
        .clone()
        .or_else(|| std::env::var("REDIS_URL").ok())
    {
        Some(url) => {
            println!("Redis: {url} (from --redis-url / REDIS_URL)");
            (url, None)
        }
        None => {
            let redis = LocalRedis::start()?;
            println!("Redis: {} (set REDIS_URL to use another)", redis.origin);
            (redis.url.clone(), Some(redis))
        }
    };
    let (url, server) = redis;
    let prefix = format!("{}{}:", cli.prefix, std::process::id());
    let locks = LockManager::builder()
        .url(url.clone())
        .prefix(prefix.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let election = locks.election(ELECTION).ttl(ttl);
    println!(
        "election {ELECTION:?} (key {prefix}{}), ttl {ttl:?}: instances {} tick every {TICK:?} \
         while they lead",
        election.key(),
        NAMES.join(", ")
    );
    let mut fleet = Fleet::spawn(start, &url, &prefix, ttl)?;
    print_changes(&election, start);
    let story = tell(&mut fleet, &election, ttl);
    let verdict = tokio::select! {
        verdict = story => verdict,
        _ = tokio::signal::ctrl_c() => Err("interrupted".to_owned()),
    };
    fleet.stop(ttl).await;
    fleet.say("stopped every instance");
    drop(fleet);
    drop(server);
    let verdict = verdict?;
    println!("{verdict}");
    Ok(if verdict.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The demo's two measurements against their limits.
struct Verdict {
    failover: Duration,
    failover_limit: Duration,
    handoff: Duration,
}

impl Verdict {
    fn ok(&self) -> bool {
        self.failover <= self.failover_limit && self.handoff < HANDOFF_LIMIT
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let judge = |ok: bool| if ok { "ok" } else { "TOO SLOW" };
        write!(
            f,
            "failover after kill -9: {:.3}s (limit ttl + ttl/3 = {:.3}s): {}; \
             hand-off on resign: {:.3}s (limit {:.3}s): {}",
            self.failover.as_secs_f64(),
            self.failover_limit.as_secs_f64(),
            judge(self.failover <= self.failover_limit),
            self.handoff.as_secs_f64(),
            HANDOFF_LIMIT.as_secs_f64(),
            judge(self.handoff < HANDOFF_LIMIT),
        )
    }
}

/// Kill the leader, watch the take-over, have the new leader resign, watch the hand-off.
async fn tell(fleet: &mut Fleet, election: &Election, ttl: Duration) -> Result<Verdict, String> {
    let limit = ttl + ttl / 3;
    // Wait until one leads and the other two queue behind it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        match election.leader().await {
            Ok(Some(leader)) if leader.candidates == NAMES.len() - 1 => break leader,
            Ok(_) => {}
            Err(error) => return Err(format!("cannot read the leader: {error}")),
        }
        if Instant::now() > deadline {
            return Err("no leader with two candidates within 20 s".to_owned());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let killed = NAMES
        .into_iter()
        .find(|who| first.label.as_deref() == Some(*who))
        .ok_or_else(|| format!("the leader {:?} is none of the demo's", first.label))?;
    let soon = fleet.start.elapsed() + 2 * ttl;
    if !fleet
        .between_ticks(killed, first.fencing_token, 3, soon)
        .await
    {
        return Err(format!("{killed} leads but does not tick"));
    }
    let child = fleet
        .children
        .get_mut(killed)
        .ok_or("the leader's process is gone")?;
    // SIGKILL: no resignation, no release; the term has to expire.
    child
        .start_kill()
        .map_err(|e| format!("cannot kill {killed}: {e}"))?;
    let killed_at = fleet.start.elapsed();
    let _ = child.wait().await;
    fleet.say(&format!(
        "killed {killed} (leader, term {}) at {:.3}s",
        first.fencing_token,
        killed_at.as_secs_f64()
    ));

    let (second, took_over_at, second_term) = fleet
        .next_leader(&[killed], first.fencing_token, killed_at + 3 * ttl)
        .await
        .ok_or_else(|| format!("nobody took over within 3 ttl of killing {killed}"))?;
    let failover = took_over_at.saturating_sub(killed_at);
    fleet.say(&format!(
        "{second} took over at {:.3}s ({:.3}s after the kill, ttl {ttl:?}; limit ttl + ttl/3 = \
         {limit:?}: {})",
        took_over_at.as_secs_f64(),
        failover.as_secs_f64(),
        if failover <= limit { "ok" } else { "TOO SLOW" }
    ));

    let soon = fleet.start.elapsed() + 2 * ttl;
    if !fleet.between_ticks(second, second_term, 3, soon).await {
        return Err(format!("{second} leads but does not tick"));
    }
    let asked_at = fleet.start.elapsed();
    fleet.say(&format!("asking {second} to resign (closing its stdin)"));
    fleet.ask_to_stop(second);
    let (third, handed_at, third_term) = fleet
        .next_leader(&[killed, second], second_term, asked_at + 3 * ttl)
        .await
        .ok_or_else(|| format!("nobody took over within 3 ttl of {second}'s resignation"))?;
    let handoff = handed_at.saturating_sub(asked_at);
    fleet.say(&format!(
        "{third} took over at {:.3}s, {:.0} ms after {second} was asked to resign (a hand-off, \
         no expiry)",
        handed_at.as_secs_f64(),
        handoff.as_secs_f64() * 1000.0
    ));

    let soon = fleet.start.elapsed() + 2 * ttl;
    if !fleet.between_ticks(third, third_term, 3, soon).await {
        return Err(format!("{third} leads but does not tick"));
    }
    fleet.say(&format!("asking {third} to resign and stop"));
    Ok(Verdict {
        failover,
        failover_limit: limit,
        handoff,
    })
}
