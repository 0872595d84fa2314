//! Histories of lock operations, and a checker that judges them (Jepsen's method).
//!
//! A history is what each process did, one [`Event`] a line in a file of its own, timed on one
//! clock ([`now_us`]): each acquire's call and answer, the validity its client believed it had,
//! its fenced writes to a separate store, its body's end, its release, and the faults the test
//! made. [`read_histories`] merges the files; [`check`] reports leases believed held at once on
//! a key, fenced writes accepted out of token order or under one token by two leases, bodies
//! acting past their validity, tokens going backwards in real time, and how long each process
//! took to get a lease again after each fault was healed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::File;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Now on CLOCK_MONOTONIC, in microseconds: one clock for every process on the machine, so
/// their histories merge. rustix reads it without libc, so libfaketime's clock faults leave it
/// alone.
pub fn now_us() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    // CLOCK_MONOTONIC is never negative.
    now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000
}

/// One line of a history. Times are [`now_us`] values; `op` numbers one acquire and what
/// followed from it, unique within a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// An acquire was called.
    Invoke {
        /// Who called it.
        process: String,
        /// The acquire.
        op: u64,
        /// The lock's key.
        key: String,
        /// When it was called.
        at: u64,
    },
    /// An acquire returned a lease.
    Granted {
        /// Who holds it.
        process: String,
        /// The acquire.
        op: u64,
        /// The lock's key.
        key: String,
        /// The lease's fencing token.
        token: u64,
        /// When the acquire returned.
        at: u64,
        /// The end of the lease's validity as the client computed it (`at` + its remaining time).
        valid_until: u64,
    },
    /// An acquire returned an error.
    Failed {
        /// Who called it.
        process: String,
        /// The acquire.
        op: u64,
        /// The lock's key.
        key: String,
        /// When it returned.
        at: u64,
        /// What kind of error: `busy`, `unavailable`, `replication`, `misconfigured`, `other`.
        class: String,
        /// The error's message.
        message: String,
    },
    /// At `at`, lease `op` was valid until `valid_until` (after renewals; a later one supersedes
    /// an earlier one's end).
    Valid {
        /// Who holds it.
        process: String,
        /// The lease's acquire.
        op: u64,
        /// When the client looked.
        at: u64,
        /// The end of its validity then.
        valid_until: u64,
    },
    /// A fenced write to the store, under lease `op`.
    Write {
        /// Who wrote.
        process: String,
        /// The lease's acquire.
        op: u64,
        /// The lock's key.
        key: String,
        /// The fencing token sent.
        token: u64,
        /// When the write was sent.
        invoked: u64,
        /// When its answer came (or the client gave up).
        answered: u64,
        /// What the store said.
        outcome: WriteOutcome,
    },
    /// Lease `op`'s body stopped running (it finished, or was stopped because the lease was lost).
    BodyEnd {
        /// Who ran it.
        process: String,
        /// The lease's acquire.
        op: u64,
        /// When it stopped.
        at: u64,
    },
    /// The client learned that lease `op` was lost.
    Lost {
        /// Who held it.
        process: String,
        /// The lease's acquire.
        op: u64,
        /// When it learned.
        at: u64,
    },
    /// Lease `op` was released.
    Released {
        /// Who held it.
        process: String,
        /// The lease's acquire.
        op: u64,
        /// When the release was called.
        invoked: u64,
        /// When it returned.
        answered: u64,
        /// Whether it returned `Ok`.
        ok: bool,
    },
    /// The test began or healed a fault.
    Fault {
        /// Who made it (the test).
        process: String,
        /// Which fault.
        name: String,
        /// When.
        at: u64,
        /// Began or healed.
        phase: FaultPhase,
    },
}

/// What the fenced store answered a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Accepted: the token was not below the newest the store had seen. `seq` orders the
    /// store's acceptances.
    Accepted {
        /// The acceptance's sequence number.
        seq: u64,
    },
    /// Refused: the store had seen a newer token.
    Refused,
    /// No answer: the write may or may not have been applied.
    Unknown,
}

/// Whether a [`Event::Fault`] began or was healed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultPhase {
    /// The fault began.
    Start,
    /// The fault was healed.
    Heal,
}

impl Event {
    /// Who recorded it.
    pub fn process(&self) -> &str {
        match self {
            Event::Invoke { process, .. }
            | Event::Granted { process, .. }
            | Event::Failed { process, .. }
            | Event::Valid { process, .. }
            | Event::Write { process, .. }
            | Event::BodyEnd { process, .. }
            | Event::Lost { process, .. }
            | Event::Released { process, .. }
            | Event::Fault { process, .. } => process,
        }
    }

    /// When it happened: its `at`, or its `invoked` for a call with an answer.
    pub fn at(&self) -> u64 {
        match self {
            Event::Invoke { at, .. }
            | Event::Granted { at, .. }
            | Event::Failed { at, .. }
            | Event::Valid { at, .. }
            | Event::BodyEnd { at, .. }
            | Event::Lost { at, .. }
            | Event::Fault { at, .. } => *at,
            Event::Write { invoked, .. } | Event::Released { invoked, .. } => *invoked,
        }
    }
}

/// The event's history line (without its newline): `KIND field=value ...`, text percent-escaped.
impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = Text(self.process());
        match self {
            Event::Invoke { op, key, at, .. } => {
                write!(f, "invoke process={p} op={op} key={} at={at}", Text(key))
            }
            Event::Granted {
                op,
                key,
                token,
                at,
                valid_until,
                ..
            } => write!(
                f,
                "granted process={p} op={op} key={} token={token} at={at} valid_until={valid_until}",
                Text(key)
            ),
            Event::Failed {
                op,
                key,
                at,
                class,
                message,
                ..
            } => write!(
                f,
                "failed process={p} op={op} key={} at={at} class={} message={}",
                Text(key),
                Text(class),
                Text(message)
            ),
            Event::Valid {
                op,
                at,
                valid_until,
                ..
            } => write!(f, "valid process={p} op={op} at={at} valid_until={valid_until}"),
            Event::Write {
                op,
                key,
                token,
                invoked,
                answered,
                outcome,
                ..
            } => {
                write!(
                    f,
                    "write process={p} op={op} key={} token={token} invoked={invoked} answered={answered} ",
                    Text(key)
                )?;
                match outcome {
                    WriteOutcome::Accepted { seq } => write!(f, "outcome=accepted seq={seq}"),
                    WriteOutcome::Refused => write!(f, "outcome=refused"),
                    WriteOutcome::Unknown => write!(f, "outcome=unknown"),
                }
            }
            Event::BodyEnd { op, at, .. } => write!(f, "body_end process={p} op={op} at={at}"),
            Event::Lost { op, at, .. } => write!(f, "lost process={p} op={op} at={at}"),
            Event::Released {
                op,
                invoked,
                answered,
                ok,
                ..
            } => write!(
                f,
                "released process={p} op={op} invoked={invoked} answered={answered} ok={ok}"
            ),
            Event::Fault {
                name, at, phase, ..
            } => {
                let phase = match phase {
                    FaultPhase::Start => "start",
                    FaultPhase::Heal => "heal",
                };
                write!(f, "fault process={p} name={} at={at} phase={phase}", Text(name))
            }
        }
    }
}

/// A text field of a line: `%`, and whitespace so that fields stay words, as `%XX` per byte.
struct Text<'a>(&'a str);

impl fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if c == '%' || c.is_whitespace() {
                for byte in c.encode_utf8(&mut [0; 4]).bytes() {
                    write!(f, "%{byte:02X}")?;
                }
            } else {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

/// The text a [`Text`] wrote.
fn unescape(word: &str) -> Result<String, String> {
    let mut bytes = Vec::with_capacity(word.len());
    let mut rest = word.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%' {
            let hex = tail
                .get(..2)
                .filter(|hex| hex.iter().all(u8::is_ascii_hexdigit))
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| format!("bad escape in `{word}`"))?;
            bytes.push(hex);
            rest = &tail[2..];
        } else {
            bytes.push(byte);
            rest = tail;
        }
    }
    String::from_utf8(bytes).map_err(|_| format!("`{word}` is not UTF-8"))
}

/// A line's `field=value` words.
struct Fields<'a>(Vec<(&'a str, &'a str)>);

impl Fields<'_> {
    fn raw(&self, name: &str) -> Result<&str, String> {
        self.0
            .iter()
            .find(|(field, _)| *field == name)
            .map(|(_, value)| *value)
            .ok_or_else(|| format!("no `{name}`"))
    }

    fn text(&self, name: &str) -> Result<String, String> {
        unescape(self.raw(name)?)
    }

    fn num(&self, name: &str) -> Result<u64, String> {
        let value = self.raw(name)?;
        value
            .parse()
            .map_err(|_| format!("`{name}={value}` is not a number"))
    }
}

/// The event a history line (without its newline) records.
fn parse_line(line: &str) -> Result<Event, String> {
    let mut words = line.split_whitespace();
    let kind = words.next().ok_or("empty line")?;
    let fields = Fields(
        words
            .map(|word| {
                word.split_once('=')
                    .ok_or_else(|| format!("`{word}` is not field=value"))
            })
            .collect::<Result<_, _>>()?,
    );
    let process = fields.text("process")?;
    Ok(match kind {
        "invoke" => Event::Invoke {
            process,
            op: fields.num("op")?,
            key: fields.text("key")?,
            at: fields.num("at")?,
        },
        "granted" => Event::Granted {
            process,
            op: fields.num("op")?,
            key: fields.text("key")?,
            token: fields.num("token")?,
            at: fields.num("at")?,
            valid_until: fields.num("valid_until")?,
        },
        "failed" => Event::Failed {
            process,
            op: fields.num("op")?,
            key: fields.text("key")?,
            at: fields.num("at")?,
            class: fields.text("class")?,
            message: fields.text("message")?,
        },
        "valid" => Event::Valid {
            process,
            op: fields.num("op")?,
            at: fields.num("at")?,
            valid_until: fields.num("valid_until")?,
        },
        "write" => Event::Write {
            process,
            op: fields.num("op")?,
            key: fields.text("key")?,
            token: fields.num("token")?,
            invoked: fields.num("invoked")?,
            answered: fields.num("answered")?,
            outcome: match fields.raw("outcome")? {
                "accepted" => WriteOutcome::Accepted {
                    seq: fields.num("seq")?,
                },
                "refused" => WriteOutcome::Refused,
                "unknown" => WriteOutcome::Unknown,
                other => return Err(format!("unknown outcome `{other}`")),
            },
        },
        "body_end" => Event::BodyEnd {
            process,
            op: fields.num("op")?,
            at: fields.num("at")?,
        },
        "lost" => Event::Lost {
            process,
            op: fields.num("op")?,
            at: fields.num("at")?,
        },
        "released" => Event::Released {
            process,
            op: fields.num("op")?,
            invoked: fields.num("invoked")?,
            answered: fields.num("answered")?,
            ok: match fields.raw("ok")? {
                "true" => true,
                "false" => false,
                other => return Err(format!("`ok={other}` is not a bool")),
            },
        },
        "fault" => Event::Fault {
            process,
            name: fields.text("name")?,
            at: fields.num("at")?,
            phase: match fields.raw("phase")? {
                "start" => FaultPhase::Start,
                "heal" => FaultPhase::Heal,
                other => return Err(format!("unknown phase `{other}`")),
            },
        },
        other => return Err(format!("unknown event `{other}`")),
    })
}

/// A malformed line of a history file.
#[derive(Debug, thiserror::Error)]
#[error("{}:{line}: {reason}", path.display())]
pub struct ParseError {
    /// The file.
    pub path: PathBuf,
    /// The line's number, from 1.
    pub line: usize,
    /// What is wrong with it.
    pub reason: String,
}

/// The events of the history files at `paths`, merged and sorted by [`Event::at`] (stably, so a
/// process's events at one microsecond keep their order). A last line without its newline (its
/// process was killed while writing it) is left out.
///
/// # Errors
/// When a file cannot be read (the error names it), or with a [`ParseError`] (kind
/// `InvalidData`) for a malformed line.
pub fn read_histories(paths: &[PathBuf]) -> io::Result<Vec<Event>> {
    let mut events = Vec::new();
    for path in paths {
        let bytes = std::fs::read(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let lines = bytes.split_inclusive(|&b| b == b'\n');
        for (number, line) in lines.enumerate() {
            let Some(line) = line.strip_suffix(b"\n") else {
                break;
            };
            let malformed = |reason| {
                let line = number + 1;
                let path = path.clone();
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    ParseError { path, line, reason },
                )
            };
            let line = std::str::from_utf8(line).map_err(|_| malformed("not UTF-8".into()))?;
            events.push(parse_line(line).map_err(malformed)?);
        }
    }
    events.sort_by_key(Event::at);
    Ok(events)
}

/// Writes one process's history to a file, a line per event, each written whole at once so a
/// process killed at any moment leaves every earlier line in the file. Shared by the process's
/// tasks (`&self`). Its methods other than [`Recorder::record`] stamp the event with the
/// process's name and the time ([`now_us`]).
pub struct Recorder {
    process: String,
    path: PathBuf,
    file: Mutex<File>,
    ops: AtomicU64,
}

impl Recorder {
    /// A recorder of `process`'s events into a new file at `path` (replacing one there: a
    /// restarted process takes a new name, as its op numbers start again).
    ///
    /// # Errors
    /// When the file cannot be created.
    pub fn create(path: impl AsRef<Path>, process: &str) -> io::Result<Self> {
        let path = path.as_ref().to_owned();
        Ok(Self {
            process: process.to_owned(),
            file: Mutex::new(File::create(&path)?),
            path,
            ops: AtomicU64::new(0),
        })
    }

    /// The process's name.
    pub fn process(&self) -> &str {
        &self.process
    }

    /// A new op number for an acquire: 1, 2, ...
    pub fn next_op(&self) -> u64 {
        self.ops.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Appends `event` to the file as it is.
    ///
    /// # Panics
    /// When the file cannot be written: a history missing a line would mislead its checker.
    pub fn record(&self, event: &Event) {
        let line = format!("{event}\n");
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = file.write_all(line.as_bytes()) {
            panic!("writing history {}: {e}", self.path.display());
        }
    }

    /// Records that acquire `op` of `key` is called now.
    pub fn invoke(&self, op: u64, key: &str) {
        self.record(&Event::Invoke {
            process: self.process.clone(),
            op,
            key: key.to_owned(),
            at: now_us(),
        });
    }

    /// Records that acquire `op` returned a lease with fencing token `token`, valid for
    /// `remaining` from now.
    pub fn granted(&self, op: u64, key: &str, token: u64, remaining: Duration) {
        let at = now_us();
        self.record(&Event::Granted {
            process: self.process.clone(),
            op,
            key: key.to_owned(),
            token,
            at,
            valid_until: at.saturating_add(micros(remaining)),
        });
    }

    /// Records that acquire `op` returned an error of `class` now.
    pub fn failed(&self, op: u64, key: &str, class: &str, message: &str) {
        self.record(&Event::Failed {
            process: self.process.clone(),
            op,
            key: key.to_owned(),
            at: now_us(),
            class: class.to_owned(),
            message: message.to_owned(),
        });
    }

    /// Records that lease `op` is valid for `remaining` from now.
    pub fn valid(&self, op: u64, remaining: Duration) {
        let at = now_us();
        self.record(&Event::Valid {
            process: self.process.clone(),
            op,
            at,
            valid_until: at.saturating_add(micros(remaining)),
        });
    }

    /// Records a fenced write under lease `op` sent at `invoked` and answered now.
    pub fn write(&self, op: u64, key: &str, token: u64, invoked: u64, outcome: WriteOutcome) {
        self.record(&Event::Write {
            process: self.process.clone(),
            op,
            key: key.to_owned(),
            token,
            invoked,
            answered: now_us(),
            outcome,
        });
    }

    /// Records that lease `op`'s body stopped now.
    pub fn body_end(&self, op: u64) {
        self.record(&Event::BodyEnd {
            process: self.process.clone(),
            op,
            at: now_us(),
        });
    }

    /// Records that the client learned now that lease `op` was lost.
    pub fn lost(&self, op: u64) {
        self.record(&Event::Lost {
            process: self.process.clone(),
            op,
            at: now_us(),
        });
    }

    /// Records lease `op`'s release, called at `invoked` and returned now.
    pub fn released(&self, op: u64, invoked: u64, ok: bool) {
        self.record(&Event::Released {
            process: self.process.clone(),
            op,
            invoked,
            answered: now_us(),
            ok,
        });
    }

    /// Records that fault `name` began or was healed now.
    pub fn fault(&self, name: &str, phase: FaultPhase) {
        self.record(&Event::Fault {
            process: self.process.clone(),
            name: name.to_owned(),
            at: now_us(),
            phase,
        });
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// What [`check`] holds a history to.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// One holder at a time per key. When false (a semaphore, readers), overlapping leases are
    /// still listed but are not violations.
    pub exclusive: bool,
    /// How long a body may go on past its lease's validity before that counts (stopping a body
    /// is not instant). Writes get none.
    pub body_end_slack_us: u64,
}

/// Exclusive, with 5 ms of slack for bodies.
impl Default for CheckOptions {
    fn default() -> Self {
        Self {
            exclusive: true,
            body_end_slack_us: 5_000,
        }
    }
}

/// A lease, named in a [`Report`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The process that held it.
    pub process: String,
    /// Its acquire.
    pub op: u64,
    /// Its fencing token.
    pub token: u64,
}

/// Two leases of a key believed held at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// The key.
    pub key: String,
    /// The lease granted first.
    pub a: Holder,
    /// The other.
    pub b: Holder,
    /// For how long both were believed held.
    pub overlap_us: u64,
}

/// A fenced write accepted after a write with a greater token had been.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfOrder {
    /// The key.
    pub key: String,
    /// The lease of the write accepted first, with the greater token.
    pub earlier: Holder,
    /// The earlier write's sequence number.
    pub earlier_seq: u64,
    /// The lease of the write accepted later, with the smaller token.
    pub later: Holder,
    /// The later write's sequence number.
    pub later_seq: u64,
}

/// Two leases with accepted writes under one token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedToken {
    /// The key.
    pub key: String,
    /// The lease whose write was seen first.
    pub a: Holder,
    /// The other.
    pub b: Holder,
}

/// What a body did past its lease's validity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LateEvent {
    /// It sent a fenced write.
    Write,
    /// It ended (later than the slack allows).
    BodyEnd,
}

/// A body acting past its lease's validity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BodyAfterValidity {
    /// The process.
    pub process: String,
    /// The lease's acquire.
    pub op: u64,
    /// The key.
    pub key: String,
    /// What it did.
    pub event: LateEvent,
    /// How long after the validity's end.
    pub late_us: u64,
}

/// A lease granted with a token not above that of a lease granted before it was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBackwards {
    /// The key.
    pub key: String,
    /// The lease granted first.
    pub earlier: Holder,
    /// The lease asked for after that.
    pub later: Holder,
}

/// How long after a fault was healed a process got a lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resume {
    /// The fault.
    pub fault: String,
    /// When it was healed.
    pub healed_at: u64,
    /// The process.
    pub process: String,
    /// From the heal to its first lease since, or `None` if it got none.
    pub after_us: Option<u64>,
}

/// What [`check`] found. Its `Display` is a summary for a test's panic message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// Whether overlaps are violations ([`CheckOptions::exclusive`]).
    pub exclusive: bool,
    /// Leases of a key believed held at once.
    pub overlaps: Vec<Overlap>,
    /// Fenced writes accepted out of token order.
    pub out_of_order: Vec<OutOfOrder>,
    /// Tokens under which two leases had writes accepted.
    pub shared_tokens: Vec<SharedToken>,
    /// Bodies acting past their validity.
    pub after_validity: Vec<BodyAfterValidity>,
    /// Tokens going backwards in real time.
    pub backwards: Vec<TokenBackwards>,
    /// Each process's time to a lease after each heal (every process that recorded more than
    /// faults), in the order of the heals.
    pub resumes: Vec<Resume>,
    /// Leases granted, per process (every process, with 0 for one that got none).
    pub grants: BTreeMap<String, u64>,
    /// Failed acquires, per error class.
    pub failures_by_class: BTreeMap<String, u64>,
}

impl Report {
    /// How many violations it lists: all but resumes, and overlaps only if exclusive.
    pub fn violations(&self) -> usize {
        let overlaps = if self.exclusive {
            self.overlaps.len()
        } else {
            0
        };
        overlaps
            + self.out_of_order.len()
            + self.shared_tokens.len()
            + self.after_validity.len()
            + self.backwards.len()
    }
}

/// A lease as its events describe it.
struct Lease<'a> {
    process: &'a str,
    op: u64,
    key: Option<&'a str>,
    invoked: Option<u64>,
    /// When the acquire returned it, and its token.
    granted: Option<(u64, u64)>,
    /// `(at, valid_until)` of its Granted and Valid events, by `at`.
    validity: Vec<(u64, u64)>,
    /// When the client stopped believing it held it: release called, loss learned, body ended.
    stopped: Option<u64>,
}

impl<'a> Lease<'a> {
    /// Its validity's end as known at `at`: from the last Granted or Valid event until then.
    fn valid_until_at(&self, at: u64) -> Option<u64> {
        let known = self.validity.partition_point(|&(seen, _)| seen <= at);
        known.checked_sub(1).map(|i| self.validity[i].1)
    }

    /// The key, token and believed interval `[start, end)` of a granted lease (empty if
    /// `end <= start`).
    fn held(&self) -> Option<(&'a str, Holder, u64, u64)> {
        let (at, token) = self.granted?;
        let valid_until = self.validity.last()?.1;
        let end = self.stopped.map_or(valid_until, |s| s.min(valid_until));
        Some((self.key?, self.holder(token), at, end))
    }

    fn holder(&self, token: u64) -> Holder {
        Holder {
            process: self.process.to_owned(),
            op: self.op,
            token,
        }
    }
}

/// The leases of `events`, by process and op.
fn leases(events: &[Event]) -> BTreeMap<(&str, u64), Lease<'_>> {
    let mut leases = BTreeMap::new();
    for event in events {
        let op = match event {
            Event::Invoke { op, .. }
            | Event::Granted { op, .. }
            | Event::Valid { op, .. }
            | Event::BodyEnd { op, .. }
            | Event::Lost { op, .. }
            | Event::Released { op, .. } => *op,
            Event::Failed { .. } | Event::Write { .. } | Event::Fault { .. } => continue,
        };
        let process = event.process();
        let lease = leases.entry((process, op)).or_insert_with(|| Lease {
            process,
            op,
            key: None,
            invoked: None,
            granted: None,
            validity: Vec::new(),
            stopped: None,
        });
        let stopped = match event {
            Event::Invoke { key, at, .. } => {
                lease.key = Some(key);
                lease.invoked = Some(*at);
                None
            }
            Event::Granted {
                key,
                token,
                at,
                valid_until,
                ..
            } => {
                lease.key = Some(key);
                lease.granted = Some((*at, *token));
                lease.validity.push((*at, *valid_until));
                None
            }
            Event::Valid {
                at, valid_until, ..
            } => {
                lease.validity.push((*at, *valid_until));
                None
            }
            Event::BodyEnd { at, .. } | Event::Lost { at, .. } => Some(*at),
            Event::Released { invoked, .. } => Some(*invoked),
            Event::Failed { .. } | Event::Write { .. } | Event::Fault { .. } => None,
        };
        if let Some(at) = stopped {
            lease.stopped = Some(lease.stopped.map_or(at, |s| s.min(at)));
        }
    }
    for lease in leases.values_mut() {
        lease.validity.sort_by_key(|&(at, _)| at);
    }
    leases
}

/// Judges a history (the events of all its processes, in any order; see the module's doc).
pub fn check(events: &[Event], opts: &CheckOptions) -> Report {
    let leases = leases(events);
    let (out_of_order, shared_tokens) = fenced_writes(events);
    let mut grants = BTreeMap::new();
    let mut failures_by_class = BTreeMap::new();
    for event in events {
        match event {
            Event::Granted { process, .. } => *grants.entry(process.clone()).or_default() += 1,
            Event::Failed { class, .. } => {
                *failures_by_class.entry(class.clone()).or_default() += 1
            }
            Event::Fault { .. } => continue,
            _ => {}
        }
        grants.entry(event.process().to_owned()).or_default();
    }
    Report {
        exclusive: opts.exclusive,
        overlaps: overlaps(&leases),
        out_of_order,
        shared_tokens,
        after_validity: after_validity(events, &leases, opts.body_end_slack_us),
        backwards: backwards(&leases),
        resumes: resumes(events),
        grants,
        failures_by_class,
    }
}

/// Writes sent, and bodies ended later than `slack_us`, past their lease's validity as known then.
fn after_validity(
    events: &[Event],
    leases: &BTreeMap<(&str, u64), Lease<'_>>,
    slack_us: u64,
) -> Vec<BodyAfterValidity> {
    let mut found = Vec::new();
    for event in events {
        let (process, op, at, event, slack_us) = match event {
            Event::Write {
                process,
                op,
                invoked,
                ..
            } => (process, *op, *invoked, LateEvent::Write, 0),
            Event::BodyEnd { process, op, at } => (process, *op, *at, LateEvent::BodyEnd, slack_us),
            _ => continue,
        };
        let Some(lease) = leases.get(&(process.as_str(), op)) else {
            continue;
        };
        let Some(end) = lease.valid_until_at(at) else {
            continue;
        };
        if at > end.saturating_add(slack_us) {
            found.push(BodyAfterValidity {
                process: process.clone(),
                op,
                key: lease.key.unwrap_or_default().to_owned(),
                event,
                late_us: at - end,
            });
        }
    }
    found
}

/// Pairs of leases of one key whose believed intervals overlap.
fn overlaps(leases: &BTreeMap<(&str, u64), Lease<'_>>) -> Vec<Overlap> {
    let mut by_key: BTreeMap<&str, Vec<(Holder, u64, u64)>> = BTreeMap::new();
    for (key, holder, start, end) in leases.values().filter_map(Lease::held) {
        by_key.entry(key).or_default().push((holder, start, end));
    }
    let mut found = Vec::new();
    for (key, mut held) in by_key {
        held.sort_by_key(|&(_, start, _)| start);
        for (i, (a, _, a_end)) in held.iter().enumerate() {
            // Sorted by start: once one starts after `a` ends, all the rest do.
            for (b, b_start, b_end) in held[i + 1..].iter().take_while(|(_, s, _)| s < a_end) {
                let overlap_us = a_end.min(b_end).saturating_sub(*b_start);
                if overlap_us > 0 {
                    found.push(Overlap {
                        key: key.to_owned(),
                        a: a.clone(),
                        b: b.clone(),
                        overlap_us,
                    });
                }
            }
        }
    }
    found
}

/// Accepted writes out of token order, and tokens shared by two leases.
fn fenced_writes(events: &[Event]) -> (Vec<OutOfOrder>, Vec<SharedToken>) {
    let (mut out_of_order, mut shared_tokens) = (Vec::new(), Vec::new());
    let mut accepted: BTreeMap<&str, Vec<(u64, Holder)>> = BTreeMap::new();
    for event in events {
        if let Event::Write {
            process,
            op,
            key,
            token,
            outcome: WriteOutcome::Accepted { seq },
            ..
        } = event
        {
            let holder = Holder {
                process: process.clone(),
                op: *op,
                token: *token,
            };
            accepted.entry(key).or_default().push((*seq, holder));
        }
    }
    for (key, mut writes) in accepted {
        writes.sort_by_key(|&(seq, _)| seq);
        let mut newest: Option<&(u64, Holder)> = None;
        let mut first_of_token: BTreeMap<u64, &Holder> = BTreeMap::new();
        let mut shared = BTreeSet::new();
        for write in &writes {
            let (seq, holder) = write;
            match newest {
                Some((newest_seq, newest)) if holder.token < newest.token => {
                    out_of_order.push(OutOfOrder {
                        key: key.to_owned(),
                        earlier: newest.clone(),
                        earlier_seq: *newest_seq,
                        later: holder.clone(),
                        later_seq: *seq,
                    });
                }
                _ => newest = Some(write),
            }
            let first = *first_of_token.entry(holder.token).or_insert(holder);
            let other_lease = (&first.process, first.op) != (&holder.process, holder.op);
            if other_lease && shared.insert((holder.token, &holder.process, holder.op)) {
                shared_tokens.push(SharedToken {
                    key: key.to_owned(),
                    a: first.clone(),
                    b: holder.clone(),
                });
            }
        }
    }
    (out_of_order, shared_tokens)
}

/// Leases asked for after another lease of their key was granted, with a token not above it.
fn backwards(leases: &BTreeMap<(&str, u64), Lease<'_>>) -> Vec<TokenBackwards> {
    // Per key: (granted at, token, lease) of each granted lease.
    let mut by_key: BTreeMap<&str, Vec<(u64, u64, &Lease<'_>)>> = BTreeMap::new();
    for lease in leases.values() {
        if let (Some(key), Some((at, token))) = (lease.key, lease.granted) {
            by_key.entry(key).or_default().push((at, token, lease));
        }
    }
    let mut found = Vec::new();
    for (key, mut grants) in by_key {
        grants.sort_by_key(|&(at, ..)| at);
        let mut asks: Vec<_> = grants
            .iter()
            .filter_map(|&(_, token, lease)| Some((lease.invoked?, token, lease)))
            .collect();
        asks.sort_by_key(|&(invoked, ..)| invoked);
        // The grants are walked as the asks go by: the greatest token granted before each ask.
        let mut granted = grants.iter().peekable();
        let mut greatest: Option<(u64, &Lease<'_>)> = None;
        for (invoked, token, later) in asks {
            while let Some(&(_, t, earlier)) = granted.next_if(|&&(at, ..)| at < invoked) {
                if greatest.is_none_or(|(g, _)| t > g) {
                    greatest = Some((t, earlier));
                }
            }
            if let Some((t, earlier)) = greatest.filter(|&(g, _)| token <= g) {
                found.push(TokenBackwards {
                    key: key.to_owned(),
                    earlier: earlier.holder(t),
                    later: later.holder(token),
                });
            }
        }
    }
    found
}

/// Each process's time to its first lease after each heal.
fn resumes(events: &[Event]) -> Vec<Resume> {
    let mut grants: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for event in events {
        match event {
            Event::Granted { process, at, .. } => grants.entry(process).or_default().push(*at),
            Event::Fault { .. } => {}
            _ => {
                grants.entry(event.process()).or_default();
            }
        }
    }
    grants.values_mut().for_each(|times| times.sort_unstable());
    let mut heals: Vec<(u64, &str)> = events
        .iter()
        .filter_map(|event| match event {
            Event::Fault {
                name,
                at,
                phase: FaultPhase::Heal,
                ..
            } => Some((*at, name.as_str())),
            _ => None,
        })
        .collect();
    heals.sort_by_key(|&(at, _)| at);
    let mut found = Vec::new();
    for (healed, name) in heals {
        for (process, times) in &grants {
            let first = times.get(times.partition_point(|&at| at < healed));
            found.push(Resume {
                fault: name.to_owned(),
                healed_at: healed,
                process: (*process).to_owned(),
                after_us: first.map(|at| at - healed),
            });
        }
    }
    found
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{} (token {})", self.process, self.op, self.token)
    }
}

/// ` (a 1, b 2)`, or nothing for no counts.
fn write_counts(f: &mut fmt::Formatter<'_>, counts: &BTreeMap<String, u64>) -> fmt::Result {
    for (i, (name, n)) in counts.iter().enumerate() {
        write!(f, "{}{name} {n}", if i == 0 { " (" } else { ", " })?;
    }
    if !counts.is_empty() {
        write!(f, ")")?;
    }
    Ok(())
}

/// The first few of `all`, a line each.
fn list<T>(f: &mut fmt::Formatter<'_>, all: &[T], line: impl Fn(&T) -> String) -> fmt::Result {
    const SHOWN: usize = 5;
    for item in all.iter().take(SHOWN) {
        writeln!(f, "  {}", line(item))?;
    }
    if all.len() > SHOWN {
        writeln!(f, "  ... and {} more", all.len() - SHOWN)?;
    }
    Ok(())
}

/// Microseconds as milliseconds, for people.
struct Ms(u64);

impl fmt::Display for Ms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1} ms", self.0 as f64 / 1_000.0)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let grants: u64 = self.grants.values().sum();
        let failures: u64 = self.failures_by_class.values().sum();
        write!(f, "{} violations; {grants} grants", self.violations())?;
        write_counts(f, &self.grants)?;
        write!(f, ", {failures} failed acquires")?;
        write_counts(f, &self.failures_by_class)?;
        writeln!(
            f,
            "\noverlaps {}{}, out of order {}, shared tokens {}, after validity {}, tokens backwards {}",
            self.overlaps.len(),
            if self.exclusive { "" } else { " (allowed)" },
            self.out_of_order.len(),
            self.shared_tokens.len(),
            self.after_validity.len(),
            self.backwards.len(),
        )?;
        list(f, &self.overlaps, |o| {
            format!(
                "overlap on {}: {} and {} for {}",
                o.key,
                o.a,
                o.b,
                Ms(o.overlap_us)
            )
        })?;
        list(f, &self.out_of_order, |o| {
            format!(
                "out of order on {}: seq {} by {} after seq {} by {}",
                o.key, o.later_seq, o.later, o.earlier_seq, o.earlier
            )
        })?;
        list(f, &self.shared_tokens, |s| {
            format!("shared token on {}: {} and {}", s.key, s.a, s.b)
        })?;
        list(f, &self.after_validity, |a| {
            let what = match a.event {
                LateEvent::Write => "wrote",
                LateEvent::BodyEnd => "ended",
            };
            let late = Ms(a.late_us);
            format!(
                "after validity on {}: {}#{} {what} {late} late",
                a.key, a.process, a.op
            )
        })?;
        list(f, &self.backwards, |b| {
            format!(
                "token backwards on {}: {} after {}",
                b.key, b.later, b.earlier
            )
        })?;
        let heals = self
            .resumes
            .chunk_by(|a, b| (&a.fault, a.healed_at) == (&b.fault, b.healed_at));
        for heal in heals {
            write!(f, "resumed after {}:", heal[0].fault)?;
            for resume in heal {
                match resume.after_us {
                    Some(us) => write!(f, " {} {}", resume.process, Ms(us))?,
                    None => write!(f, " {} never", resume.process)?,
                }
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "k";

    fn invoke(process: &str, op: u64, at: u64) -> Event {
        let (process, key) = (process.to_owned(), KEY.to_owned());
        Event::Invoke {
            process,
            op,
            key,
            at,
        }
    }

    fn granted(process: &str, op: u64, token: u64, at: u64, valid_until: u64) -> Event {
        let (process, key) = (process.to_owned(), KEY.to_owned());
        Event::Granted {
            process,
            op,
            key,
            token,
            at,
            valid_until,
        }
    }

    fn valid(process: &str, op: u64, at: u64, valid_until: u64) -> Event {
        let process = process.to_owned();
        Event::Valid {
            process,
            op,
            at,
            valid_until,
        }
    }

    fn released(process: &str, op: u64, at: u64) -> Event {
        let process = process.to_owned();
        Event::Released {
            process,
            op,
            invoked: at,
            answered: at + 1,
            ok: true,
        }
    }

    fn lost(process: &str, op: u64, at: u64) -> Event {
        Event::Lost {
            process: process.to_owned(),
            op,
            at,
        }
    }

    fn body_end(process: &str, op: u64, at: u64) -> Event {
        Event::BodyEnd {
            process: process.to_owned(),
            op,
            at,
        }
    }

    fn write(process: &str, op: u64, token: u64, invoked: u64, outcome: WriteOutcome) -> Event {
        let (process, key) = (process.to_owned(), KEY.to_owned());
        let answered = invoked + 1;
        Event::Write {
            process,
            op,
            key,
            token,
            invoked,
            answered,
            outcome,
        }
    }

    fn accepted(process: &str, op: u64, token: u64, invoked: u64, seq: u64) -> Event {
        write(process, op, token, invoked, WriteOutcome::Accepted { seq })
    }

    fn heal(name: &str, at: u64) -> Event {
        let (process, name) = ("test".to_owned(), name.to_owned());
        Event::Fault {
            process,
            name,
            at,
            phase: FaultPhase::Heal,
        }
    }

    /// A lease asked for at `granted - 10`, valid until `valid_until`, released at `released`.
    fn lease(
        process: &str,
        op: u64,
        token: u64,
        granted_at: u64,
        valid_until: u64,
        released_at: u64,
    ) -> Vec<Event> {
        vec![
            invoke(process, op, granted_at - 10),
            granted(process, op, token, granted_at, valid_until),
            body_end(process, op, released_at),
            released(process, op, released_at),
        ]
    }

    fn run(events: &[Event]) -> Report {
        check(events, &CheckOptions::default())
    }

    fn holder(process: &str, op: u64, token: u64) -> Holder {
        Holder {
            process: process.to_owned(),
            op,
            token,
        }
    }

    #[test]
    fn a_clean_history_has_no_violations() {
        let mut events = lease("a", 1, 1, 100, 10_000, 500);
        events.extend(lease("b", 1, 2, 600, 10_600, 900));
        events.push(accepted("a", 1, 1, 200, 1));
        events.push(accepted("a", 1, 1, 300, 2));
        events.push(accepted("b", 1, 2, 700, 3));
        events.push(write("a", 1, 1, 400, WriteOutcome::Unknown));
        let failure = Event::Failed {
            process: "c".into(),
            op: 1,
            key: KEY.into(),
            at: 50,
            class: "busy".into(),
            message: "held".into(),
        };
        events.push(failure);
        let report = run(&events);
        assert_eq!(report.violations(), 0, "{report}");
        assert!(report.overlaps.is_empty() && report.after_validity.is_empty());
        let grants = [
            ("a".to_owned(), 1),
            ("b".to_owned(), 1),
            ("c".to_owned(), 0),
        ];
        assert_eq!(report.grants, BTreeMap::from(grants));
        assert_eq!(
            report.failures_by_class,
            BTreeMap::from([("busy".to_owned(), 1)])
        );
    }

    #[test]
    fn leases_believed_held_at_once_overlap() {
        let mut events = lease("a", 1, 1, 100, 10_000, 500);
        events.extend(lease("b", 1, 2, 400, 10_400, 900));
        let report = run(&events);
        let overlap = Overlap {
            key: KEY.into(),
            a: holder("a", 1, 1),
            b: holder("b", 1, 2),
            overlap_us: 100,
        };
        assert_eq!(report.overlaps, [overlap]);
        assert_eq!(report.violations(), 1, "{report}");
        let line = "overlap on k: a#1 (token 1) and b#1 (token 2) for 0.1 ms";
        assert!(report.to_string().contains(line), "{report}");
        let shared = check(
            &events,
            &CheckOptions {
                exclusive: false,
                ..CheckOptions::default()
            },
        );
        assert_eq!((shared.overlaps.len(), shared.violations()), (1, 0));
    }

    #[test]
    fn a_lease_released_before_the_next_grant_does_not_overlap() {
        let mut events = lease("a", 1, 1, 100, 10_000, 500);
        events.extend(lease("b", 1, 2, 500, 10_500, 900));
        assert_eq!(run(&events).violations(), 0);
    }

    #[test]
    fn a_lease_lost_earlier_does_not_overlap_though_still_valid() {
        let mut events = vec![
            invoke("a", 1, 90),
            granted("a", 1, 1, 100, 10_000),
            lost("a", 1, 300),
        ];
        events.extend(lease("b", 1, 2, 400, 10_400, 900));
        assert_eq!(run(&events).violations(), 0);
    }

    #[test]
    fn a_renewal_extends_the_lease_into_a_later_grant() {
        let mut events = vec![invoke("a", 1, 90), granted("a", 1, 1, 100, 1_000)];
        events.extend(lease("b", 1, 2, 1_200, 2_000, 1_500));
        assert_eq!(run(&events).violations(), 0);
        events.push(valid("a", 1, 900, 1_800));
        let report = run(&events);
        assert_eq!(report.overlaps.len(), 1, "{report}");
        assert_eq!(report.overlaps[0].overlap_us, 300);
    }

    #[test]
    fn accepted_writes_out_of_token_order_are_found() {
        let mut events = lease("a", 1, 5, 100, 10_000, 200);
        events.extend(lease("b", 1, 3, 300, 10_000, 400));
        events.push(accepted("a", 1, 5, 150, 1));
        events.push(accepted("b", 1, 3, 350, 2));
        // b was asked for before a was granted: only the writes' order is wrong.
        events[4] = invoke("b", 1, 90);
        let report = run(&events);
        let out = OutOfOrder {
            key: KEY.into(),
            earlier: holder("a", 1, 5),
            earlier_seq: 1,
            later: holder("b", 1, 3),
            later_seq: 2,
        };
        assert_eq!(report.out_of_order, [out]);
        assert_eq!(report.violations(), 1, "{report}");
    }

    #[test]
    fn one_token_in_two_leases_writes_is_shared() {
        let mut events = lease("a", 1, 4, 100, 10_000, 200);
        events.extend(lease("b", 1, 5, 300, 10_000, 400));
        events.push(accepted("a", 1, 4, 150, 1));
        events.push(accepted("b", 2, 4, 350, 2));
        events.push(accepted("b", 2, 4, 360, 3));
        let report = run(&events);
        let shared = SharedToken {
            key: KEY.into(),
            a: holder("a", 1, 4),
            b: holder("b", 2, 4),
        };
        assert_eq!(report.shared_tokens, [shared]);
        assert_eq!(report.violations(), 1, "{report}");
    }

    #[test]
    fn a_write_sent_after_validity_is_late() {
        let mut events = lease("a", 1, 1, 100, 1_000, 1_000);
        events.push(write("a", 1, 1, 1_002, WriteOutcome::Refused));
        let report = run(&events);
        let late = BodyAfterValidity {
            process: "a".into(),
            op: 1,
            key: KEY.into(),
            event: LateEvent::Write,
            late_us: 2,
        };
        assert_eq!(report.after_validity, [late]);
        assert_eq!(report.violations(), 1, "{report}");
    }

    #[test]
    fn a_body_ending_past_the_slack_is_late() {
        let slack = CheckOptions::default().body_end_slack_us;
        let within = lease("a", 1, 1, 100, 1_000, 1_000 + slack);
        assert_eq!(run(&within).violations(), 0);
        let past = lease("a", 1, 1, 100, 1_000, 1_001 + slack);
        let report = run(&past);
        let late = BodyAfterValidity {
            process: "a".into(),
            op: 1,
            key: KEY.into(),
            event: LateEvent::BodyEnd,
            late_us: slack + 1,
        };
        assert_eq!(report.after_validity, [late]);
        assert_eq!(report.violations(), 1, "{report}");
    }

    #[test]
    fn a_token_below_an_earlier_grants_goes_backwards() {
        let mut events = lease("a", 1, 7, 100, 1_000, 200);
        events.extend(lease("b", 1, 7, 300, 1_300, 400));
        let report = run(&events);
        let backwards = TokenBackwards {
            key: KEY.into(),
            earlier: holder("a", 1, 7),
            later: holder("b", 1, 7),
        };
        assert_eq!(report.backwards, [backwards]);
        assert_eq!(report.violations(), 1, "{report}");
    }

    #[test]
    fn concurrent_acquires_may_get_tokens_in_any_order() {
        // b is asked for (at 90) before a is granted (at 100): their order is not real-time.
        let mut events = lease("a", 1, 7, 100, 1_000, 200);
        events.extend(lease("b", 1, 6, 300, 1_300, 400));
        events[4] = invoke("b", 1, 90);
        assert_eq!(run(&events).violations(), 0);
    }

    #[test]
    fn each_process_resumes_after_a_heal_or_never() {
        let mut events = lease("a", 1, 1, 100, 10_000, 200);
        events.extend(lease("b", 1, 2, 300, 10_000, 400));
        events.push(heal("partition", 250));
        events.extend(lease("a", 2, 3, 2_250, 10_000, 2_300));
        let report = run(&events);
        let resume = |process: &str, after_us| Resume {
            fault: "partition".into(),
            healed_at: 250,
            process: process.into(),
            after_us,
        };
        assert_eq!(
            report.resumes,
            [resume("a", Some(2_000)), resume("b", Some(50))]
        );
        let mut stuck = lease("a", 1, 1, 100, 10_000, 200);
        stuck.push(heal("partition", 250));
        stuck.push(invoke("c", 1, 300));
        let report = run(&stuck);
        assert_eq!(report.resumes, [resume("a", None), resume("c", None)]);
        assert!(report
            .to_string()
            .contains("resumed after partition: a never c never"));
    }

    #[test]
    fn recorded_events_read_back_equal() {
        let dir = std::env::temp_dir().join(format!("distlock-history-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.history");
        let recorder = Recorder::create(&path, "a").unwrap();
        let op = recorder.next_op();
        let mut events = lease("a", op, 3, 100, 1_000, 500);
        events.extend([
            valid("a", op, 300, 1_300),
            accepted("a", op, 3, 310, 9),
            write("a", op, 3, 320, WriteOutcome::Refused),
            write("a", op, 3, 330, WriteOutcome::Unknown),
            lost("a", op, 400),
            Event::Failed {
                process: "a".into(),
                op: 2,
                key: "a key%".into(),
                at: 600,
                class: "unavailable".into(),
                message: "connection refused: 100%\n (os error 111)".into(),
            },
            Event::Fault {
                process: "a".into(),
                name: "partition a/b".into(),
                at: 700,
                phase: FaultPhase::Start,
            },
        ]);
        events.sort_by_key(Event::at);
        events.iter().for_each(|event| recorder.record(event));
        drop(recorder);
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(b"granted process=a op=9 key=k tok").unwrap();
        assert_eq!(read_histories(&[path]).unwrap(), events);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_recorder_stamps_its_process_and_the_time() {
        let dir = std::env::temp_dir().join(format!("distlock-history-now-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.history");
        let recorder = Recorder::create(&path, "c").unwrap();
        let op = recorder.next_op();
        let start = now_us();
        recorder.invoke(op, KEY);
        recorder.granted(op, KEY, 1, Duration::from_secs(10));
        recorder.valid(op, Duration::from_secs(10));
        recorder.write(op, KEY, 1, now_us(), WriteOutcome::Accepted { seq: 1 });
        recorder.body_end(op);
        let released = now_us();
        recorder.released(op, released, true);
        recorder.failed(recorder.next_op(), KEY, "busy", "held by another");
        let events = read_histories(&[path]).unwrap();
        assert_eq!(events.len(), 7);
        assert!(events.iter().all(|e| e.process() == "c" && e.at() >= start));
        let report = run(&events);
        assert_eq!(report.violations(), 0, "{report}");
        assert_eq!(report.grants, BTreeMap::from([("c".to_owned(), 1)]));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_malformed_line_is_named_by_file_and_line() {
        let dir = std::env::temp_dir().join(format!("distlock-history-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("b.history");
        std::fs::write(
            &path,
            "lost process=b op=1 at=5\nlost process=b op=x at=6\n",
        )
        .unwrap();
        let error = read_histories(std::slice::from_ref(&path)).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        let parse = error
            .get_ref()
            .and_then(|e| e.downcast_ref::<ParseError>())
            .unwrap();
        assert_eq!((&parse.path, parse.line), (&path, 2));
        assert!(
            error
                .to_string()
                .ends_with("b.history:2: `op=x` is not a number"),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_clock_moves_forward() {
        let before = now_us();
        std::thread::sleep(Duration::from_millis(2));
        assert!(now_us() >= before + 2_000);
    }
}
