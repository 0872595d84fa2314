//! The leader-election demo (`cargo run --example leader -- --demo`), run as users run it, and
//! judged by its transcript: a leader killed with SIGKILL is replaced within ttl + ttl/3 (and
//! not before its term could have expired), a resigning leader hands over in well under a
//! second, and only the leader of the moment ticks, under its own term.

use std::process::Stdio;
use std::time::Duration;

mod common;

/// The demo's ttl (passed explicitly, so the limits below follow it).
const TTL: Duration = Duration::from_secs(3);
/// The longest accepted failover after the leader is killed: its ttl plus one renewal interval.
const FAILOVER_LIMIT: Duration = Duration::from_secs(4);
/// A killed leader renewed its term at most a renewal interval (ttl/3) before it died, so its
/// term is valid for at least 2/3 of the ttl after the kill: a take-over sooner than ttl/3 means
/// two valid terms at once (or a kill that was not one).
const FAILOVER_AT_LEAST: Duration = Duration::from_secs(1);
/// The longest accepted hand-off after a leader is asked to resign.
const HANDOFF_LIMIT: Duration = Duration::from_secs(1);

/// One line of the transcript that the checks read.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    /// `X leads (term T)`, printed by instance X.
    Leads { who: String, term: u64 },
    /// `tick N by X (term T)`.
    Tick { who: String, term: u64 },
    /// `killed X (leader, term T) at S`: S is when the kill was sent, which the line's own
    /// stamp (when it was printed) may follow by a few milliseconds on a loaded machine.
    Killed {
        who: String,
        term: u64,
        at: Duration,
    },
    /// `asking X to resign (closing its stdin)`.
    Asked { who: String },
}

/// `[   4.039s] rest` -> (4.039 s, "rest").
fn stamped(line: &str) -> Option<(Duration, &str)> {
    let (stamp, rest) = line.strip_prefix('[')?.split_once("s] ")?;
    Some((Duration::from_secs_f64(stamp.trim().parse().ok()?), rest))
}

/// `... (term 17)...` -> 17.
fn term_of(text: &str) -> Option<u64> {
    let (_, after) = text.split_once("term ")?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn parse(rest: &str) -> Option<Event> {
    let word = |text: &str| text.split(' ').next().map(str::to_owned);
    if let Some(after) = rest.strip_prefix("tick ") {
        let (_, by) = after.split_once(" by ")?;
        return Some(Event::Tick {
            who: word(by)?,
            term: term_of(by)?,
        });
    }
    if let Some(after) = rest.strip_prefix("killed ") {
        let (_, at) = after.rsplit_once(") at ")?;
        return Some(Event::Killed {
            who: word(after)?,
            term: term_of(after)?,
            at: Duration::from_secs_f64(at.strip_suffix('s')?.parse().ok()?),
        });
    }
    if let Some(after) = rest.strip_prefix("asking ") {
        return after.contains(" to resign (").then(|| Event::Asked {
            who: word(after).unwrap_or_default(),
        });
    }
    let (who, after) = rest.split_once(" leads (term ")?;
    let term = after.strip_suffix(')')?.parse().ok()?;
    (!who.contains(' ')).then(|| Event::Leads {
        who: who.to_owned(),
        term,
    })
}

/// What the checks measured.
#[derive(Debug)]
struct Measured {
    failover: Duration,
    handoff: Duration,
    leaders: Vec<String>,
}

/// Judges a demo transcript; the error says which rule it broke.
fn check(transcript: &str) -> Result<Measured, String> {
    let events: Vec<(Duration, Event)> = transcript
        .lines()
        .filter_map(stamped)
        .filter_map(|(at, rest)| Some((at, parse(rest)?)))
        .collect();
    let leads: Vec<(Duration, &str, u64)> = events
        .iter()
        .filter_map(|(at, event)| match event {
            Event::Leads { who, term } => Some((*at, who.as_str(), *term)),
            _ => None,
        })
        .collect();
    if leads.len() < 3 {
        return Err(format!("{} terms began, expected 3", leads.len()));
    }
    if let Some(pair) = leads.windows(2).find(|pair| pair[1].2 <= pair[0].2) {
        return Err(format!("a term did not rise: {pair:?}"));
    }
    let leaders: Vec<String> = leads.iter().map(|(_, who, _)| (*who).to_owned()).collect();
    if leaders[0] == leaders[1] || leaders[1] == leaders[2] || leaders[0] == leaders[2] {
        return Err(format!(
            "the three terms were not led by three instances: {leaders:?}"
        ));
    }

    // Only the leader of the moment ticks, under its own term; each leader ticks.
    let mut current: Option<(&str, u64)> = None;
    let mut ticked = std::collections::BTreeSet::new();
    let mut dead: Option<&str> = None;
    for (at, event) in &events {
        match event {
            Event::Leads { who, term } => current = Some((who, *term)),
            Event::Killed { who, .. } => dead = Some(who),
            Event::Tick { who, term } => {
                if dead == Some(who.as_str()) {
                    return Err(format!("{who} ticked at {at:?}, after it was killed"));
                }
                if current != Some((who.as_str(), *term)) {
                    return Err(format!(
                        "{who} ticked in term {term} at {at:?} while the leader was {current:?}"
                    ));
                }
                ticked.insert(*term);
            }
            Event::Asked { .. } => {}
        }
    }
    if let Some((_, who, term)) = leads.iter().find(|(_, _, term)| !ticked.contains(term)) {
        return Err(format!("{who} never ticked in its term {term}"));
    }

    // The kill: of the leader of the moment, under its term; the next term begins at its
    // expiry, within ttl + ttl/3.
    let (killed, killed_at, who, term) = events
        .iter()
        .enumerate()
        .find_map(|(i, (_, event))| match event {
            Event::Killed { who, term, at } => Some((i, *at, who, *term)),
            _ => None,
        })
        .ok_or("nobody was killed")?;
    if (who.as_str(), term) != (leads[0].1, leads[0].2) {
        return Err(format!(
            "killed {who} (term {term}), not the first leader {:?}",
            leads[0]
        ));
    }
    let (took_over_at, _, _) = leads[1];
    if took_over_at < killed_at {
        return Err("the second term began before the kill".to_owned());
    }
    let failover = took_over_at - killed_at;
    if failover > FAILOVER_LIMIT {
        return Err(format!(
            "the failover took {failover:?}, more than ttl + ttl/3 = {FAILOVER_LIMIT:?}"
        ));
    }
    if failover < FAILOVER_AT_LEAST {
        return Err(format!(
            "the second term began {failover:?} after the kill, while the first could still be \
             valid"
        ));
    }

    // The resignation: of the second leader; the third term begins at once.
    let (asked, asked_at, who) = events
        .iter()
        .enumerate()
        .find_map(|(i, (at, event))| match event {
            Event::Asked { who } => Some((i, *at, who)),
            _ => None,
        })
        .ok_or("nobody was asked to resign")?;
    if who != leads[1].1 || asked < killed {
        return Err(format!(
            "the first request to resign went to {who}, not the second leader {}",
            leads[1].1
        ));
    }
    let (handed_at, _, _) = leads[2];
    if handed_at < asked_at {
        return Err("the third term began before the second leader was asked to resign".to_owned());
    }
    let handoff = handed_at - asked_at;
    if handoff >= HANDOFF_LIMIT {
        return Err(format!(
            "the hand-off took {handoff:?}, not under {HANDOFF_LIMIT:?}"
        ));
    }
    Ok(Measured {
        failover,
        handoff,
        leaders,
    })
}

/// The port of the throwaway Redis the demo says it started.
fn throwaway_port(transcript: &str) -> Option<u16> {
    let line = transcript
        .lines()
        .find(|l| l.starts_with("Redis: a throwaway"))?;
    let (_, after) = line.split_once(" on port ")?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[tokio::test]
async fn a_killed_leader_is_replaced_within_ttl_and_a_resigning_one_hands_over_at_once() {
    let exe = common::example_binary("leader");
    let child = tokio::process::Command::new(&exe)
        .args(["--demo", "--ttl-ms", &TTL.as_millis().to_string()])
        // Its own throwaway redis-server: never a shared one.
        .env_remove("REDIS_URL")
        .env("RUST_LOG", "distlock_runtime=warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the demo");
    let output = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .expect("the demo finished within 90 s")
        .expect("the demo's output");
    let transcript = String::from_utf8_lossy(&output.stdout);
    println!("{transcript}");
    assert!(
        output.status.success(),
        "the demo failed: {}",
        output.status
    );

    let measured = check(&transcript).unwrap_or_else(|broken| panic!("{broken}\n{transcript}"));
    println!("measured: {measured:?}");
    // The demo's own verdict agrees with its transcript (to its millisecond stamps).
    let said = transcript
        .split_once("failover after kill -9: ")
        .and_then(|(_, after)| after.split_once('s'))
        .and_then(|(seconds, _)| seconds.parse::<f64>().ok())
        .expect("the demo's verdict line");
    assert!(
        (said - measured.failover.as_secs_f64()).abs() < 0.005,
        "the demo says the failover took {said}s, its transcript {measured:?}"
    );

    // The demo stopped the redis-server it started.
    let port = throwaway_port(&transcript).expect("the demo started a throwaway redis-server");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the demo's redis-server on port {port} still answers"
    );
}

/// A transcript shaped like the demo's, with the times and ticks to vary.
fn transcript(kill_to_takeover: f64, ask_to_handoff: f64, extra: &str) -> String {
    let takeover = 2.0 + kill_to_takeover;
    let asked = takeover + 1.6;
    format!(
        "Redis: a throwaway redis-server on port 1\n\
         [   0.100s] a leads (term 10)\n\
         [   0.101s] tick 1 by a (term 10)\n\
         [   0.601s] tick 2 by a (term 10)\n\
         [   2.000s] killed a (leader, term 10) at 2.000s\n\
         [{takeover:>8.3}s] b leads (term 20)\n\
         [{takeover:>8.3}s] tick 1 by b (term 20)\n\
         {extra}\
         [{asked:>8.3}s] asking b to resign (closing its stdin)\n\
         [{asked:>8.3}s] b resigned term 20\n\
         [{:>8.3}s] c leads (term 30)\n\
         [{:>8.3}s] tick 1 by c (term 30)\n",
        asked + ask_to_handoff,
        asked + ask_to_handoff,
    )
}

/// The checks above can fail: each broken rule is caught, and a sound transcript passes.
#[test]
fn the_transcript_check_catches_slow_failovers_slow_handoffs_and_overlapping_ticks() {
    let sound = check(&transcript(2.9, 0.01, "")).unwrap();
    assert_eq!(sound.leaders, ["a", "b", "c"]);
    assert!((sound.failover.as_secs_f64() - 2.9).abs() < 0.001);
    assert!((sound.handoff.as_secs_f64() - 0.01).abs() < 0.001);

    let slow = check(&transcript(4.2, 0.01, "")).unwrap_err();
    assert!(slow.contains("failover took"), "{slow}");
    let early = check(&transcript(0.2, 0.01, "")).unwrap_err();
    assert!(early.contains("could still be valid"), "{early}");
    let lazy = check(&transcript(2.9, 1.5, "")).unwrap_err();
    assert!(lazy.contains("hand-off took"), "{lazy}");

    // The killed leader ticking on, or the new one ticking under the old term.
    let zombie = check(&transcript(
        2.9,
        0.01,
        "[   5.500s] tick 3 by a (term 10)\n",
    ))
    .unwrap_err();
    assert!(zombie.contains("after it was killed"), "{zombie}");
    let stale = check(&transcript(
        2.9,
        0.01,
        "[   5.500s] tick 2 by b (term 10)\n",
    ))
    .unwrap_err();
    assert!(stale.contains("while the leader was"), "{stale}");
    let other = check(&transcript(
        2.9,
        0.01,
        "[   5.500s] tick 1 by c (term 20)\n",
    ))
    .unwrap_err();
    assert!(other.contains("while the leader was"), "{other}");
}
