//! `distlock watch KEY...`: one line per change of a lock or of an election's leader, as it
//! happens.
//!
//! Each key is read with [`LockManager::inspect`] every `--interval-ms` (one script call per key
//! and interval), and the [`Tracker`] of the key turns two readings into the changes between
//! them: taken, released (freed before its expiry), expired (gone at its expiry), handed over (a
//! new holder without a free moment seen; until its fair recipient renews it, the lock is in
//! the hand-off's claim, believed as [`judge_claim`] says), taken up (the recipient extended the
//! claim to its ttl), holders joining and leaving a key held shared or as permits, and the fair
//! queue growing or shrinking. While Redis cannot be read, one line says so, and one more when
//! it answers again. A forced release of a followed key is printed as it
//! happens, with the holders it freed ([`LockManager::forced_releases`]): their managers end
//! their leases at once.

use std::io::Write;
use std::time::{Duration, Instant, SystemTime};

use distlock_runtime::{ForcedRelease, ForcedReleases, LockError, LockManager, LockMode};
use serde_json::json;

use crate::reading::{judge_claim, left, mode_name, names, secs, Before, Holder, Lock};
use crate::ELECTION_KEY;

/// What `watch` was asked.
pub(crate) struct Options {
    /// The lock keys to follow (an election's as `election:NAME`).
    pub(crate) keys: Vec<String>,
    /// How often each key is read.
    pub(crate) every: Duration,
    /// One JSON object per line instead of text.
    pub(crate) json: bool,
}

/// Follows `options.keys` until the process is stopped (or its output is closed); returns an
/// error only for one that retrying cannot fix (a bad key, Redis refusing the credentials).
pub(crate) async fn run(locks: &LockManager, options: Options) -> Result<(), LockError> {
    let mut out = Output {
        json: options.json,
        stdout: std::io::stdout(),
    };
    let mut trackers: Vec<Tracker> = options.keys.iter().map(|k| Tracker::new(k)).collect();
    let mut unavailable = false;
    // Heard on the manager's subscriber connection (none on a caller's pool: not here).
    let mut forced = locks.forced_releases().ok();
    loop {
        let round = Instant::now();
        for tracker in &mut trackers {
            let sent = Instant::now();
            match locks.inspect(&tracker.key).await {
                Ok(read) => {
                    if unavailable {
                        unavailable = false;
                        out.notice("available", "Redis answers again")?;
                    }
                    let read = read.as_ref().map(Lock::from);
                    let changes = tracker.observe(read, sent, Instant::now());
                    for change in &changes {
                        out.change(&tracker.key, change)?;
                    }
                }
                Err(error) if error.is_caller_bug() || error.is_misconfigured() => {
                    return Err(error)
                }
                Err(error) => {
                    if !unavailable {
                        unavailable = true;
                        out.notice(
                            "unavailable",
                            &format!("Redis unavailable: {error}; retrying"),
                        )?;
                    }
                    for tracker in &mut trackers {
                        tracker.outage();
                    }
                    break;
                }
            }
        }
        let next_round = tokio::time::Instant::from_std(round + options.every);
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next_round) => break,
                Some(release) = next_forced(&mut forced) => {
                    if let Some(tracker) = trackers.iter_mut().find(|t| t.key == release.key) {
                        tracker.forced();
                        let holders = release.holders;
                        out.change(&release.key, &Change::Forced { holders })?;
                    }
                }
            }
        }
    }
}

/// The next forced release heard, if anything listens.
async fn next_forced(forced: &mut Option<ForcedReleases>) -> Option<ForcedRelease> {
    match forced {
        Some(forced) => forced.next().await,
        None => std::future::pending().await,
    }
}

/// Where lines go: stdout, flushed after each line (an operator pipes it into a log).
struct Output {
    json: bool,
    stdout: std::io::Stdout,
}

impl Output {
    fn change(&mut self, key: &str, change: &Change) -> Result<(), LockError> {
        let at = SystemTime::now();
        let line = if self.json {
            change_json(at, key, change).to_string()
        } else {
            format!("{} {key} {}", utc(at), describe(key, change))
        };
        self.line(&line)
    }

    fn notice(&mut self, event: &str, text: &str) -> Result<(), LockError> {
        let at = SystemTime::now();
        let line = if self.json {
            json!({ "at": utc(at), "event": event, "message": text }).to_string()
        } else {
            format!("{} {text}", utc(at))
        };
        self.line(&line)
    }

    fn line(&mut self, line: &str) -> Result<(), LockError> {
        let mut out = self.stdout.lock();
        // A closed output (`| head`) ends the watch quietly.
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            std::process::exit(0);
        }
        Ok(())
    }
}

/// One change between two readings of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// The first reading, held.
    Held(Lock),
    /// The first reading, free.
    Free,
    /// Free, then held.
    Taken(Lock),
    /// Gone before its expiry: released, by `early` before it would have expired.
    Released { last: Lock, early: Duration },
    /// Gone at (or within a reading of) its expiry.
    Expired(Lock),
    /// Gone, seen after Redis was unavailable (a restart may have lost it).
    Gone(Lock),
    /// Held by someone else (or in another mode) without a free moment seen: a fair hand-off,
    /// or a release and a take within one interval.
    HandedOver { from: Lock, to: Lock },
    /// The recipient of a hand-off renewed it: its claim became a lease of its ttl.
    TakenUp(Lock),
    /// A lease joined a key held shared or as permits.
    Joined { owner: Holder, now: Lock },
    /// A lease left a key held shared or as permits (released or expired).
    Left { owner: Holder, now: Lock },
    /// The fair queue changed length.
    Queue { before: usize, now: Lock },
    /// Force-released (`distlock release --force`), freeing these holders.
    Forced { holders: Vec<String> },
}

/// What is known of one key: its last reading and when it expires at the latest.
pub(crate) struct Tracker {
    key: String,
    last: Last,
}

/// Where a key's readings stand.
enum Last {
    /// Not read yet.
    Unread,
    /// Free when last read.
    Free,
    /// Held when last read; free (if it is then) no earlier than `expires`, or never when
    /// `None` (a key without expiry). `outage`: Redis was unavailable since.
    Held {
        info: Lock,
        expires: Option<Instant>,
        outage: bool,
    },
}

impl Tracker {
    pub(crate) fn new(key: &str) -> Self {
        Self {
            key: key.to_owned(),
            last: Last::Unread,
        }
    }

    /// The key was force-released: free from now on, so a holder read next took it then (it
    /// is not handed over), and a key found free was not released again.
    pub(crate) fn forced(&mut self) {
        self.last = Last::Free;
    }

    /// Redis could not be read: a key found gone after this is [`Change::Gone`].
    pub(crate) fn outage(&mut self) {
        if let Last::Held { outage, .. } = &mut self.last {
            *outage = true;
        }
    }

    /// The changes since the last reading, given a reading `read` sent at `sent` and answered at
    /// `received`.
    pub(crate) fn observe(
        &mut self,
        read: Option<Lock>,
        sent: Instant,
        received: Instant,
    ) -> Vec<Change> {
        let before = match &self.last {
            Last::Unread => Before::Unread,
            Last::Free => Before::Free,
            Last::Held { info, .. } => Before::Held(info),
        };
        let read = read.map(|now| judge_claim(before, now));
        let last = std::mem::replace(&mut self.last, Last::Free);
        let mut changes = Vec::new();
        match (last, &read) {
            (Last::Unread, None) => changes.push(Change::Free),
            (Last::Unread, Some(info)) => changes.push(Change::Held(info.clone())),
            (Last::Free, None) => {}
            (Last::Free, Some(info)) => changes.push(Change::Taken(info.clone())),
            (
                Last::Held {
                    info,
                    expires,
                    outage,
                },
                None,
            ) => changes.push(if outage {
                Change::Gone(info)
            } else {
                // The reading happened before `received`; the key expires no earlier than
                // `expires` (the previous reading's PTTL counted from before it happened).
                match expires.map(|at| at.saturating_duration_since(received)) {
                    Some(Duration::ZERO) => Change::Expired(info),
                    Some(early) => Change::Released { last: info, early },
                    None => Change::Released {
                        last: info,
                        early: Duration::MAX,
                    },
                }
            }),
            (Last::Held { info: before, .. }, Some(now)) => held_changes(before, now, &mut changes),
        }
        if let Some(info) = read {
            self.last = Last::Held {
                expires: sent.checked_add(info.remaining),
                info,
                outage: false,
            };
        }
        changes
    }
}

/// The changes between two readings of a held key.
fn held_changes(before: Lock, now: &Lock, changes: &mut Vec<Change>) {
    let shared = |info: &Lock| info.mode != LockMode::Exclusive;
    let same_kind = matches!(
        (before.mode, now.mode),
        (LockMode::Exclusive, LockMode::Exclusive)
            | (LockMode::Shared, LockMode::Shared)
            | (LockMode::Permits(_), LockMode::Permits(_))
    );
    // Of a shared key or a semaphore, holders come and go one by one: joined and left.
    let replaced = !shared(now) && !now.owners.iter().any(|o| before.held_by(o));
    let taken_up = before.claim && !now.claim;
    if !same_kind || replaced {
        let queued = before.queued.len();
        changes.push(Change::HandedOver {
            from: before,
            to: now.clone(),
        });
        if queued != now.queued.len() {
            changes.push(Change::Queue {
                before: queued,
                now: now.clone(),
            });
        }
        return;
    }
    if taken_up {
        changes.push(Change::TakenUp(now.clone()));
    }
    if shared(now) {
        for owner in before.owners.iter().filter(|o| !now.held_by(o)) {
            changes.push(Change::Left {
                owner: owner.clone(),
                now: now.clone(),
            });
        }
        for owner in now.owners.iter().filter(|o| !before.held_by(o)) {
            changes.push(Change::Joined {
                owner: owner.clone(),
                now: now.clone(),
            });
        }
    }
    if before.queued.len() != now.queued.len() {
        changes.push(Change::Queue {
            before: before.queued.len(),
            now: now.clone(),
        });
    }
}

/// The queue, in order: `2 waiting: beta (…), gamma (…)`.
fn queue(info: &Lock) -> String {
    let names: Vec<String> = info.queued.iter().map(Holder::who).collect();
    if names.is_empty() {
        "0 waiting".to_owned()
    } else {
        format!("{} waiting: {}", names.len(), names.join(", "))
    }
}

/// What a text line says after the timestamp and key.
pub(crate) fn describe(key: &str, change: &Change) -> String {
    let election = key.starts_with(ELECTION_KEY);
    let state = |info: &Lock| {
        format!(
            "{} token {} {}",
            if election {
                "term".to_owned()
            } else {
                info.mode.to_string()
            },
            info.fencing_token,
            left(info, info.remaining)
        )
    };
    // A hand-off's recipient runs from the hand-off on, but its own ttl shows only from its
    // first renewal (a third of the claim in, never if it is done sooner).
    let claim = |info: &Lock, more: &str| {
        let who = info.owners.first().map_or("", Holder::name);
        format!(
            "in {who}'s hand-off claim: {}{more}; {who}'s own ttl from its first renewal",
            state(info)
        )
    };
    match change {
        Change::Held(info) if info.claim => format!(
            "handed over to {} ({})",
            names(&info.owners),
            claim(info, &format!(", {}", queue(info)))
        ),
        Change::Held(info) if election => {
            format!("led by {} ({})", names(&info.owners), state(info))
        }
        Change::Held(info) => format!(
            "held by {} ({}, {})",
            names(&info.owners),
            state(info),
            queue(info)
        ),
        Change::Free if election => "no leader".to_owned(),
        Change::Free => "free".to_owned(),
        Change::Taken(info) if election => {
            format!("elected {} ({})", names(&info.owners), state(info))
        }
        Change::Taken(info) => format!("taken by {} ({})", names(&info.owners), state(info)),
        Change::Released { last, early } => {
            let what = if election { "resigned" } else { "released" };
            let early = if *early == Duration::MAX {
                String::new()
            } else {
                format!(", {} before its expiry", secs(*early))
            };
            format!(
                "{what} by {} (token {}{early})",
                names(&last.owners),
                last.fencing_token
            )
        }
        Change::Expired(last) if last.claim => format!(
            "claim expired: {} (token {}) did not renew it (gone, or paused)",
            names(&last.owners),
            last.fencing_token
        ),
        Change::Expired(last) => format!(
            "expired: {} (token {}) did not renew",
            names(&last.owners),
            last.fencing_token
        ),
        Change::Gone(last) => format!(
            "gone while Redis was unavailable: {} (token {})",
            names(&last.owners),
            last.fencing_token
        ),
        Change::HandedOver { from, to } => format!(
            "{} from {} to {} ({})",
            if election {
                "leader changed"
            } else {
                "handed over"
            },
            names(&from.owners),
            names(&to.owners),
            if to.claim { claim(to, "") } else { state(to) }
        ),
        Change::TakenUp(info) => format!("taken up by {} ({})", names(&info.owners), state(info)),
        Change::Joined { owner, now } => format!(
            "joined by {} ({}, {} holders)",
            owner.who(),
            owner.mode,
            now.holders
        ),
        Change::Left { owner, now } => format!("left by {} ({} holders)", owner.who(), now.holders),
        Change::Queue { before, now } => {
            format!("waiters {before} -> {}", queue(now))
        }
        Change::Forced { holders } => {
            format!("force-released: {} lost the lease", holders.join(", "))
        }
    }
}

fn owner_json(owner: &Holder) -> serde_json::Value {
    json!({
        "label": owner.label,
        "token_prefix": owner.token_prefix,
        "mode": mode_name(owner.mode),
        "permits": match owner.mode { LockMode::Permits(n) => Some(n), _ => None },
    })
}

fn info_json(info: &Lock) -> serde_json::Value {
    json!({
        "mode": mode_name(info.mode),
        "fencing_token": info.fencing_token,
        "remaining_ms": crate::millis(info.remaining),
        "handoff_claim": info.claim,
        "holders": info.owners.iter().map(owner_json).collect::<Vec<_>>(),
        "queued": info.queued.iter().map(owner_json).collect::<Vec<_>>(),
    })
}

/// A change as one JSON object: `at`, `key`, `election` (the name, for an election's key),
/// `event`, and the lock's state after it (`lock`) or before it (`last`).
pub(crate) fn change_json(at: SystemTime, key: &str, change: &Change) -> serde_json::Value {
    let (event, fields) = match change {
        Change::Held(info) => ("held", json!({ "lock": info_json(info) })),
        Change::Free => ("free", json!({})),
        Change::Taken(info) => ("taken", json!({ "lock": info_json(info) })),
        Change::Released { last, early } => (
            "released",
            json!({
                "last": info_json(last),
                "early_ms": (*early != Duration::MAX).then(|| crate::millis(*early)),
            }),
        ),
        Change::Expired(last) => ("expired", json!({ "last": info_json(last) })),
        Change::Gone(last) => ("gone", json!({ "last": info_json(last) })),
        Change::HandedOver { from, to } => (
            "handed_over",
            json!({ "last": info_json(from), "lock": info_json(to) }),
        ),
        Change::TakenUp(info) => ("taken_up", json!({ "lock": info_json(info) })),
        Change::Joined { owner, now } => (
            "joined",
            json!({ "owner": owner_json(owner), "lock": info_json(now) }),
        ),
        Change::Left { owner, now } => (
            "left",
            json!({ "owner": owner_json(owner), "lock": info_json(now) }),
        ),
        Change::Queue { before, now } => (
            "waiters",
            json!({ "before": before, "lock": info_json(now) }),
        ),
        Change::Forced { holders } => ("forced", json!({ "holders": holders })),
    };
    let mut object = json!({
        "at": utc(at),
        "key": key,
        "election": key.strip_prefix(ELECTION_KEY),
        "event": event,
    });
    if let (Some(object), serde_json::Value::Object(fields)) = (object.as_object_mut(), fields) {
        object.extend(fields);
    }
    object
}

/// `2026-11-26T06:21:18.123Z`.
pub(crate) fn utc(at: SystemTime) -> String {
    let since = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::reading::lock as info;

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn a_key_is_taken_released_early_expired_or_handed_over() {
        let t = Instant::now();
        let mut key = Tracker::new("order:42");
        assert_eq!(key.observe(None, t, t), [Change::Free]);
        let alpha = info("order:42", LockMode::Exclusive, &["aaaa1111:alpha"], 7);
        let taken = key.observe(Some(alpha.clone()), at(t, 100), at(t, 101));
        assert_eq!(taken, [Change::Taken(alpha.clone())]);
        // Same holder, same token: nothing to say.
        assert!(key
            .observe(Some(alpha.clone()), at(t, 200), at(t, 201))
            .is_empty());
        // Gone 9.7 s before its ttl (10 s from 200 ms) ran out: released.
        let released = key.observe(None, at(t, 300), at(t, 301));
        assert!(
            matches!(&released[..], [Change::Released { early, .. }] if early.as_millis() == 9_899),
            "{released:?}"
        );
        // Gone at its expiry.
        key.observe(Some(alpha.clone()), at(t, 400), at(t, 401));
        let expired = key.observe(None, at(t, 10_400), at(t, 10_450));
        assert_eq!(expired, [Change::Expired(alpha.clone())]);
        // Another holder with no free reading between: handed over.
        key.observe(Some(alpha.clone()), at(t, 11_000), at(t, 11_001));
        let beta = info("order:42", LockMode::Exclusive, &["bbbb2222:beta"], 8);
        let handed = key.observe(Some(beta.clone()), at(t, 11_100), at(t, 11_101));
        assert_eq!(
            handed,
            [Change::HandedOver {
                from: alpha,
                to: beta.clone()
            }]
        );
        // Gone after an outage: not called a release.
        key.outage();
        assert_eq!(
            key.observe(None, at(t, 12_000), at(t, 12_001)),
            [Change::Gone(beta)]
        );
    }

    #[test]
    fn holders_join_and_leave_a_shared_key_and_the_queue_is_followed() {
        let t = Instant::now();
        let mut key = Tracker::new("report");
        let one = info("report", LockMode::Shared, &["aaaa1111:r1"], 3);
        key.observe(Some(one.clone()), t, t);
        let two = info(
            "report",
            LockMode::Shared,
            &["aaaa1111:r1", "bbbb2222:r2"],
            4,
        );
        let joined = key.observe(Some(two.clone()), t, t);
        assert!(
            matches!(&joined[..], [Change::Joined { owner, .. }] if owner.label.as_deref() == Some("r2")),
            "{joined:?}"
        );
        let mut left = info("report", LockMode::Shared, &["bbbb2222:r2"], 4);
        left.queued.clone_from(&one.owners);
        let changes = key.observe(Some(left.clone()), t, t);
        assert!(
            matches!(&changes[..], [Change::Left { owner, .. }, Change::Queue { before: 0, .. }] if owner.token_prefix == "aaaa1111"),
            "{changes:?}"
        );
        // Shared, then exclusive: handed over.
        let writer = info("report", LockMode::Exclusive, &["bbbb2222:r2"], 5);
        let changes = key.observe(Some(writer), t, t);
        assert!(
            matches!(
                &changes[..],
                [Change::HandedOver { .. }, Change::Queue { before: 1, .. }]
            ),
            "{changes:?}"
        );
    }

    #[test]
    fn lines_name_the_event_the_key_and_an_elections_leader() {
        let alpha = info("election:cron", LockMode::Exclusive, &["aaaa1111:alpha"], 9);
        let text = describe("election:cron", &Change::Taken(alpha.clone()));
        assert_eq!(text, "elected alpha (aaaa1111) (term token 9 ttl 10.0s)");
        let text = describe("order:1", &Change::Taken(alpha.clone()));
        assert_eq!(
            text,
            "taken by alpha (aaaa1111) (exclusive token 9 ttl 10.0s)"
        );
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_000_000_123);
        let object = change_json(at, "election:cron", &Change::Expired(alpha));
        assert_eq!(object["event"], "expired");
        assert_eq!(object["election"], "cron");
        assert_eq!(object["at"], "2026-11-18T11:06:40.123Z");
        assert_eq!(object["last"]["holders"][0]["label"], "alpha");
        assert_eq!(utc(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // A leap day.
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(utc(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn a_hand_off_in_its_claim_says_so_until_its_recipient_takes_it_up() {
        let t = Instant::now();
        let mut key = Tracker::new("order:42");
        let alpha = info("order:42", LockMode::Exclusive, &["aaaa1111:alpha"], 7);
        key.observe(Some(alpha.clone()), t, t);
        let mut claim = info("order:42", LockMode::Exclusive, &["bbbb2222:beta"], 8);
        claim.claim = true;
        claim.remaining = Duration::from_millis(1_900);
        let handed = key.observe(Some(claim.clone()), at(t, 100), at(t, 101));
        let change = Change::HandedOver {
            from: alpha,
            to: claim.clone(),
        };
        assert_eq!(handed, std::slice::from_ref(&change));
        assert_eq!(
            describe("order:42", &change),
            "handed over from alpha (aaaa1111) to beta (bbbb2222) (in beta's hand-off claim: \
             exclusive token 8 claim 1.9s; beta's own ttl from its first renewal)"
        );
        let stamp = SystemTime::UNIX_EPOCH;
        let object = change_json(stamp, "order:42", &change);
        assert_eq!(object["event"], "handed_over");
        assert_eq!(object["lock"]["handoff_claim"], true, "{object}");
        assert_eq!(object["last"]["handoff_claim"], false, "{object}");
        // The same claim read again: nothing to say.
        assert!(key
            .observe(Some(claim.clone()), at(t, 200), at(t, 201))
            .is_empty());
        // Extended to the recipient's ttl: taken up, with its lease.
        let mut lease = claim.clone();
        lease.claim = false;
        lease.remaining = Duration::from_secs(30);
        let taken = key.observe(Some(lease.clone()), at(t, 300), at(t, 301));
        assert_eq!(taken, [Change::TakenUp(lease.clone())]);
        assert_eq!(
            describe("order:42", &taken[0]),
            "taken up by beta (bbbb2222) (exclusive token 8 ttl 30.0s)"
        );
        let object = change_json(stamp, "order:42", &taken[0]);
        assert_eq!(object["event"], "taken_up");
        assert_eq!(object["lock"]["remaining_ms"], 30_000, "{object}");
        // A claim found at the start, and one that runs out.
        assert_eq!(
            describe("order:42", &Change::Held(claim.clone())),
            "handed over to beta (bbbb2222) (in beta's hand-off claim: exclusive token 8 claim \
             1.9s, 0 waiting; beta's own ttl from its first renewal)"
        );
        assert_eq!(
            describe("order:42", &Change::Expired(claim)),
            "claim expired: beta (bbbb2222) (token 8) did not renew it (gone, or paused)"
        );
        // A lease is shown with its ttl.
        assert_eq!(
            describe("order:42", &Change::Held(lease)),
            "held by beta (bbbb2222) (exclusive token 8 ttl 30.0s, 0 waiting)"
        );
    }

    #[test]
    fn a_claim_is_believed_only_from_a_hand_off_and_runs_out_as_a_claim_only_then() {
        let t = Instant::now();
        let mut key = Tracker::new("order:42");
        let alpha = info("order:42", LockMode::Exclusive, &["aaaa1111:alpha"], 7);
        key.observe(Some(alpha.clone()), t, t);
        // Alpha's own lease reads as a claim (its expiry 2 s after its token), then renewed:
        // nothing to say, neither a hand-off's claim nor a take-up.
        let mut coincidence = alpha.clone();
        coincidence.claim = true;
        coincidence.remaining = Duration::from_millis(1_900);
        assert!(key
            .observe(Some(coincidence.clone()), at(t, 100), at(t, 101))
            .is_empty());
        assert!(key
            .observe(Some(alpha.clone()), at(t, 200), at(t, 201))
            .is_empty());
        // Read as a claim, not renewed and gone at its expiry: it expired, as a lease does.
        key.observe(Some(coincidence.clone()), at(t, 300), at(t, 301));
        let gone = key.observe(None, at(t, 2_300), at(t, 2_301));
        assert!(
            matches!(&gone[..], [Change::Expired(last)] if !last.claim),
            "{gone:?}"
        );
        assert_eq!(
            describe("order:42", &gone[0]),
            "expired: alpha (aaaa1111) (token 7) did not renew"
        );
        // Taken from free with an expiry that reads as a claim: taken, with its ttl.
        let taken = key.observe(Some(coincidence), at(t, 2_400), at(t, 2_401));
        assert!(
            matches!(&taken[..], [Change::Taken(lock)] if !lock.claim),
            "{taken:?}"
        );
        // A real hand-off's claim that runs out: the claim expired.
        let mut claim = info("order:42", LockMode::Exclusive, &["bbbb2222:beta"], 8);
        claim.claim = true;
        claim.remaining = Duration::from_millis(2_000);
        key.observe(Some(claim.clone()), at(t, 2_500), at(t, 2_501));
        let lapsed = key.observe(None, at(t, 4_600), at(t, 4_601));
        assert_eq!(lapsed, [Change::Expired(claim)]);
        assert!(
            describe("order:42", &lapsed[0]).starts_with("claim expired: beta"),
            "{lapsed:?}"
        );
    }
}
