//! Leader election against real redis-server processes: one valid term at a time across
//! processes, failover after a SIGKILL within the ttl and a renewal interval, an immediate
//! hand-off in arrival order on resign / drop / panic, terms fenced also after Redis lost its
//! data, loss stopping the leader, observers following the leader, and what idle candidates cost.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_runtime::{Election, LockManager, HANDOFF_CLAIM};
use distlock_tests::{eventually, RedisServer};
use redis::AsyncCommands;
use tokio::io::AsyncBufReadExt;

const CANDIDATE: &str = env!("CARGO_BIN_EXE_candidate");

/// A candidate process (see `src/bin/candidate.rs`) and the lines it printed so far.
struct Candidate {
    label: String,
    child: tokio::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Candidate {
    /// Starts `count` candidates labelled `label` in one process, once it says `ready`.
    async fn start(
        server: &RedisServer,
        name: &str,
        label: &str,
        ttl: Duration,
        hold: Duration,
        count: usize,
    ) -> Self {
        let mut child = tokio::process::Command::new(CANDIDATE)
            .args([
                server.url(),
                name.to_owned(),
                label.to_owned(),
                ttl.as_millis().to_string(),
                hold.as_millis().to_string(),
                count.to_string(),
            ])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the candidate process");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut reader = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let seen = Arc::clone(&lines);
        tokio::spawn(async move {
            while let Ok(Some(line)) = reader.next_line().await {
                seen.lock().unwrap().push(line);
            }
        });
        let candidate = Self {
            label: label.to_owned(),
            child,
            lines,
        };
        assert!(
            eventually(Duration::from_secs(10), || async {
                candidate.said("ready") > 0
            })
            .await
            .is_some(),
            "candidate {label} did not start"
        );
        candidate
    }

    /// How many of its lines start with `prefix`.
    fn said(&self, prefix: &str) -> usize {
        let lines = self.lines.lock().unwrap();
        lines.iter().filter(|l| l.starts_with(prefix)).count()
    }

    /// Asserts that it printed nothing but `lead` and `ready` lines.
    fn assert_no_complaints(&self) {
        let complaints = self.complaints();
        assert!(complaints.is_empty(), "{}: {complaints:?}", self.label);
    }

    /// Its lines that are not `lead` or `ready` (errors, a stopped `run`).
    fn complaints(&self) -> Vec<String> {
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .filter(|l| !l.starts_with("lead ") && *l != "ready")
            .cloned()
            .collect()
    }
}

/// Who leads `election` now, by label.
async fn leader_label(election: &Election) -> Option<String> {
    election
        .leader()
        .await
        .expect("read the leader")
        .and_then(|leader| leader.label)
}

/// Waits (at most `within`) until the leader's label is `label`; how long it took.
async fn until_led_by(election: &Election, label: &str, within: Duration) -> Option<Duration> {
    eventually(within, || async {
        leader_label(election).await.as_deref() == Some(label)
    })
    .await
}

/// Waits until a leader whose label is not `old` leads; its label and how long it took.
async fn until_other_leader(
    election: &Election,
    old: &str,
    within: Duration,
) -> (String, Duration) {
    let started = Instant::now();
    loop {
        if let Some(label) = leader_label(election).await.filter(|l| l != old) {
            return (label, started.elapsed());
        }
        assert!(
            started.elapsed() < within,
            "no other leader than {old} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The fencing tokens of the terms of `name`, in the order they began.
async fn terms(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> Vec<u64> {
    conn.lrange(format!("office:{{{name}}}:terms"), 0, -1)
        .await
        .expect("LRANGE")
}

async fn violations(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> u64 {
    conn.get::<_, Option<u64>>(format!("office:{{{name}}}:violations"))
        .await
        .expect("GET")
        .unwrap_or(0)
}

fn strictly_increasing(tokens: &[u64]) -> bool {
    tokens.windows(2).all(|w| w[0] < w[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_term_at_a_time_across_processes_with_rising_fencing_tokens() {
    // Three processes of two candidates each; every leader keeps the office 150 ms, then
    // returns (resigning), and campaigns again: terms follow each other quickly. Each leader
    // checks, while its term is valid, that nobody else wrote the office.
    let server = RedisServer::start();
    let name = "rotation";
    let mut candidates = Vec::new();
    for label in ["p0", "p1", "p2"] {
        candidates.push(
            Candidate::start(
                &server,
                name,
                label,
                Duration::from_millis(1500),
                Duration::from_millis(150),
                2,
            )
            .await,
        );
    }
    let mut conn = server.client().await;
    let enough = eventually(Duration::from_secs(20), || {
        let mut conn = conn.clone();
        async move { terms(&mut conn, name).await.len() >= 24 }
    })
    .await;
    assert!(enough.is_some(), "terms did not follow each other");
    let tokens = terms(&mut conn, name).await;
    assert!(strictly_increasing(&tokens), "{tokens:?}");
    assert_eq!(violations(&mut conn, name).await, 0);
    for candidate in &candidates {
        // Every process led (hand-offs go round in arrival order), and none failed.
        assert!(
            candidate.said("lead ") >= 2,
            "{} led {} times",
            candidate.label,
            candidate.said("lead ")
        );
        candidate.assert_no_complaints();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_within_its_ttl_and_a_renewal_interval() {
    // Three candidate processes that lead for ever: kill the leader (SIGKILL), then the next.
    // Each take-over comes within ttl + ttl/3 of the kill, and each survivor's process takes
    // part (judged per process: the last one standing must lead).
    let _timed = distlock_tests::timed().await;
    let server = RedisServer::start();
    let name = "failover";
    let ttl = Duration::from_millis(1500);
    let mut candidates = Vec::new();
    for label in ["p0", "p1", "p2"] {
        candidates.push(Candidate::start(&server, name, label, ttl, Duration::ZERO, 1).await);
    }
    let observer = server.manager().election(name).ttl(ttl);
    let mut conn = server.client().await;
    let mut old = loop {
        if let Some(label) = leader_label(&observer).await {
            break label;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // Led longer than its ttl (renewed), the term's token is still the one observers see.
    tokio::time::sleep(ttl * 3 / 2).await;
    let first = terms(&mut conn, name).await;
    let seen = observer.leader().await.expect("leader").expect("a leader");
    assert_eq!(first, [seen.fencing_token]);
    for _ in 0..2 {
        let at = candidates
            .iter()
            .position(|c| c.label == old)
            .expect("the leader is one of the candidates");
        let before = terms(&mut conn, name).await.len();
        let mut killed = candidates.remove(at);
        killed.child.start_kill().expect("SIGKILL the leader");
        killed.child.wait().await.expect("the leader exited");
        let (new, took) = until_other_leader(&observer, &old, ttl * 3).await;
        println!("{old} killed: {new} took over after {took:?}");
        assert!(
            took <= ttl + ttl / 3,
            "{new} took over {took:?} after {old} was killed (ttl {ttl:?})"
        );
        assert!(candidates.iter().any(|c| c.label == new));
        // A candidate appends its term once its process learns it was granted, which observers
        // may see first: the next kill waits for that, so it kills a leader in office (one
        // killed before it appended would leave its term unrecorded).
        let recorded = eventually(Duration::from_secs(2), || {
            let mut conn = conn.clone();
            async move { terms(&mut conn, name).await.len() > before }
        })
        .await;
        assert!(recorded.is_some(), "{new} never recorded its term");
        old = new;
    }
    // Three terms at least (a term lost to a late renewal on a loaded machine adds one).
    let tokens = terms(&mut conn, name).await;
    assert!(tokens.len() >= 3, "{tokens:?}");
    assert!(strictly_increasing(&tokens), "{tokens:?}");
    assert_eq!(violations(&mut conn, name).await, 0);
    candidates[0].assert_no_complaints();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resign_drop_and_panic_hand_over_at_once_in_arrival_order() {
    let _timed = distlock_tests::timed().await;
    let server = RedisServer::start();
    let name = "handover";
    // A long ttl: a hand-off that waited for an expiry would take 30 s.
    let ttl = Duration::from_secs(30);
    let elections: Vec<Election> = ["a", "b", "c", "d", "e"]
        .into_iter()
        .map(|label| server.labelled(label).election(name).ttl(ttl))
        .collect();
    let mut conn = server.client().await;
    let first = elections[0].campaign().await.expect("a leads");
    // The others queue in order b, c, d, e.
    let b = tokio::spawn({
        let e = elections[1].clone();
        async move { e.campaign().await }
    });
    distlock_tests::until_queued(&conn, "election:handover", 1).await;
    let c = tokio::spawn({
        let e = elections[2].clone();
        async move { e.campaign().await }
    });
    distlock_tests::until_queued(&conn, "election:handover", 2).await;
    // d serves with `run`, and its function panics; e serves with `run` until aborted.
    let d = tokio::spawn({
        let e = elections[3].clone();
        async move {
            // Its function ignores its term (dropped at once): `run` keeps it while it runs.
            e.run(|_term| async move { panic!("the leader's job failed") })
                .await
        }
    });
    distlock_tests::until_queued(&conn, "election:handover", 3).await;
    let e_led = Arc::new(Mutex::new(None));
    let e = tokio::spawn({
        let (e, led) = (elections[4].clone(), Arc::clone(&e_led));
        async move {
            // A leader function whose output is not `Send` (a boxed error): `run` stays `Send`.
            e.run(|term| {
                let led = Arc::clone(&led);
                async move {
                    *led.lock().unwrap() = Some(term.fencing_token());
                    std::future::pending::<()>().await;
                    Ok::<(), Box<dyn std::error::Error>>(())
                }
            })
            .await
        }
    });
    distlock_tests::until_queued(&conn, "election:handover", 4).await;
    let observer = &elections[0];

    // Resign: b at once.
    let started = Instant::now();
    first.resign().await.expect("resign");
    let b_term = b.await.unwrap().expect("b leads");
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(500),
        "b led {took:?} after a resigned"
    );
    assert_eq!(leader_label(observer).await.as_deref(), Some("b"));
    // Dropped: c at once.
    let started = Instant::now();
    drop(b_term);
    let c_term = c.await.unwrap().expect("c leads");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "c led {:?} after b's term was dropped",
        started.elapsed()
    );
    // d leads next, panics, and its term goes to e at once.
    let started = Instant::now();
    drop(c_term);
    let panicked = d.await.expect_err("d's run panicked");
    assert!(panicked.is_panic());
    let took = until_led_by(observer, "e", Duration::from_secs(5))
        .await
        .expect("e leads after d panicked");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "e led {:?} after c's term was dropped (d panicked in between)",
        started.elapsed()
    );
    let _ = took;
    // e's run future dropped (its task aborted): nobody is left, and the key is free at once.
    // (Redis names e before e's own function starts.)
    let ran = eventually(Duration::from_secs(1), || async {
        e_led.lock().unwrap().is_some()
    })
    .await;
    assert!(ran.is_some(), "e's function did not run");
    let e_token = e_led.lock().unwrap().expect("e's function ran");
    e.abort();
    let freed = eventually(Duration::from_secs(1), || async {
        observer.leader().await.expect("leader").is_none()
    })
    .await;
    assert!(
        freed.is_some(),
        "e's term was not resigned when its run was dropped"
    );
    let last = observer.campaign().await.expect("a leads again");
    assert!(last.fencing_token() > e_token);
    assert_eq!(
        distlock_tests::queued(&mut conn, "election:handover").await,
        0
    );
}

// One thread: the log capture sees what the runtime's tasks log.
#[tokio::test]
async fn a_leader_whose_term_is_taken_is_stopped_logs_it_once_and_campaigns_again() {
    let (logs, _capture) = distlock_tests::Logs::capture();
    let server = RedisServer::start();
    let locks = server.labelled("solo");
    let ttl = Duration::from_millis(600);
    let election = locks.election("job").ttl(ttl);
    let (tokens, stopped) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(0)));
    let serving = tokio::spawn({
        let (election, tokens, stopped) =
            (election.clone(), Arc::clone(&tokens), Arc::clone(&stopped));
        async move {
            election
                .run(|term| {
                    let (tokens, stopped) = (Arc::clone(&tokens), Arc::clone(&stopped));
                    async move {
                        tokens.lock().unwrap().push(term.fencing_token());
                        // Counts the futures that were dropped while leading.
                        struct Stopped(Arc<Mutex<u32>>);
                        impl Drop for Stopped {
                            fn drop(&mut self) {
                                *self.0.lock().unwrap() += 1;
                            }
                        }
                        let _stopped = Stopped(stopped);
                        std::future::pending::<()>().await;
                    }
                })
                .await
        }
    });
    let led = eventually(Duration::from_secs(5), || async {
        tokens.lock().unwrap().len() == 1
    })
    .await;
    assert!(led.is_some());
    // An operator breaks the lock: the leader's manager hears of it at once.
    assert!(locks
        .force_release("election:job")
        .await
        .expect("force release"));
    let again = eventually(Duration::from_secs(3), || async {
        tokens.lock().unwrap().len() == 2
    })
    .await;
    assert!(again.is_some(), "the candidate did not lead again");
    assert_eq!(
        *stopped.lock().unwrap(),
        1,
        "the first term's future was not dropped"
    );
    let tokens = tokens.lock().unwrap().clone();
    assert!(tokens[1] > tokens[0], "{tokens:?}");
    assert_eq!(
        logs.count("distlock term lost: the lock was force-released"),
        1,
        "{}",
        logs.text()
    );
    assert!(!serving.is_finished());
    serving.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_outlives_redis_outages_and_terms_stay_fenced_after_redis_lost_its_data() {
    let mut server = RedisServer::start();
    let locks = server.labelled("survivor");
    let ttl = Duration::from_millis(900);
    let election = locks.election("outage").ttl(ttl);
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let serving = tokio::spawn({
        let (election, tokens) = (election.clone(), Arc::clone(&tokens));
        async move {
            election
                .run(|term| {
                    let tokens = Arc::clone(&tokens);
                    async move {
                        tokens
                            .lock()
                            .unwrap()
                            .push((term.fencing_token(), Instant::now()));
                        term.lost().await;
                        // Stopped by `run` before it gets here: the term was lost.
                        std::future::pending::<()>().await;
                    }
                })
                .await
        }
    });
    let led = |n: usize| {
        let tokens = Arc::clone(&tokens);
        async move {
            eventually(Duration::from_secs(10), || async {
                tokens.lock().unwrap().len() >= n
            })
            .await
        }
    };
    assert!(led(1).await.is_some());
    // Redis hangs past the ttl, then comes back: the term is lost, and run leads again.
    server.pause();
    tokio::time::sleep(ttl * 2).await;
    server.resume();
    assert!(led(2).await.is_some(), "no new term after Redis hung");
    // Redis restarts empty (no persistence): the fencing counter is gone, terms still rise.
    server.restart();
    assert!(
        led(3).await.is_some(),
        "no new term after Redis restarted empty"
    );
    let tokens: Vec<u64> = tokens.lock().unwrap().iter().map(|(t, _)| *t).collect();
    assert!(strictly_increasing(&tokens), "{tokens:?}");
    assert!(!serving.is_finished(), "run returned: {:?}", serving.await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_redis_stops_before_its_successor_starts() {
    // The late-answer problem: the leader's renewals go unanswered (Redis paused for it alone is
    // not possible here, so the whole server hangs, then comes back after the key expired).
    // The old leader's term must be lost before the new leader's term begins.
    let mut server = RedisServer::start();
    let ttl = Duration::from_millis(800);
    let old = server.labelled("old").election("late").ttl(ttl);
    let new = server.labelled("new").election("late").ttl(ttl);
    let term = old.campaign().await.expect("old leads");
    // Like `run`: a campaign that Redis failed is made again.
    let waiting = tokio::spawn(async move {
        loop {
            match new.campaign().await {
                Err(error) if error.is_unavailable() => continue,
                other => return other,
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.pause();
    let lost = tokio::time::timeout(ttl * 2, term.lost()).await;
    let lost_at = Instant::now();
    assert!(lost.is_ok(), "the old term was not lost while Redis hung");
    assert!(term.is_lost());
    tokio::time::sleep(ttl).await;
    server.resume();
    let successor = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the new leader in time")
        .unwrap()
        .expect("the new leader's term");
    let began = Instant::now();
    assert!(lost_at < began);
    assert!(successor.fencing_token() > term.fencing_token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_a_resignation_at_once_and_an_expiry_within_a_renewal_interval() {
    let _timed = distlock_tests::timed().await;
    let server = RedisServer::start();
    let name = "observed";
    // Renewal interval 10 s: a change seen sooner than that came by notification.
    let ttl = Duration::from_secs(30);
    let observer = server.manager().election(name).ttl(ttl);
    let mut leaders = observer.watch();
    let a = server.labelled("a").election(name).ttl(ttl);
    let b = server.labelled("b").election(name).ttl(ttl);
    let a_term = a.campaign().await.expect("a leads");
    // The first read (the task starts with one) shows a.
    let a_shown = |l: &Option<distlock_runtime::LeaderInfo>| {
        l.as_ref().and_then(|l| l.label.as_deref()) == Some("a")
    };
    assert!(
        seen_within(&mut leaders, Duration::from_secs(2), a_shown).await,
        "watch did not show a"
    );
    let b_wait = tokio::spawn(async move { b.campaign().await });
    let conn = server.client().await;
    distlock_tests::until_queued(&conn, "election:observed", 1).await;
    let started = Instant::now();
    a_term.resign().await.expect("resign");
    let b_shown = |l: &Option<distlock_runtime::LeaderInfo>| {
        l.as_ref().and_then(|l| l.label.as_deref()) == Some("b")
    };
    assert!(
        seen_within(&mut leaders, Duration::from_secs(2), b_shown).await,
        "watch did not show b"
    );
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(500),
        "b seen {took:?} after a resigned"
    );
    let info = leaders.borrow().clone().expect("b");
    let b_term = b_wait.await.unwrap().expect("b leads");
    // Seen at the hand-off: its token, or b's own once b confirmed it (never greater).
    assert!(info.fencing_token <= b_term.fencing_token());
    let now = observer.leader().await.expect("leader").expect("b leads");
    assert_eq!(now.fencing_token, b_term.fencing_token());
    // Handed over for a claim, b's renewal takes the term to its ttl a third of a claim later;
    // its token stays known while it leads (renewal keeps the counter).
    let renewed = eventually(Duration::from_secs(2), || async {
        let now = observer.leader().await.expect("leader").expect("b leads");
        now.remaining > Duration::from_secs(20) && now.fencing_token == b_term.fencing_token()
    })
    .await;
    assert!(renewed.is_some(), "b's term was not renewed to its ttl");
    // A leader with a short ttl that dies (SIGKILL): watch shows no leader within its ttl
    // plus a renewal interval.
    drop(b_term);
    let short = Duration::from_millis(900);
    let observer = server.manager().election("short").ttl(short);
    let mut leaders = observer.watch();
    let mut c = Candidate::start(&server, "short", "c", short, Duration::ZERO, 1).await;
    assert!(
        seen_within(&mut leaders, short * 3, |l| l.is_some()).await,
        "watch did not show c"
    );
    c.child.start_kill().expect("SIGKILL c");
    c.child.wait().await.expect("c exited");
    let started = Instant::now();
    assert!(
        seen_within(&mut leaders, short * 3, |l| l.is_none()).await,
        "watch still shows a leader"
    );
    let took = started.elapsed();
    assert!(
        took <= short + short / 3,
        "no leader seen {took:?} after the leader was killed (ttl {short:?})"
    );
}

/// Whether the receiver shows what `check` looks for within `within`.
async fn seen_within(
    leaders: &mut tokio::sync::watch::Receiver<Option<distlock_runtime::LeaderInfo>>,
    within: Duration,
    check: impl FnMut(&Option<distlock_runtime::LeaderInfo>) -> bool,
) -> bool {
    matches!(
        tokio::time::timeout(within, leaders.wait_for(check)).await,
        Ok(Ok(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_waiting_candidates_in_three_processes_cost_few_commands_per_second() {
    let _heavy = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let name = "idle";
    let ttl = Duration::from_secs(3);
    // 1 + 33 + 33 + 34 candidates (the leader among them), leading for ever.
    let mut candidates = Vec::new();
    for (label, count) in [("p0", 33), ("p1", 33), ("p2", 34)] {
        candidates.push(Candidate::start(&server, name, label, ttl, Duration::ZERO, count).await);
    }
    let conn = server.client().await;
    distlock_tests::until_queued(&conn, "election:idle", 99).await;
    // Settled: measure a window of two ttls.
    tokio::time::sleep(ttl).await;
    // Requests clients sent (a script call counts once, whatever it runs inside).
    let (before, started) = (server.requests(), Instant::now());
    tokio::time::sleep(ttl * 2).await;
    let (after, took) = (server.requests(), started.elapsed());
    let per_second = (after - before) as f64 / took.as_secs_f64();
    println!(
        "1 leader and 99 waiting candidates in 3 processes, ttl {ttl:?}: {per_second:.1} requests/s"
    );
    // The leader renews every ttl/3; in each process the first waiting candidate tries at the
    // leader's expiry and keeps the others queued (one call per third of the presence, 10 s
    // here), and the subscriber connection is pinged every 2 s: about 1 + 3 x (0.4 + 0.4 + 0.5).
    // Were each candidate to try at every expiry it saw, it would be 40 a second; were each to
    // poll at 10 Hz, 1000.
    assert!(per_second < 12.0, "{per_second:.1} requests/s");
    for candidate in &candidates {
        candidate.assert_no_complaints();
    }
}

/// Three candidates (labelled managers from `manager`) on one topology: one leads, the next
/// takes over at once when it resigns, observers see each leader, and terms rise.
async fn elects_and_hands_over(manager: impl Fn(&str) -> LockManager, in_order: bool) {
    let ttl = Duration::from_secs(10);
    let elections: Vec<Election> = ["a", "b", "c"]
        .iter()
        .map(|label| manager(label).election("topology").ttl(ttl))
        .collect();
    let observer = manager("observer").election("topology").ttl(ttl);
    let mut leaders = observer.watch();
    let first = elections[0].campaign().await.expect("a leads");
    assert_eq!(leader_label(&observer).await.as_deref(), Some("a"));
    // b queues, then c.
    let mut waiting = Vec::new();
    for e in &elections[1..] {
        let e = e.clone();
        waiting.push(tokio::spawn(async move { e.campaign().await }));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let started = Instant::now();
    first.resign().await.expect("resign");
    let (second, took) = until_other_leader(&observer, "a", Duration::from_secs(2)).await;
    assert!(
        took < Duration::from_secs(1),
        "{second} led {took:?} after a resigned"
    );
    if in_order {
        assert_eq!(second, "b", "candidates are served in arrival order");
    }
    assert!(
        seen_within(&mut leaders, Duration::from_secs(2), |l| {
            l.as_ref().and_then(|l| l.label.as_deref()) == Some(second.as_str())
        })
        .await,
        "watch did not follow the hand-off"
    );
    let _ = started;
    // Whoever leads of the two resigns in turn; the other then leads.
    let mut terms = Vec::new();
    let mut pending = waiting;
    while !pending.is_empty() {
        let (done, _, rest) = tokio::time::timeout(
            Duration::from_secs(5),
            futures_util::future::select_all(pending),
        )
        .await
        .expect("every candidate leads in turn");
        let term = done.unwrap().expect("a term");
        terms.push(term.fencing_token());
        term.resign().await.expect("resign");
        pending = rest;
    }
    assert!(strictly_increasing(&terms), "{terms:?}");
}

/// On a quorum a release reaches the nodes one by one, and its notice comes from one of them:
/// a read right after the notice may still find the leader on a majority. The watch reads
/// again soon after (as while nobody leads) until the leader changes, rather than wait a
/// renewal interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_on_a_quorum_follows_a_release_that_reaches_the_majority_after_its_notice() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let manager = |label: &str| {
        LockManager::builder()
            .quorum(servers.iter().map(RedisServer::url))
            .holder_label(label)
            .connect_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500))
            .build()
            .unwrap()
    };
    // A renewal interval (10 s) far longer than the wait below.
    let ttl = Duration::from_secs(30);
    let leader = manager("a").election("apart").ttl(ttl);
    let observer = manager("observer").election("apart").ttl(ttl);
    let mut leaders = observer.watch();
    let term = leader.campaign().await.expect("a leads");
    assert!(
        seen_within(&mut leaders, Duration::from_secs(2), |l| {
            l.as_ref().and_then(|l| l.label.as_deref()) == Some("a")
        })
        .await
    );
    // The release's notice, while it has reached no node yet: the watch reads "a" again.
    let lock = format!("distlock:lock:{{{}}}", leader.key());
    let calls: Vec<u64> = servers.iter().map(RedisServer::script_calls).collect();
    for server in &servers {
        server.command(&["PUBLISH", &lock, ""]);
    }
    let read = eventually(Duration::from_secs(5), || async {
        servers
            .iter()
            .zip(&calls)
            .all(|(server, &before)| server.script_calls() > before)
    })
    .await;
    assert!(read.is_some(), "the watch read after the notice");
    // Now the release reaches two nodes of three: nobody leads.
    for server in &servers[..2] {
        server.command(&["DEL", &lock]);
    }
    assert!(
        seen_within(&mut leaders, Duration::from_secs(2), Option::is_none).await,
        "the watch still shows {:?}",
        *leaders.borrow()
    );
    drop(term);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_elects_and_hands_over_on_a_cluster_sentinel_and_a_quorum() {
    use distlock_tests::topology::{RedisCluster, SentinelGroup};
    let _heavy = distlock_tests::heavy().await;
    let timeout = Duration::from_millis(500);
    let cluster = RedisCluster::start(3, 0);
    elects_and_hands_over(
        |label| {
            LockManager::builder()
                .cluster(cluster.seed_urls())
                .holder_label(label)
                .connect_timeout(timeout)
                .response_timeout(timeout)
                .build()
                .unwrap()
        },
        true,
    )
    .await;
    drop(cluster);
    let group = SentinelGroup::start(1, 3);
    elects_and_hands_over(
        |label| {
            LockManager::builder()
                .sentinel(group.master_name(), group.sentinel_urls())
                .holder_label(label)
                .connect_timeout(timeout)
                .response_timeout(timeout)
                .build()
                .unwrap()
        },
        true,
    )
    .await;
    drop(group);
    // On a quorum candidates wait unfairly: whoever asks first after the release leads.
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    elects_and_hands_over(
        |label| {
            LockManager::builder()
                .quorum(servers.iter().map(RedisServer::url))
                .holder_label(label)
                .connect_timeout(timeout)
                .response_timeout(timeout)
                .build()
                .unwrap()
        },
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_resigns_inside_run_is_stopped_and_campaigns_again_a_second_later() {
    let server = RedisServer::start();
    let locks = server.labelled("quitter");
    let election = locks.election("quits").ttl(Duration::from_secs(30));
    let (tokens, after_resign) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(0)));
    let serving = tokio::spawn({
        let (election, tokens, after_resign) = (
            election.clone(),
            Arc::clone(&tokens),
            Arc::clone(&after_resign),
        );
        async move {
            election
                .run(|term| {
                    let (tokens, after_resign) = (Arc::clone(&tokens), Arc::clone(&after_resign));
                    async move {
                        tokens
                            .lock()
                            .unwrap()
                            .push((term.fencing_token(), Instant::now()));
                        term.resign().await.expect("resign");
                        // Not a leader any more: `run` must stop this before it goes on.
                        loop {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            *after_resign.lock().unwrap() += 1;
                        }
                    }
                })
                .await
        }
    });
    let twice = eventually(Duration::from_secs(5), || async {
        tokens.lock().unwrap().len() >= 2
    })
    .await;
    assert!(twice.is_some(), "no second term");
    let tokens = tokens.lock().unwrap().clone();
    assert!(tokens[1].0 > tokens[0].0);
    let pause = tokens[1].1 - tokens[0].1;
    assert!(
        pause >= Duration::from_secs(1),
        "campaigned again after {pause:?}: it would spin"
    );
    assert!(
        *after_resign.lock().unwrap() <= 1,
        "the resigned leader went on running"
    );
    serving.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_a_key_without_expiry_and_its_removal() {
    // An election key someone set by hand, with no expiry: read as held for ever, and the
    // observer keeps reading (it used to overflow its clock arithmetic).
    let server = RedisServer::start();
    let observer = server
        .manager()
        .election("by-hand")
        .ttl(Duration::from_millis(600));
    server.command(&[
        "SET",
        "distlock:lock:{election:by-hand}",
        "0123456789abcdef0123456789abcdef:manual",
    ]);
    let mut leaders = observer.watch();
    assert!(
        seen_within(&mut leaders, Duration::from_secs(2), |l| {
            l.as_ref().and_then(|l| l.label.as_deref()) == Some("manual")
        })
        .await,
        "watch did not show the key set by hand"
    );
    server.command(&["DEL", "distlock:lock:{election:by-hand}"]);
    assert!(
        seen_within(&mut leaders, Duration::from_secs(2), |l| l.is_none()).await,
        "the observer stopped reading"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_waiting_candidate_costs_the_next_hand_off_one_claim_at_most() {
    // p0 leads for 3 s then resigns; p1 and p2 queue behind it in that order, and p1's
    // process is killed while it waits. The resignation hands the term to p1's entry (still
    // in its presence): its claim lapses, and p2 leads a claim and a quarter later at most.
    let _timed = distlock_tests::timed().await;
    let server = RedisServer::start();
    let name = "dead-candidate";
    let ttl = Duration::from_secs(10);
    let conn = server.client().await;
    let hold = Duration::from_secs(3);
    let p0 = Candidate::start(&server, name, "p0", ttl, hold, 1).await;
    let observer = server.manager().election(name).ttl(ttl);
    assert!(until_led_by(&observer, "p0", Duration::from_secs(5))
        .await
        .is_some());
    let mut p1 = Candidate::start(&server, name, "p1", ttl, hold, 1).await;
    distlock_tests::until_queued(&conn, "election:dead-candidate", 1).await;
    let p2 = Candidate::start(&server, name, "p2", ttl, hold, 1).await;
    distlock_tests::until_queued(&conn, "election:dead-candidate", 2).await;
    p1.child.start_kill().expect("SIGKILL p1");
    p1.child.wait().await.expect("p1 exited");
    // p0 resigns: the key is handed to dead p1 for a claim.
    assert!(
        until_led_by(&observer, "p1", Duration::from_secs(5))
            .await
            .is_some(),
        "p0 did not hand over to p1"
    );
    let handed = Instant::now();
    let led = until_led_by(&observer, "p2", Duration::from_secs(10)).await;
    let took = handed.elapsed();
    assert!(led.is_some(), "p2 never led");
    assert!(
        took <= HANDOFF_CLAIM * 5 / 4 + Duration::from_millis(500),
        "p2 led {took:?} after the hand-off to dead p1"
    );
    let mut conn = conn;
    assert_eq!(violations(&mut conn, name).await, 0);
    p0.assert_no_complaints();
    p2.assert_no_complaints();
}
