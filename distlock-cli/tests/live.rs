//! `distlock watch` and `distlock top` the way an operator uses them: `watch` as a child whose
//! output lines are read as they come, `top` in a real pseudo-terminal (util-linux `script`)
//! whose screen is read back through a terminal emulator (`vt100`), keys typed into it. The
//! locks change hands in other processes: this test binary started again as a helper (see
//! [`helper_process`]).

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_tests::RedisServer;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Set in a helper process: the Redis URL its manager uses.
const HELPER_URL: &str = "DISTLOCK_LIVE_HELPER_URL";
/// Set in a helper process: its manager's holder label.
const HELPER_LABEL: &str = "DISTLOCK_LIVE_HELPER_LABEL";

/// How soon a change must show.
const SHOWS_WITHIN: Duration = Duration::from_secs(2);
/// How soon after a fair hand-off `watch` and `top` must both show its claim: well inside the
/// claim (`HANDOFF_CLAIM`, 2 s), so that its recipient, resumed then, renews before it ends.
const CLAIM_SHOWS_WITHIN: Duration = Duration::from_secs(1);

/// Not a test: the body of a helper process (a no-op in a test run). It reads commands on stdin
/// and answers each with a line starting `> `:
/// `take KEY TTL_MS` (exclusive, renewed; retried while Redis is unavailable), `read KEY TTL_MS`
/// (shared), `wait KEY TTL_MS` (a fair waiter: `> waiting`, then `> taken` when it holds),
/// `release KEY`, `lead NAME TTL_MS` (`> campaigning`, then `> leading NAME TERM`),
/// `resign NAME`. A lock it takes is answered `> taken KEY FENCING_TOKEN`.
#[test]
fn helper_process() {
    let (Ok(url), Ok(label)) = (std::env::var(HELPER_URL), std::env::var(HELPER_LABEL)) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(helper(url, label));
    std::process::exit(0);
}

async fn helper(url: String, label: String) {
    use std::collections::HashMap;
    let locks = distlock_runtime::LockManager::builder()
        .url(url)
        .holder_label(label)
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let leases = Arc::new(Mutex::new(HashMap::new()));
    let terms = Arc::new(Mutex::new(HashMap::new()));
    let mut input = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = input.next_line().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        let ms = |i: usize| Duration::from_millis(words[i].parse().unwrap());
        match words[..] {
            ["take", key, _] | ["read", key, _] => {
                let deadline = Instant::now() + Duration::from_secs(20);
                let lease = loop {
                    let request = if words[0] == "read" {
                        locks.read_lock(key)
                    } else {
                        locks.lock(key)
                    };
                    match request.ttl(ms(2)).acquire().await {
                        Ok(lease) => break lease,
                        Err(e) if e.is_unavailable() && Instant::now() < deadline => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => panic!("take {key}: {e}"),
                    }
                };
                println!("> taken {key} {}", lease.fencing_token());
                lock(&leases).insert(key.to_owned(), lease);
            }
            ["wait", key, _] => {
                let request = locks.lock(key).ttl(ms(2)).wait(Duration::from_secs(60));
                let (key, leases) = (key.to_owned(), Arc::clone(&leases));
                println!("> waiting {key}");
                tokio::spawn(async move {
                    match request.acquire().await {
                        Ok(lease) => {
                            println!("> taken {key} {}", lease.fencing_token());
                            lock(&leases).insert(key, lease);
                        }
                        Err(e) => println!("> failed {key} {e}"),
                    }
                });
            }
            ["release", key] => {
                let lease = lock(&leases).remove(key).expect("a lease held");
                lease.release().await.unwrap();
                println!("> released {key}");
            }
            ["lead", name, _] => {
                let election = locks.election(name).ttl(ms(2));
                let (name, terms) = (name.to_owned(), Arc::clone(&terms));
                println!("> campaigning {name}");
                tokio::spawn(async move {
                    match election.campaign().await {
                        Ok(term) => {
                            println!("> leading {name} {}", term.fencing_token());
                            lock(&terms).insert(name, term);
                        }
                        Err(e) => println!("> failed {name} {e}"),
                    }
                });
            }
            ["resign", name] => {
                let term = lock(&terms).remove(name).expect("a term held");
                term.resign().await.unwrap();
                println!("> resigned {name}");
            }
            _ => panic!("unknown helper command {line:?}"),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Another process holding locks: this test binary running [`helper_process`].
struct Helper {
    child: Child,
    stdin: ChildStdin,
    answers: Lines<BufReader<ChildStdout>>,
}

impl Helper {
    fn start(server: &RedisServer, label: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "helper_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HELPER_URL, server.url())
            .env(HELPER_LABEL, label)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the helper process");
        let stdin = child.stdin.take().unwrap();
        let answers = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            stdin,
            answers,
        }
    }

    /// Sends `command`; its answer.
    async fn send(&mut self, command: &str) -> String {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
        self.answer().await
    }

    /// The next answer (a line starting `> `, without it), within 30 s.
    async fn answer(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let line = self
                    .answers
                    .next_line()
                    .await
                    .unwrap()
                    .expect("helper alive");
                // The first comes after libtest's `test helper_process ... `.
                if let Some((_, answer)) = line.split_once("> ") {
                    return answer.to_owned();
                }
            }
        })
        .await
        .expect("the helper answered in time")
    }

    /// The fencing token in an answer `taken KEY TOKEN` / `leading NAME TERM`.
    fn token(answer: &str) -> String {
        answer.rsplit(' ').next().unwrap().to_owned()
    }

    /// Sends the process `signal` (`STOP`: it answers nothing, renews nothing, until `CONT`).
    fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("helper alive").to_string();
        let sent = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal} {pid}");
    }

    /// Kills the process (SIGKILL): its leases are neither renewed nor released.
    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}

/// A line of a child's output and when it was read.
type Seen = (Instant, String);

/// `distlock watch ARGS...` against `server`, its lines collected as they come.
struct Watch {
    child: Child,
    lines: Arc<Mutex<Vec<Seen>>>,
}

impl Watch {
    fn start(server: &RedisServer, args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_distlock"))
            .args(["--url", &server.url(), "--timeout-ms", "500", "watch"])
            .args(args)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start distlock watch");
        let mut output = BufReader::new(child.stdout.take().unwrap()).lines();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let collected = Arc::clone(&lines);
        tokio::spawn(async move {
            while let Ok(Some(line)) = output.next_line().await {
                lock(&collected).push((Instant::now(), line));
            }
        });
        Self { child, lines }
    }

    /// The first line after `since` (by index) containing every part of `parts`, and when it
    /// was read; panics with every line after `within`.
    async fn line(&self, since: usize, parts: &[&str], within: Duration) -> Seen {
        let deadline = Instant::now() + within;
        loop {
            if let Some(found) = lock(&self.lines)
                .iter()
                .skip(since)
                .find(|(_, l)| parts.iter().all(|p| l.contains(p)))
            {
                return found.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no line with {parts:?} within {within:?}; lines:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn count(&self) -> usize {
        lock(&self.lines).len()
    }

    fn text(&self) -> String {
        let lines: Vec<String> = lock(&self.lines).iter().map(|(_, l)| l.clone()).collect();
        lines.join("\n")
    }
}

/// Waits for the line with `parts` after line `since`, asserts it came within [`SHOWS_WITHIN`]
/// of `event`, prints the delay, and returns the line.
async fn shows(watch: &Watch, since: usize, parts: &[&str], event: Instant) -> String {
    let (at, line) = watch.line(since, parts, SHOWS_WITHIN * 5).await;
    let delay = at.saturating_duration_since(event);
    println!("{delay:>6.0?} {line}");
    assert!(
        delay <= SHOWS_WITHIN,
        "{line} came {delay:?} after the event"
    );
    line
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_names_each_change_of_a_lock_and_a_leader_as_it_happens() {
    let mut server = RedisServer::start();
    let watch = Watch::start(&server, &["order:1", "--election", "cron"]);
    watch.line(0, &[" order:1 free"], SHOWS_WITHIN * 5).await;
    watch
        .line(0, &[" election:cron no leader"], SHOWS_WITHIN)
        .await;
    let (mut alpha, mut beta) = (
        Helper::start(&server, "alpha"),
        Helper::start(&server, "beta"),
    );

    // Taken by another process: who, its fencing token, mode, ttl; each line timestamped.
    let mark = watch.count();
    let taken = alpha.send("take order:1 30000").await;
    let at = Instant::now();
    let token = Helper::token(&taken);
    let line = shows(&watch, mark, &["order:1 taken by alpha ("], at).await;
    assert!(
        line.contains(&format!("exclusive token {token} ttl ")),
        "{line}"
    );
    let stamp = line.split(' ').next().unwrap();
    assert!(stamp.len() == 24 && stamp.ends_with('Z'), "{line}");

    // A fair waiter queues; the holder's release hands the lock straight to it.
    let mark = watch.count();
    assert!(beta.send("wait order:1 30000").await.starts_with("waiting"));
    shows(
        &watch,
        mark,
        &["order:1 waiters 0 -> 1 waiting: beta"],
        Instant::now(),
    )
    .await;
    let mark = watch.count();
    alpha.send("release order:1").await;
    let at = Instant::now();
    let handed = beta.answer().await;
    let line = shows(&watch, mark, &["order:1 handed over from alpha ("], at).await;
    assert!(
        line.contains(" to beta (") && line.contains(&Helper::token(&handed)),
        "{line}"
    );

    // Released: freed long before its expiry.
    let mark = watch.count();
    beta.send("release order:1").await;
    let line = shows(
        &watch,
        mark,
        &["order:1 released by beta ("],
        Instant::now(),
    )
    .await;
    assert!(line.contains("before its expiry"), "{line}");

    // Forced: `distlock release --force` from another process; watch names the holder that
    // lost its lease, as the forced release tells it.
    alpha.send("take order:1 30000").await;
    watch
        .line(mark, &["order:1 taken by alpha ("], SHOWS_WITHIN)
        .await;
    let mark = watch.count();
    let forced = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(["--url", &server.url(), "release", "order:1", "--force"])
        .output()
        .await
        .unwrap();
    assert!(forced.status.success(), "{forced:?}");
    let at = Instant::now();
    shows(
        &watch,
        mark,
        &["order:1 force-released: alpha lost the lease"],
        at,
    )
    .await;
    let mark = watch.count();

    // Expired: its holder killed, the lease runs out (1 s ttl) without a release.
    let mut gamma = Helper::start(&server, "gamma");
    gamma.send("take order:1 1000").await;
    watch
        .line(mark, &["order:1 taken by gamma ("], SHOWS_WITHIN)
        .await;
    let mark = watch.count();
    gamma.kill().await;
    let expires = Instant::now() + Duration::from_millis(1000);
    let line = shows(&watch, mark, &["order:1 expired: gamma ("], expires).await;
    assert!(!line.contains("released"), "{line}");

    // An election: its leader, and the leader changing when it resigns to a queued candidate.
    let mark = watch.count();
    alpha.send("lead cron 3000").await;
    let at = Instant::now();
    let term = Helper::token(&alpha.answer().await);
    let line = shows(&watch, mark, &["election:cron elected alpha ("], at).await;
    assert!(line.contains(&format!("term token {term}")), "{line}");
    beta.send("lead cron 3000").await;
    watch
        .line(
            mark,
            &["election:cron waiters 0 -> 1 waiting: beta"],
            SHOWS_WITHIN * 2,
        )
        .await;
    let mark = watch.count();
    alpha.send("resign cron").await;
    let at = Instant::now();
    beta.answer().await;
    let line = shows(
        &watch,
        mark,
        &["election:cron leader changed from alpha ("],
        at,
    )
    .await;
    assert!(line.contains(" to beta ("), "{line}");

    // Redis hangs (SIGSTOP): each reading gives up at the timeout; one line, then one when
    // it answers again.
    let mark = watch.count();
    server.pause();
    shows(
        &watch,
        mark,
        &["Redis unavailable: "],
        Instant::now() + Duration::from_millis(500),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.resume();
    shows(&watch, mark, &["Redis answers again"], Instant::now()).await;

    // Redis stops: one line says so (not one per reading), one more when it is back; the
    // lock it lost is not called released.
    alpha.send("take order:1 30000").await;
    watch
        .line(mark, &["order:1 taken by alpha ("], SHOWS_WITHIN)
        .await;
    let mark = watch.count();
    server.kill();
    let at = Instant::now();
    shows(&watch, mark, &["Redis unavailable: "], at).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.restart();
    let at = Instant::now();
    shows(&watch, mark, &["Redis answers again"], at).await;
    watch
        .line(
            mark,
            &["order:1 gone while Redis was unavailable"],
            SHOWS_WITHIN,
        )
        .await;
    let outage: Vec<String> = lock(&watch.lines)[mark..]
        .iter()
        .map(|(_, l)| l.clone())
        .collect();
    let unavailable = outage
        .iter()
        .filter(|l| l.contains("Redis unavailable"))
        .count();
    assert_eq!(unavailable, 1, "one outage line:\n{}", outage.join("\n"));
    // And it follows the new server.
    let mark = watch.count();
    beta.send("take order:1 30000").await;
    shows(&watch, mark, &["order:1 taken by beta ("], Instant::now()).await;
    drop(watch.child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_json_prints_one_object_per_change() {
    let server = RedisServer::start();
    let watch = Watch::start(&server, &["--json", "job:5"]);
    watch
        .line(0, &[r#""event":"free""#], SHOWS_WITHIN * 5)
        .await;
    let mut alpha = Helper::start(&server, "alpha");
    let token = Helper::token(&alpha.send("read job:5 20000").await);
    let (_, line) = watch.line(0, &[r#""event":"taken""#], SHOWS_WITHIN).await;
    let object: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(object["key"], "job:5", "{object}");
    assert!(object["election"].is_null(), "{object}");
    assert_eq!(object["lock"]["mode"], "shared", "{object}");
    assert_eq!(
        object["lock"]["fencing_token"].to_string(),
        token,
        "{object}"
    );
    assert_eq!(object["lock"]["holders"][0]["label"], "alpha", "{object}");
    assert!(object["at"].as_str().unwrap().ends_with('Z'), "{object}");
    // A second reader joins.
    let mut beta = Helper::start(&server, "beta");
    beta.send("read job:5 20000").await;
    let (_, line) = watch.line(0, &[r#""event":"joined""#], SHOWS_WITHIN).await;
    let object: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(object["owner"]["label"], "beta", "{object}");
    assert_eq!(object["lock"]["holders"].as_array().unwrap().len(), 2);
    alpha.send("release job:5").await;
    watch.line(0, &[r#""event":"left""#], SHOWS_WITHIN).await;
}

/// `distlock top` in a pseudo-terminal of 160 by 40 (`script` from util-linux), its screen
/// kept by a terminal emulator. After top exits, the shell prints `stty`'s `icanon` flag: `-icanon`
/// if top left the terminal raw.
struct Top {
    child: Child,
    keys: ChildStdin,
    screen: Arc<Mutex<vt100::Parser>>,
}

impl Top {
    /// `distlock top ARGS...`.
    fn start(server: &RedisServer, args: &[&str]) -> Self {
        let top = format!(
            "{} --url {} --timeout-ms 500 top {}",
            env!("CARGO_BIN_EXE_distlock"),
            server.url(),
            args.join(" ")
        );
        let shell = format!(
            "stty cols 160 rows 40; {top}; status=$?; stty -a | tr ' ;' '\\n\\n' | grep -x -- '-\\?icanon'; exit $status"
        );
        let mut child = Command::new("script")
            .args(["-qfec", &shell, "/dev/null"])
            .env("SHELL", "/bin/sh")
            .env("TERM", "xterm-256color")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start `script` (util-linux) to run distlock top in a pseudo-terminal");
        let keys = child.stdin.take().unwrap();
        let mut output = child.stdout.take().unwrap();
        let screen = Arc::new(Mutex::new(vt100::Parser::new(nonzero(40), nonzero(160), 0)));
        let parser = Arc::clone(&screen);
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut buffer = [0; 8192];
            while let Ok(n) = output.read(&mut buffer).await {
                if n == 0 {
                    break;
                }
                lock(&parser).process(&buffer[..n]);
            }
        });
        Self {
            child,
            keys,
            screen,
        }
    }

    fn text(&self) -> String {
        lock(&self.screen).screen().contents()
    }

    /// Waits until the screen shows what `check` looks for; returns that screen and how long
    /// after `since` it showed. Panics with the screen after `within`.
    async fn until(
        &self,
        since: Instant,
        within: Duration,
        check: impl Fn(&str) -> bool,
    ) -> (String, Duration) {
        let deadline = Instant::now() + within;
        loop {
            let text = self.text();
            if check(&text) {
                return (text, since.elapsed());
            }
            assert!(
                Instant::now() < deadline,
                "not shown within {within:?}:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn press(&mut self, keys: &str) {
        self.keys.write_all(keys.as_bytes()).await.unwrap();
        self.keys.flush().await.unwrap();
    }
}

fn nonzero(n: u16) -> std::num::NonZeroU16 {
    std::num::NonZeroU16::new(n).unwrap()
}

/// The screen's line that contains `part`.
fn row<'a>(text: &'a str, part: &str) -> Option<&'a str> {
    text.lines().find(|l| l.contains(part))
}

/// Where the line containing `part` is on the screen.
fn place(text: &str, part: &str) -> Option<usize> {
    text.lines().position(|l| l.contains(part))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_shows_other_processes_locks_sorts_filters_survives_a_restart_and_quits_clean() {
    let mut server = RedisServer::start();
    let mut top = Top::start(&server, &[]);
    // The status line says which server and version answered, as the server's INFO says.
    let answered = match server.info_field("valkey_version") {
        Some(valkey) => format!("Valkey {valkey} at "),
        None => format!("Redis {} at ", server.info_field("redis_version").unwrap()),
    };
    top.until(Instant::now(), Duration::from_secs(10), |t| {
        t.contains("live; read") && t.contains(&answered)
    })
    .await;
    let (mut alpha, mut beta) = (
        Helper::start(&server, "alpha"),
        Helper::start(&server, "beta"),
    );

    // A lock another process takes shows within 2 s, with its mode, holder and token.
    let taken = alpha.send("take order:1 30000").await;
    let at = Instant::now();
    let token = Helper::token(&taken);
    let (text, delay) = top
        .until(at, SHOWS_WITHIN * 3, |t| row(t, "order:1").is_some())
        .await;
    println!("order:1 showed {delay:?} after it was taken");
    assert!(delay <= SHOWS_WITHIN, "{delay:?}");
    let line = row(&text, "order:1").unwrap();
    for part in ["exclusive", token.as_str(), "alpha ("] {
        assert!(line.contains(part), "{part} in {line}");
    }

    // A shared key, a waiter queued in order, and an election's leader.
    beta.send("read stock:9 20000").await;
    let mut gamma = Helper::start(&server, "gamma");
    gamma.send("wait order:1 30000").await;
    alpha.send("lead cron 3000").await;
    let term = Helper::token(&alpha.answer().await);
    let (text, _) = top
        .until(Instant::now(), SHOWS_WITHIN * 2, |t| {
            row(t, "stock:9").is_some()
                && row(t, "order:1").is_some_and(|l| l.contains("1: gamma"))
                && row(t, "cron").is_some_and(|l| l.contains(&term))
        })
        .await;
    assert!(row(&text, "stock:9").unwrap().contains("shared"), "{text}");
    assert!(row(&text, "cron").unwrap().contains("alpha ("), "{text}");

    // Sorted by key, then reversed on `r`.
    assert!(place(&text, "order:1") < place(&text, "stock:9"), "{text}");
    top.press("r").await;
    top.until(Instant::now(), SHOWS_WITHIN, |t| {
        place(t, "stock:9") < place(t, "order:1") && t.contains("KEY v")
    })
    .await;
    // `s` moves the sort to the next column.
    top.press("s").await;
    top.until(Instant::now(), SHOWS_WITHIN, |t| t.contains("MODE v"))
        .await;

    // The filter hides the keys that do not match.
    top.press("/stock").await;
    top.until(Instant::now(), SHOWS_WITHIN, |t| {
        t.contains("filter: stock_")
    })
    .await;
    assert!(
        row(&top.text(), "order:1").is_some(),
        "applied only on Enter"
    );
    top.press("\r").await;
    let (text, _) = top
        .until(Instant::now(), SHOWS_WITHIN, |t| {
            row(t, "order:1").is_none()
        })
        .await;
    assert!(row(&text, "stock:9").is_some(), "{text}");
    top.press("\x1b").await;
    top.until(Instant::now(), SHOWS_WITHIN * 2, |t| {
        row(t, "order:1").is_some()
    })
    .await;

    // Redis hung (SIGSTOP): the status line says so, and keys still work at once.
    server.pause();
    let at = Instant::now();
    let (_, delay) = top
        .until(at, Duration::from_secs(10), |t| {
            t.contains("Redis unavailable for ")
        })
        .await;
    println!("a hung Redis showed {delay:?} after it stopped answering");
    top.press("s").await;
    let (_, delay) = top
        .until(Instant::now(), SHOWS_WITHIN, |t| t.contains("HOLDERS v"))
        .await;
    println!("a key press took effect in {delay:?} while Redis hung");
    server.resume();
    top.until(Instant::now(), Duration::from_secs(10), |t| {
        t.contains("live; read")
    })
    .await;

    // Redis gone: the status line says so, the UI stays; back: new locks show again.
    server.kill();
    let at = Instant::now();
    let (_, delay) = top
        .until(at, Duration::from_secs(10), |t| {
            t.contains("Redis unavailable for ") && t.contains("retrying")
        })
        .await;
    println!("the outage showed {delay:?} after Redis was killed");
    server.restart();
    beta.send("take after:1 30000").await;
    let at = Instant::now();
    let (text, delay) = top
        .until(at, Duration::from_secs(10), |t| {
            row(t, "after:1").is_some() && t.contains("live; read")
        })
        .await;
    println!("after the restart, a new lock showed {delay:?} after it was taken");
    assert!(row(&text, "beta (").is_some(), "{text}");

    // `q` quits with status 0, out of the alternate screen and raw mode.
    top.press("q").await;
    let status = tokio::time::timeout(Duration::from_secs(10), top.child.wait())
        .await
        .expect("top quit in time")
        .unwrap();
    assert!(status.success(), "{status}");
    let (text, _) = top
        .until(Instant::now(), SHOWS_WITHIN, |t| t.contains("icanon"))
        .await;
    assert!(!lock(&top.screen).screen().alternate_screen(), "{text}");
    assert!(
        text.lines().any(|l| l.trim() == "icanon"),
        "the terminal is left raw:\n{text}"
    );
    drop(gamma);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_hand_off_shows_as_a_claim_in_top_and_watch_until_its_recipient_takes_it_up() {
    let server = RedisServer::start();
    let top = Top::start(&server, &["--interval-ms", "200"]);
    let watch = Watch::start(&server, &["order:7"]);
    watch.line(0, &[" order:7 free"], SHOWS_WITHIN * 5).await;
    let (mut alpha, mut beta) = (
        Helper::start(&server, "alpha"),
        Helper::start(&server, "beta"),
    );

    // A lease shows its ttl.
    let token = Helper::token(&alpha.send("take order:7 30000").await);
    let at = Instant::now();
    let ttl = format!("exclusive token {token} ttl ");
    shows(&watch, 0, &["order:7 taken by alpha (", &ttl], at).await;
    let (text, _) = top
        .until(at, SHOWS_WITHIN * 3, |t| row(t, "order:7").is_some())
        .await;
    let line = row(&text, "order:7").unwrap();
    assert!(line.contains("alpha (") && line.contains(&token), "{line}");
    assert!(
        !line.contains("claim") && !line.contains("handed"),
        "{line}"
    );

    // A fair waiter queues, and is stopped (SIGSTOP) before the release hands it the lock: it
    // cannot renew, so the lock stays in the hand-off's claim (2 s) until it is resumed.
    assert_eq!(beta.send("wait order:7 30000").await, "waiting order:7");
    top.until(Instant::now(), SHOWS_WITHIN * 2, |t| {
        row(t, "order:7").is_some_and(|l| l.contains("1: beta"))
    })
    .await;
    beta.signal("STOP");
    let mark = watch.count();
    alpha.send("release order:7").await;
    let at = Instant::now();
    let handed = [
        "order:7 handed over from alpha (",
        "to beta (",
        " (in beta's hand-off claim: exclusive token ",
        " claim ",
        "; beta's own ttl from its first renewal)",
    ];
    let claimed = |t: &str| {
        row(t, "order:7").is_some_and(|l| l.contains("handed to beta (") && l.contains("claim "))
    };
    // Both are asked at once, and beta is resumed as soon as both showed the claim or half of
    // it has passed, whichever comes first: it renews well before the claim runs out, however
    // slow the readings were.
    let seen = tokio::time::timeout(CLAIM_SHOWS_WITHIN, async {
        tokio::join!(
            watch.line(mark, &handed, SHOWS_WITHIN * 5),
            top.until(at, SHOWS_WITHIN * 5, claimed)
        )
    })
    .await;
    beta.signal("CONT");
    let resumed = Instant::now();
    let ((seen_at, line), (text, delay)) = seen.unwrap_or_else(|_| {
        panic!(
            "watch and top did not both show the claim within {CLAIM_SHOWS_WITHIN:?} of the \
             hand-off; watch:\n{}\ntop:\n{}",
            watch.text(),
            top.text()
        )
    });
    println!(
        "{:>6.0?} {line}\ntop showed the claim {delay:?} after the release:\n{}",
        seen_at.saturating_duration_since(at),
        row(&text, "order:7").unwrap()
    );
    // The claim shows where the ttl would: beta's own ttl is not known yet.
    let state = line.split("; ").next().unwrap();
    assert!(!state.contains(" ttl "), "{line}");

    // Resumed within the claim: it renews, extending the lock to its own ttl.
    let at = resumed;
    let taken = beta.answer().await;
    assert!(taken.starts_with("taken order:7 "), "{taken}");
    let taken_up = shows(&watch, mark, &["order:7 taken up by beta (", " ttl "], at).await;
    assert!(!taken_up.contains("claim"), "{taken_up}");
    let (text, _) = top
        .until(at, SHOWS_WITHIN, |t| {
            row(t, "order:7").is_some_and(|l| l.contains("beta (") && !l.contains("claim"))
        })
        .await;
    assert!(!row(&text, "order:7").unwrap().contains("handed"), "{text}");
    println!("{}", watch.text());
}

/// Client requests `server` answered: [`RedisServer::requests`] less the `HLEN`s, which only
/// run inside the inspect script (and that list does not leave out).
fn requests(server: &RedisServer) -> u64 {
    let info = server.command(&["INFO", "commandstats"]);
    let hlen: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_hlen:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0);
    server.requests() - hlen
}

/// Client requests per second `server` answered over `window`.
async fn requests_per_second(server: &RedisServer, window: Duration) -> f64 {
    let before = requests(server);
    tokio::time::sleep(window).await;
    let after = requests(server);
    (after - before) as f64 / window.as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_and_top_cost_one_script_call_per_key_per_reading() {
    const KEYS: usize = 10;
    let server = RedisServer::start();
    let locks = server.labelled("load");
    let mut leases = Vec::new();
    let mut keys = Vec::new();
    for i in 0..KEYS {
        let key = format!("cost:{i}");
        let lease = locks
            .lock(key.as_str())
            .ttl(Duration::from_secs(60))
            .renew(false)
            .acquire()
            .await
            .unwrap();
        leases.push(lease);
        keys.push(key);
    }
    let window = Duration::from_secs(3);

    // watch: one inspect per key every 150 ms.
    let mut args: Vec<&str> = keys.iter().map(String::as_str).collect();
    args.extend(["--interval-ms", "150"]);
    let watch = Watch::start(&server, &args);
    watch
        .line(0, &["cost:9 held by load"], SHOWS_WITHIN * 5)
        .await;
    let watching = requests_per_second(&server, window).await;
    let expected = KEYS as f64 * 1000.0 / 150.0;
    println!(
        "watch of {KEYS} keys every 150 ms: {watching:.1} requests/s (expected {expected:.1})"
    );
    assert!(
        (expected * 0.6..=expected * 1.1).contains(&watching),
        "{watching}"
    );
    drop(watch);

    // top: a SCAN for each kind of key (lock:, holders:), then one inspect per lock, each second.
    let top = Top::start(&server, &[]);
    top.until(Instant::now(), Duration::from_secs(10), |t| {
        t.contains("live; read") && row(t, "cost:9").is_some()
    })
    .await;
    let showing = requests_per_second(&server, window).await;
    let expected = (KEYS + 2) as f64;
    println!("top of {KEYS} locks: {showing:.1} requests/s (expected {expected:.1})");
    assert!(
        (expected * 0.6..=expected * 1.1).contains(&showing),
        "{showing}"
    );
    drop((top, leases));
}
