//! What `top` shows, and how keys and readings change it: no I/O, so tests drive it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use distlock_runtime::LockMode;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::reading::{judge_claim, Before, Lock};

/// How long a row stays marked after its holder changed.
pub(crate) const MARKED_FOR: Duration = Duration::from_secs(3);

/// The screen's state.
pub(crate) struct Model {
    /// The last reading: every held lock (elections' keys included), by key.
    locks: Vec<Lock>,
    /// When the last reading was answered.
    read_at: Option<Instant>,
    status: Status,
    sort: Column,
    reverse: bool,
    filter: Filter,
    /// Keys whose holder (or fencing token) changed, and when that was seen.
    changed: HashMap<String, Instant>,
    /// Which servers hold the locks (`Redis 8.2.3 at ...`), once asked.
    servers: Option<String>,
}

/// Whether the last reading worked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Status {
    /// Nothing read yet.
    Connecting,
    /// The last reading worked.
    Live,
    /// The last reading failed (the rows are the last good reading's).
    Unavailable { error: String, since: Instant },
}

/// The column the locks are sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Column {
    Key,
    Mode,
    Holders,
    Remaining,
    FencingToken,
    Waiters,
}

impl Column {
    /// Every column, in the order `s` cycles through them.
    pub(crate) const ALL: [Column; 6] = [
        Column::Key,
        Column::Mode,
        Column::Holders,
        Column::Remaining,
        Column::FencingToken,
        Column::Waiters,
    ];

    /// Its header.
    pub(crate) fn title(self) -> &'static str {
        match self {
            Column::Key => "KEY",
            Column::Mode => "MODE",
            Column::Holders => "HOLDERS",
            Column::Remaining => "TTL",
            Column::FencingToken => "FENCING TOKEN",
            Column::Waiters => "WAITERS",
        }
    }

    fn next(self) -> Self {
        let at = Self::ALL.iter().position(|&c| c == self).unwrap_or(0);
        Self::ALL[(at + 1) % Self::ALL.len()]
    }
}

/// The key filter: the one applied, and the one being typed after `/`.
#[derive(Debug, Default)]
struct Filter {
    applied: String,
    editing: Option<String>,
}

/// What the loop does after a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Continue,
    Quit,
}

impl Model {
    pub(crate) fn new() -> Self {
        Self {
            locks: Vec::new(),
            read_at: None,
            status: Status::Connecting,
            sort: Column::Key,
            reverse: false,
            filter: Filter::default(),
            changed: HashMap::new(),
            servers: None,
        }
    }

    /// Which servers answered, in a few words (see `reading::servers`).
    pub(crate) fn served_by(&mut self, servers: String) {
        self.servers = Some(servers);
    }

    /// Which servers answered, once known.
    pub(crate) fn servers(&self) -> Option<&str> {
        self.servers.as_deref()
    }

    /// A reading answered at `now`: the locks held, or why Redis could not be read (the last
    /// rows stay). A lock's claim is believed as [`judge_claim`] says, against the last
    /// reading.
    pub(crate) fn refreshed(&mut self, read: Result<Vec<Lock>, String>, now: Instant) {
        let locks = match read {
            Ok(locks) => locks,
            Err(error) => {
                let since = match &self.status {
                    Status::Unavailable { since, .. } => *since,
                    _ => now,
                };
                self.status = Status::Unavailable { error, since };
                return;
            }
        };
        let first = self.read_at.is_none();
        let locks: Vec<Lock> = locks
            .into_iter()
            .map(|lock| {
                let before = match self.locks.iter().find(|l| l.key == lock.key) {
                    _ if first => Before::Unread,
                    Some(before) => Before::Held(before),
                    None => Before::Free,
                };
                judge_claim(before, lock)
            })
            .collect();
        for lock in &locks {
            let before = self.locks.iter().find(|l| l.key == lock.key);
            let same = before.is_some_and(|b| {
                b.fencing_token == lock.fencing_token
                    && b.owners.len() == lock.owners.len()
                    && lock.owners.iter().all(|o| b.held_by(o))
            });
            if !first && !same {
                self.changed.insert(lock.key.clone(), now);
            }
        }
        self.changed
            .retain(|_, at| now.duration_since(*at) < MARKED_FOR);
        self.locks = locks;
        self.read_at = Some(now);
        self.status = Status::Live;
    }

    /// Handles a key press.
    pub(crate) fn key(&mut self, key: KeyEvent) -> Action {
        if key.kind == KeyEventKind::Release {
            return Action::Continue;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        if let Some(typed) = &mut self.filter.editing {
            match key.code {
                KeyCode::Enter => {
                    self.filter.applied = std::mem::take(typed);
                    self.filter.editing = None;
                }
                KeyCode::Esc => self.filter.editing = None,
                KeyCode::Backspace => {
                    typed.pop();
                }
                KeyCode::Char(c) => typed.push(c),
                _ => {}
            }
            return Action::Continue;
        }
        match key.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Char('s') | KeyCode::Right | KeyCode::Tab => self.sort = self.sort.next(),
            KeyCode::Char('r') => self.reverse = !self.reverse,
            KeyCode::Char('/') => self.filter.editing = Some(self.filter.applied.clone()),
            KeyCode::Esc => self.filter.applied.clear(),
            _ => {}
        }
        Action::Continue
    }

    /// The locks shown (elections' keys apart), filtered and sorted.
    pub(crate) fn locks(&self) -> Vec<&Lock> {
        let mut shown: Vec<&Lock> = self
            .locks
            .iter()
            .filter(|l| l.election().is_none() && self.shows(&l.key))
            .collect();
        let rank = |mode: LockMode| match mode {
            LockMode::Exclusive => 0,
            LockMode::Shared => 1,
            LockMode::Permits(n) => 1 + u64::from(n),
        };
        // Stable, so rows of equal value stay by key.
        shown.sort_by(|a, b| {
            let order = match self.sort {
                Column::Key => a.key.cmp(&b.key),
                Column::Mode => rank(a.mode).cmp(&rank(b.mode)),
                Column::Holders => a.holders.cmp(&b.holders),
                Column::Remaining => a.remaining.cmp(&b.remaining),
                Column::FencingToken => a.fencing_token.cmp(&b.fencing_token),
                Column::Waiters => a.queued.len().cmp(&b.queued.len()),
            };
            if self.reverse {
                order.reverse()
            } else {
                order
            }
        });
        shown
    }

    /// The elections led, filtered (by key or name), by name.
    pub(crate) fn elections(&self) -> Vec<&Lock> {
        self.locks
            .iter()
            .filter(|l| {
                l.election()
                    .is_some_and(|name| self.shows(&l.key) || self.shows(name))
            })
            .collect()
    }

    fn shows(&self, key: &str) -> bool {
        matches(&self.filter.applied, key)
    }

    /// Whether the row of `key` is marked as changed at `now`.
    pub(crate) fn is_changed(&self, key: &str, now: Instant) -> bool {
        self.changed
            .get(key)
            .is_some_and(|at| now.duration_since(*at) < MARKED_FOR)
    }

    /// How long `lock` is held at `now`, counted down from its reading.
    pub(crate) fn remaining(&self, lock: &Lock, now: Instant) -> Duration {
        if lock.remaining == Duration::MAX {
            return Duration::MAX; // no expiry
        }
        let since = self
            .read_at
            .map_or(Duration::ZERO, |at| now.duration_since(at));
        lock.remaining.saturating_sub(since)
    }

    pub(crate) fn status(&self) -> &Status {
        &self.status
    }

    pub(crate) fn read_at(&self) -> Option<Instant> {
        self.read_at
    }

    pub(crate) fn sort(&self) -> (Column, bool) {
        (self.sort, self.reverse)
    }

    /// The filter applied, and the one being typed (after `/`, until Enter or Esc).
    pub(crate) fn filter(&self) -> (&str, Option<&str>) {
        (&self.filter.applied, self.filter.editing.as_deref())
    }

    /// How many locks (elections' keys apart) and elections were read, before the filter.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let elections = self.locks.iter().filter(|l| l.election().is_some()).count();
        (self.locks.len() - elections, elections)
    }
}

/// Whether `key` matches the filter `pattern`: a glob (`*`, `?`) when it has one, else a
/// substring; an empty one matches every key.
pub(crate) fn matches(pattern: &str, key: &str) -> bool {
    if !pattern.contains(['*', '?']) {
        return key.contains(pattern);
    }
    let (pattern, key): (Vec<char>, Vec<char>) = (pattern.chars().collect(), key.chars().collect());
    // Iterative glob match, backtracking to the last `*`.
    let (mut p, mut k) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while k < key.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, k));
                p += 1;
            }
            Some(&c) if c == '?' || c == key[k] => {
                p += 1;
                k += 1;
            }
            _ => match star {
                Some((sp, sk)) => {
                    p = sp + 1;
                    k = sk + 1;
                    star = Some((sp, sk + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reading::lock;

    fn press(model: &mut Model, code: KeyCode) -> Action {
        model.key(KeyEvent::new(code, KeyModifiers::NONE))
    }

    fn type_text(model: &mut Model, text: &str) {
        for c in text.chars() {
            press(model, KeyCode::Char(c));
        }
    }

    fn keys(locks: &[&Lock]) -> Vec<String> {
        locks.iter().map(|l| l.key.clone()).collect()
    }

    fn reading() -> Vec<Lock> {
        let mut a = lock("order:1", LockMode::Exclusive, &["aaaa1111:alpha"], 30);
        a.remaining = Duration::from_secs(5);
        let mut b = lock(
            "order:2",
            LockMode::Shared,
            &["bbbb2222:r1", "cccc3333:r2"],
            10,
        );
        b.remaining = Duration::from_secs(20);
        let mut c = lock("report", LockMode::Permits(3), &["dddd4444"], 20);
        c.remaining = Duration::from_secs(1);
        c.queued = a.owners.clone();
        let e = lock(
            "election:cron",
            LockMode::Exclusive,
            &["eeee5555:leader"],
            40,
        );
        vec![a, b, c, e]
    }

    #[test]
    fn sorting_cycles_columns_and_reverses() {
        let mut model = Model::new();
        model.refreshed(Ok(reading()), Instant::now());
        assert_eq!(keys(&model.locks()), ["order:1", "order:2", "report"]);
        press(&mut model, KeyCode::Char('s')); // mode
        assert_eq!(keys(&model.locks()), ["order:1", "order:2", "report"]);
        press(&mut model, KeyCode::Char('s')); // holders
        assert_eq!(keys(&model.locks()), ["order:1", "report", "order:2"]);
        press(&mut model, KeyCode::Char('s')); // ttl
        assert_eq!(model.sort(), (Column::Remaining, false));
        assert_eq!(keys(&model.locks()), ["report", "order:1", "order:2"]);
        press(&mut model, KeyCode::Char('r'));
        assert_eq!(keys(&model.locks()), ["order:2", "order:1", "report"]);
        press(&mut model, KeyCode::Char('s')); // fencing token, reversed
        assert_eq!(keys(&model.locks()), ["order:1", "report", "order:2"]);
        press(&mut model, KeyCode::Char('s')); // waiters, reversed
        assert_eq!(keys(&model.locks())[0], "report");
        press(&mut model, KeyCode::Char('s'));
        assert_eq!(model.sort(), (Column::Key, true));
        // Elections are apart.
        assert_eq!(keys(&model.elections()), ["election:cron"]);
    }

    #[test]
    fn the_filter_is_typed_after_a_slash_and_applied_on_enter() {
        let mut model = Model::new();
        model.refreshed(Ok(reading()), Instant::now());
        press(&mut model, KeyCode::Char('/'));
        type_text(&mut model, "order:*x");
        press(&mut model, KeyCode::Backspace);
        // Keys typed into the filter are not commands.
        assert_eq!(model.sort(), (Column::Key, false));
        assert_eq!(model.filter(), ("", Some("order:*")));
        assert_eq!(model.locks().len(), 3, "applied only on Enter");
        press(&mut model, KeyCode::Enter);
        assert_eq!(keys(&model.locks()), ["order:1", "order:2"]);
        assert!(model.elections().is_empty());
        // A substring; an election by its name.
        press(&mut model, KeyCode::Char('/'));
        for _ in 0..7 {
            press(&mut model, KeyCode::Backspace);
        }
        type_text(&mut model, "cro");
        press(&mut model, KeyCode::Enter);
        assert!(model.locks().is_empty());
        assert_eq!(keys(&model.elections()), ["election:cron"]);
        // Esc while typing keeps the applied filter; Esc after clears it.
        press(&mut model, KeyCode::Char('/'));
        type_text(&mut model, "zzz");
        press(&mut model, KeyCode::Esc);
        assert_eq!(model.filter(), ("cro", None));
        press(&mut model, KeyCode::Esc);
        assert_eq!(model.locks().len(), 3);
        assert_eq!(press(&mut model, KeyCode::Char('q')), Action::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(model.key(ctrl_c), Action::Quit);
    }

    #[test]
    fn globs_match_whole_keys_and_plain_text_anywhere() {
        assert!(matches("", "x"));
        assert!(matches("der", "order:1"));
        assert!(matches("order:*", "order:1"));
        assert!(!matches("order:*", "my-order:1"));
        assert!(matches("*:1?", "order:12"));
        assert!(matches("a*b*c", "aXbYbZc"));
        assert!(!matches("a*b*c", "aXbYbZ"));
    }

    #[test]
    fn a_new_holder_or_key_is_marked_for_a_while_and_an_outage_keeps_the_rows() {
        let start = Instant::now();
        let mut model = Model::new();
        model.refreshed(Ok(reading()), start);
        // The first reading marks nothing.
        assert!(!model.is_changed("order:1", start));
        let mut next = reading();
        next[0] = lock("order:1", LockMode::Exclusive, &["ffff6666:beta"], 31);
        next.push(lock("order:9", LockMode::Exclusive, &["aaaa1111"], 1));
        let later = start + Duration::from_secs(1);
        model.refreshed(Ok(next.clone()), later);
        assert!(model.is_changed("order:1", later));
        assert!(model.is_changed("order:9", later));
        assert!(!model.is_changed("order:2", later));
        assert!(!model.is_changed("order:1", later + MARKED_FOR));
        // Same holders again: still marked from before, not anew.
        model.refreshed(Ok(next), later + Duration::from_secs(1));
        assert!(!model.is_changed("order:1", later + MARKED_FOR));
        // An outage keeps the rows and says since when.
        let down = later + Duration::from_secs(2);
        model.refreshed(Err("refused".to_owned()), down);
        model.refreshed(
            Err("refused again".to_owned()),
            down + Duration::from_secs(1),
        );
        assert_eq!(
            model.status(),
            &Status::Unavailable {
                error: "refused again".to_owned(),
                since: down
            }
        );
        assert_eq!(model.locks().len(), 4);
        model.refreshed(Ok(Vec::new()), down + Duration::from_secs(2));
        assert_eq!(model.status(), &Status::Live);
        assert!(model.locks().is_empty());
    }

    #[test]
    fn a_claim_shows_after_a_new_owner_or_at_the_first_refresh_not_for_the_same_owner() {
        let start = Instant::now();
        let later = |s| start + Duration::from_secs(s);
        let claimed = |owner: &str, token| {
            let mut read = lock("order:1", LockMode::Exclusive, &[owner], token);
            read.claim = true;
            read
        };
        let claim = |model: &Model| model.locks()[0].claim;
        // At the first refresh, as read.
        let mut model = Model::new();
        model.refreshed(Ok(vec![claimed("bbbb2222:beta", 8)]), start);
        assert!(claim(&model));
        // Alpha's lease, then read as a claim (its expiry 2 s after its token): a lease.
        let mut model = Model::new();
        let alpha = lock("order:1", LockMode::Exclusive, &["aaaa1111:alpha"], 7);
        model.refreshed(Ok(vec![alpha]), start);
        model.refreshed(Ok(vec![claimed("aaaa1111:alpha", 7)]), later(1));
        assert!(!claim(&model));
        // Handed to beta while held: its claim, for as long as it reads so.
        model.refreshed(Ok(vec![claimed("bbbb2222:beta", 8)]), later(2));
        assert!(claim(&model));
        model.refreshed(Ok(vec![claimed("bbbb2222:beta", 8)]), later(3));
        assert!(claim(&model));
        // Free, then taken with an expiry that reads as a claim: a lease.
        model.refreshed(Ok(Vec::new()), later(4));
        model.refreshed(Ok(vec![claimed("cccc3333:gamma", 9)]), later(5));
        assert!(!claim(&model));
    }
}
