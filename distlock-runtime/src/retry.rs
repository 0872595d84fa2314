//! Retrying: one policy value, [`Retry`], says which failures are tried again (by the one
//! classification of a failed reply, [`Reply`]), how long to pause before each try (a base
//! doubling up to a cap, half of it random or not) and until when. Every retry loop asks it,
//! after a failed try ([`Retry::decide`]) or for its next pause ([`Retry::pause`]), and does what
//! it says; its presets hold each loop's figures: a link's tries and a replicated write's
//! ([`Retry::link`]), the cluster router's ([`Retry::routed`]), the background release's
//! ([`Retry::release`]), renewal's ([`Retry::renewal`]), a waiter's ([`Retry::waiting`]) and an
//! election's ([`Retry::campaign`], [`Retry::unled`]).

use std::time::Duration;

use tokio::time::Instant;

use crate::error::{LockError, Misconfiguration, Reply};
use crate::failed::{Failed, Reached};

/// A node's address as a cluster names it: host and port.
pub(crate) type Address = (String, u16);

/// A cluster's redirection of a call, read off its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Redirect {
    /// `MOVED`: the slot lives at this address now.
    Moved(Address),
    /// `ASK`: this one call goes to that address, after `ASKING` (a slot being migrated).
    Ask(Address),
}

/// A retry policy: which failures are tried again, the pause before each try, and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Retry {
    /// Which failures [`decide`](Self::decide) tries again.
    pub(crate) retries: Retries,
    /// The first pause; each one after it doubles, up to `cap`.
    pub(crate) base: Duration,
    pub(crate) cap: Duration,
    /// "Equal jitter": half of each pause fixed, half random, so that many clients retrying
    /// together spread out, and none retries in a tight loop.
    pub(crate) jitter: bool,
    pub(crate) until: Until,
}

/// When a policy's tries stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    /// Never: tried for good.
    Never,
    /// Every try starts before this.
    Before(Instant),
    /// The last try is at this instant: no pause runs past it.
    At(Instant),
}

/// Which failures a policy tries again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retries {
    /// A request on a link to one server: one refused for a passing reason (`LOADING`, `BUSY`,
    /// `MASTERDOWN`, also while connecting) after a pause, on the same connection; `NOSCRIPT`
    /// once, with the whole script; a broken connection kept from an earlier call (it may have
    /// died while idle) once, on a fresh one; and with `read_only`, `READONLY` once, on a fresh
    /// one (which may reach the primary). The rest, redirections included, is the caller's.
    Link { read_only: bool },
    /// A call the cluster router routes: `MOVED` and `ASK` followed; `TRYAGAIN`, `CLUSTERDOWN`,
    /// `READONLY` and a node that refuses connections (each means nothing ran, unless an
    /// earlier try may have) after a pause.
    Routed,
    /// Outages only: no answer in time, a broken connection, no quorum, a passing refusal,
    /// `READONLY` (a failover may make the server a primary again, or move a DNS name to the
    /// new one), refused credentials (redis-rs reports every refused `AUTH` so, also one of a
    /// server at its client limit; and a password may be being rotated). Never another refusal
    /// (`NOPERM`, an ACL, `OOM`, ...): it refuses again.
    Outages,
    /// Anything but a misconfiguration or a caller's bug, which retrying never fixes.
    Fixable,
    /// Anything.
    Every,
}

/// What to do after a failed try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Again, after this pause (on a link, on the same connection).
    After(Duration),
    /// Again at once, on a fresh connection.
    Reconnect,
    /// Again at once, with the whole script (`EVAL`): the server lost it.
    Reload,
    /// Again, where the cluster redirection says.
    Redirect(Redirect),
    /// No more tries: the failure stands.
    GiveUp,
}

/// What a request's tries have used of its policy: the pauses so far, and the retries it
/// allows once each.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tried {
    paused: u32,
    /// The last try went on a connection kept from an earlier call.
    pub(crate) kept: bool,
    read_only: bool,
    reconnected: bool,
    reloaded: bool,
}

/// How long before a lease's validity ends its last renewal retry is sent at the latest.
pub(crate) const LAST_TRY_BEFORE_EXPIRY: Duration = Duration::from_millis(20);

const fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

impl Retry {
    const fn new(
        retries: Retries,
        base: Duration,
        cap: Duration,
        jitter: bool,
        until: Until,
    ) -> Self {
        Self {
            retries,
            base,
            cap,
            jitter,
            until,
        }
    }

    /// A request on a link (or a replicated write), its tries started before `until`: 20 ms
    /// apart; `read_only`: a `READONLY` is tried once more (not on a cluster node, whose caller
    /// routes by itself).
    pub(crate) fn link(until: Instant, read_only: bool) -> Self {
        let retries = Retries::Link { read_only };
        Self::new(retries, ms(20), ms(20), false, Until::Before(until))
    }

    /// A call the cluster router routes, its tries started before `until`: 20 ms apart.
    pub(crate) fn routed(until: Instant) -> Self {
        Self::new(Retries::Routed, ms(20), ms(20), false, Until::Before(until))
    }

    /// A background release, given up at `give_up` (the keys have expired by then): from 50 ms,
    /// doubling up to 1 s.
    pub(crate) fn release(give_up: Instant) -> Self {
        let until = Until::Before(give_up);
        Self::new(Retries::Outages, ms(50), ms(1000), false, until)
    }

    /// The renewal of a lease of `ttl`, valid until `valid_until`: from an eighth of the renewal
    /// interval (10 to 250 ms), doubling up to a quarter of the ttl (at most 2 s), with jitter,
    /// so leases of many processes do not retry in step; the last try [`LAST_TRY_BEFORE_EXPIRY`]
    /// before the lease ends (a Redis back just before then still saves it). A lease renewed
    /// every ttl/3 has two thirds of its ttl left when the first renewal fails: enough for
    /// several retries before it is lost.
    pub(crate) fn renewal(ttl: Duration, valid_until: Instant) -> Self {
        let base = (crate::renew::interval(ttl) / 8).clamp(ms(10), ms(250));
        let last = valid_until.checked_sub(LAST_TRY_BEFORE_EXPIRY);
        let until = Until::At(last.unwrap_or(valid_until));
        let cap = (ttl / 4).clamp(base, ms(2000));
        Self::new(Retries::Every, base, cap, true, until)
    }

    /// A waiter polling a held lock until `deadline`, where it makes one last attempt: from
    /// 1 ms, doubling up to 50 ms, with jitter.
    pub(crate) fn waiting(deadline: Instant) -> Self {
        Self::new(Retries::Every, ms(1), ms(50), true, Until::At(deadline))
    }

    /// An election's campaign: from 100 ms, doubling up to a third of the `ttl`, for good.
    pub(crate) fn campaign(ttl: Duration) -> Self {
        let cap = (ttl / 3).max(ms(100));
        Self::new(Retries::Fixable, ms(100), cap, false, Until::Never)
    }

    /// An election's observer reading again while nobody leads: from 50 ms, doubling up to
    /// `every` (a renewal interval), for good.
    pub(crate) fn unled(every: Duration) -> Self {
        Self::new(Retries::Every, ms(50), every, false, Until::Never)
    }

    /// What to do at `now` after a try failed with `failed`; counts what it allows in `tried`.
    pub(crate) fn decide(&self, failed: &Failed, tried: &mut Tried, now: Instant) -> Decision {
        use Decision::{GiveUp, Reconnect, Reload};
        use Reply as R;
        use Retries::{Every, Fixable, Link, Outages, Routed};
        let (error, unsent) = (&failed.error, failed.reached == Reached::No);
        let once = |used: &mut bool, decision| match std::mem::replace(used, true) {
            false => decision,
            true => GiveUp,
        };
        match (self.retries, failed.reply()) {
            (Link { .. }, Some(R::Passing)) => self.after(tried, now),
            // No connection was had: only a refusal while connecting is waited out.
            (Link { .. }, _) if unsent => GiveUp,
            (Link { read_only: true }, Some(R::ReadOnly)) => once(&mut tried.read_only, Reconnect),
            (Link { .. }, Some(R::NoScript)) => once(&mut tried.reloaded, Reload),
            (Link { .. }, Some(R::Connection)) if tried.kept => {
                once(&mut tried.reconnected, Reconnect)
            }
            (Routed, Some(R::Redirect(to))) if self.open(now) => Decision::Redirect(to),
            (Routed, Some(R::Resharding | R::ReadOnly)) => self.after(tried, now),
            // A node that refuses connections (gone, or restarting): its replica may be taking
            // over. (One that accepts none in time is hung: an error now, not a second wait.)
            (Routed, _) if unsent && matches!(error, LockError::Redis { .. }) => {
                self.after(tried, now)
            }
            (Outages, _) if passes(error) => self.after(tried, now),
            (Fixable, _) if !error.is_misconfigured() && !error.is_caller_bug() => {
                self.after(tried, now)
            }
            (Every, _) => self.after(tried, now),
            _ => GiveUp,
        }
    }

    /// The next pause, counted in `tried`, or [`Decision::GiveUp`] when the tries stop first.
    fn after(&self, tried: &mut Tried, now: Instant) -> Decision {
        let pause = self.pause(tried.paused + 1, now);
        tried.paused += u32::from(pause.is_some());
        pause.map_or(Decision::GiveUp, Decision::After)
    }

    /// The pause at `now` before the `attempt`-th retry (from 1), or `None` when the tries stop
    /// first.
    pub(crate) fn pause(&self, attempt: u32, now: Instant) -> Option<Duration> {
        self.pause_with(attempt, now, |half| fastrand::u64(0..=half))
    }

    /// [`pause`](Self::pause), its jitter drawn by `random` (from `0..=half`, in nanoseconds).
    fn pause_with(&self, attempt: u32, now: Instant, random: fn(u64) -> u64) -> Option<Duration> {
        let doublings = attempt.saturating_sub(1).min(16);
        let step = self.base.saturating_mul(1 << doublings).min(self.cap);
        let pause = match self.jitter {
            true => step / 2 + Duration::from_nanos(random((step / 2).as_nanos() as u64)),
            false => step,
        };
        match self.until {
            Until::Never => Some(pause),
            Until::Before(until) => (now + pause < until).then_some(pause),
            Until::At(until) => (now < until).then(|| pause.min(until - now)),
        }
    }

    /// Whether a try may start at `now`.
    fn open(&self, now: Instant) -> bool {
        !matches!(self.until, Until::Before(until) | Until::At(until) if now >= until)
    }
}

/// Whether `error` is an outage that may pass (see [`Retries::Outages`]).
fn passes(error: &LockError) -> bool {
    use Reply::{Connection, Passing, ReadOnly, Refused, Resharding};
    let reply = error.redis_source().map(Reply::of);
    matches!(
        error,
        LockError::RedisTimeout { .. } | LockError::NoQuorum { .. }
    ) || matches!(reply, Some(Connection | Passing | Resharding | ReadOnly))
        || reply == Some(Refused(Misconfiguration::Credentials))
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;

    use super::*;
    use crate::failed::failed;

    const RESPONSE: Duration = Duration::from_millis(500);

    /// A server's error reply, as the client reads it off the wire.
    fn reply(text: &str) -> redis::RedisError {
        let value = redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap();
        value.extract_error().unwrap_err()
    }

    /// A try that `text` answered, as a link reads it.
    fn answered(text: &str) -> Failed {
        failed("test", reply(text), RESPONSE)
    }

    /// A try whose connection broke (or was refused) with `kind`.
    fn broken(kind: ErrorKind) -> Failed {
        failed("test", std::io::Error::from(kind).into(), RESPONSE)
    }

    /// A try that found no connection: the dial failed with `error`.
    fn not_connected(error: LockError) -> Failed {
        Failed {
            error,
            reached: Reached::No,
        }
    }

    /// `retry`'s decisions, one after the other at `now`, on `failed`.
    fn decisions(retry: Retry, failed: &Failed, now: Instant, tries: usize) -> Vec<Decision> {
        let mut tried = Tried {
            kept: true,
            ..Tried::default()
        };
        (0..tries)
            .map(|_| retry.decide(failed, &mut tried, now))
            .collect()
    }

    #[test]
    fn a_link_waits_out_a_passing_refusal_20_ms_apart_until_its_deadline() {
        let now = Instant::now();
        let retry = Retry::link(now + RESPONSE, true);
        let after = Decision::After(ms(20));
        for text in [
            "LOADING Redis is loading the dataset in memory",
            "BUSY Redis is busy running a script.",
            "MASTERDOWN Link with MASTER is down",
        ] {
            // On the same connection, as long as a try can start before the deadline.
            assert_eq!(
                decisions(retry, &answered(text), now, 3),
                vec![after.clone(); 3]
            );
            let tried = &mut Tried::default();
            let last = now + RESPONSE - ms(21);
            assert_eq!(retry.decide(&answered(text), tried, last), after);
            let past = now + RESPONSE - ms(20);
            assert_eq!(retry.decide(&answered(text), tried, past), Decision::GiveUp);
        }
        // Refused while connecting (`LOADING` to `AUTH`): the same.
        let loading = LockError::from_redis("test", reply("LOADING Redis is loading"));
        let dial = not_connected(loading);
        assert_eq!(decisions(retry, &dial, now, 1), [after]);
    }

    #[test]
    fn a_link_retries_once_on_a_fresh_connection_or_with_the_whole_script() {
        let now = Instant::now();
        let retry = Retry::link(now + RESPONSE, true);
        let once = |decision| vec![decision, Decision::GiveUp];
        // A replica refused it: once more on a fresh connection, which may reach the primary;
        // not on a cluster node, whose router follows it.
        let read_only = answered("READONLY You can't write against a read only replica.");
        assert_eq!(
            decisions(retry, &read_only, now, 2),
            once(Decision::Reconnect)
        );
        let node = Retry::link(now + RESPONSE, false);
        assert_eq!(decisions(node, &read_only, now, 1), [Decision::GiveUp]);
        // The server lost the script: once with the whole script.
        let noscript = answered("NOSCRIPT No matching script. Please use EVAL.");
        assert_eq!(decisions(retry, &noscript, now, 2), once(Decision::Reload));
        // A connection kept from an earlier call broke (it died while idle): once on a fresh
        // one; a fresh one that broke, never.
        let reset = broken(ErrorKind::ConnectionReset);
        assert_eq!(decisions(retry, &reset, now, 2), once(Decision::Reconnect));
        let mut fresh = Tried::default();
        assert_eq!(retry.decide(&reset, &mut fresh, now), Decision::GiveUp);
        // No connection could be had: only a passing refusal is waited out, not a server that
        // Sentinel named but is no primary, nor one that refuses connections.
        let not_primary = LockError::Redis {
            op: "test",
            source: reply("READONLY the server Sentinel named is not a primary"),
        };
        assert_eq!(
            decisions(retry, &not_connected(not_primary), now, 1),
            [Decision::GiveUp]
        );
        let refused = broken(ErrorKind::ConnectionRefused).error;
        assert_eq!(
            decisions(retry, &not_connected(refused), now, 1),
            [Decision::GiveUp]
        );
    }

    #[test]
    fn a_link_gives_up_on_refusals_redirections_and_timeouts() {
        let now = Instant::now();
        let retry = Retry::link(now + RESPONSE, true);
        for text in [
            "NOPERM User u has no permissions to run the 'set' command",
            "ERR ACL failure in script: No permissions to access a key script: cbaa9c, on \
             @user_script:1.",
            "ERR The user executing the script can't run this command or subcommand script: \
             4959c9, on @user_script:3.",
            "WRONGPASS invalid username-password pair",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "ERR unknown command 'WAIT', with args beginning with: '1' '500' ",
            // The cluster's: the router's to follow (or a misconfiguration on one server).
            "MOVED 3999 127.0.0.1:6381",
            "ASK 3999 127.0.0.1:6381",
            "CROSSSLOT Keys in request don't hash to the same slot",
            "TRYAGAIN Multiple keys request during rehashing of slot",
        ] {
            assert_eq!(
                decisions(retry, &answered(text), now, 1),
                [Decision::GiveUp],
                "{text}"
            );
        }
        // No answer in time: it may still run; the caller hears of it now.
        let timeout = Failed::maybe(LockError::RedisTimeout {
            op: "test",
            after: RESPONSE,
        });
        assert_eq!(decisions(retry, &timeout, now, 1), [Decision::GiveUp]);
    }

    #[test]
    fn the_cluster_router_follows_redirections_and_waits_out_resharding() {
        let now = Instant::now();
        let retry = Retry::routed(now + RESPONSE);
        let to = || ("127.0.0.1".to_owned(), 6381);
        let moved = answered("MOVED 3999 127.0.0.1:6381");
        let moved_to = Decision::Redirect(Redirect::Moved(to()));
        assert_eq!(
            decisions(retry, &moved, now, 2),
            [moved_to.clone(), moved_to]
        );
        let ask = answered("ASK 3999 127.0.0.1:6381");
        assert_eq!(
            decisions(retry, &ask, now, 1),
            [Decision::Redirect(Redirect::Ask(to()))]
        );
        // Nothing ran: again 20 ms later, where the slot map says the slot lives then.
        let after = Decision::After(ms(20));
        for text in [
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
            "READONLY You can't write against a read only replica.",
        ] {
            assert_eq!(
                decisions(retry, &answered(text), now, 2),
                [after.clone(), after.clone()]
            );
        }
        // A node that refuses connections: its replica may be taking over.
        let refused = broken(ErrorKind::ConnectionRefused).error;
        assert_eq!(decisions(retry, &not_connected(refused), now, 1), [after]);
        // But not after a try that may have run (its failure says so), nor a node that
        // accepted no connection in time (hung), nor what the node's link gave up on.
        let mut maybe = broken(ErrorKind::ConnectionRefused);
        maybe.reached = Reached::Maybe;
        let hung = not_connected(LockError::RedisTimeout {
            op: "test",
            after: RESPONSE,
        });
        let loading = answered("LOADING Redis is loading the dataset in memory");
        for failed in [maybe, hung, loading, answered("NOPERM no permissions")] {
            assert_eq!(
                decisions(retry, &failed, now, 1),
                [Decision::GiveUp],
                "{failed:?}"
            );
        }
        // Within one response timeout.
        let late = now + RESPONSE;
        assert_eq!(decisions(retry, &moved, late, 1), [Decision::GiveUp]);
        let clusterdown = answered("CLUSTERDOWN The cluster is down");
        assert_eq!(
            decisions(retry, &clusterdown, late - ms(20), 1),
            [Decision::GiveUp]
        );
    }

    #[test]
    fn a_background_release_waits_out_outages_never_refusals() {
        let now = Instant::now();
        let retry = Retry::release(now + Duration::from_secs(30));
        let error = |text| Failed::maybe(LockError::from_redis("release", reply(text)));
        // From 50 ms, doubling up to 1 s.
        let backoff = [50, 100, 200, 400, 800, 1000, 1000].map(|p| Decision::After(ms(p)));
        let outages = [
            Failed::maybe(LockError::RedisTimeout {
                op: "release",
                after: RESPONSE,
            }),
            Failed::maybe(LockError::NoQuorum {
                op: "release",
                granted: 1,
                needed: 2,
                nodes: 3,
                first_failure: None,
            }),
            broken(ErrorKind::ConnectionReset),
            error("LOADING Redis is loading the dataset in memory"),
            error("TRYAGAIN Multiple keys request during rehashing of slot"),
            error("READONLY You can't write against a read only replica."),
            // A password being rotated; redis-rs says so of a server at its client limit too.
            error("WRONGPASS invalid username-password pair"),
            Failed::maybe(LockError::Misconfigured {
                op: "release",
                problem: Misconfiguration::Replica,
                detail: String::new(),
                source: reply("READONLY You can't write against a read only replica."),
            }),
        ];
        for failed in &outages {
            assert_eq!(decisions(retry, failed, now, 7), backoff, "{failed:?}");
        }
        // A refusal refuses again: never an outage.
        for text in [
            "NOPERM User u has no permissions to run the 'evalsha' command",
            "ERR ACL failure in script: No permissions to access a key script: cbaa9c, on \
             @user_script:1.",
            "ERR The user executing the script can't access at least one of the keys \
             mentioned in the command arguments script: cbaa9c, on @user_script:1.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "ERR Unknown Redis command called from script script: 104ae6, on @user_script:1.",
            "ERR SELECT is not allowed in cluster mode",
        ] {
            let failed = error(text);
            assert_eq!(
                decisions(retry, &failed, now, 1),
                [Decision::GiveUp],
                "{text}"
            );
        }
        // No pause past the keys' ttl.
        let late = now + Duration::from_secs(30) - ms(50);
        assert_eq!(decisions(retry, &outages[0], late, 1), [Decision::GiveUp]);
    }

    #[test]
    fn an_election_campaigns_again_with_backoff_unless_retrying_cannot_help() {
        let now = Instant::now();
        let retry = Retry::campaign(Duration::from_secs(3));
        // From 100 ms, doubling up to a third of the ttl, for good.
        let backoff = [100, 200, 400, 800, 1000, 1000].map(|p| Decision::After(ms(p)));
        let down = broken(ErrorKind::ConnectionRefused);
        assert_eq!(decisions(retry, &down, now, 6), backoff);
        let oom = Failed::maybe(LockError::from_redis("campaign", reply("OOM no memory")));
        assert_eq!(decisions(retry, &oom, now, 1), [Decision::After(ms(100))]);
        // A ttl so short that a third of it is below the first pause: 100 ms apart.
        let short = Retry::campaign(ms(150));
        assert_eq!(
            decisions(short, &down, now, 3),
            vec![Decision::After(ms(100)); 3]
        );
        let noperm = LockError::from_redis("campaign", reply("NOPERM no permissions"));
        let caller_bug = LockError::InvalidKey {
            key: String::new(),
            reason: "empty",
        };
        for error in [noperm, caller_bug] {
            let failed = Failed::maybe(error);
            assert_eq!(
                decisions(retry, &failed, now, 1),
                [Decision::GiveUp],
                "{failed:?}"
            );
        }
    }

    #[test]
    fn jitter_draws_half_of_each_pause() {
        let now = Instant::now();
        let retry = Retry::waiting(now + Duration::from_secs(60));
        // From 1 ms, doubling up to 50 ms: half of each step fixed, half drawn.
        let steps = [1, 2, 4, 8, 16, 32, 50, 50].map(ms);
        for (attempt, step) in (1..).zip(steps) {
            assert_eq!(retry.pause_with(attempt, now, |_| 0), Some(step / 2));
            let all = |half| half;
            assert_eq!(retry.pause_with(attempt, now, all), Some(step / 2 * 2));
            let drawn = retry.pause(attempt, now).unwrap();
            assert!(drawn >= step / 2 && drawn <= step, "{drawn:?} vs {step:?}");
        }
        // Without jitter, the step itself.
        let release = Retry::release(now + Duration::from_secs(60));
        assert_eq!(release.pause_with(2, now, |_| 0), Some(ms(100)));
    }

    #[test]
    fn the_deadline_ends_or_shortens_the_pauses() {
        let now = Instant::now();
        let until = now + ms(100);
        // Every try before it: no pause that would end at or past it.
        let link = Retry::link(until, true);
        assert_eq!(link.pause(1, now + ms(79)), Some(ms(20)));
        assert_eq!(link.pause(1, now + ms(80)), None);
        // One last try at it: pauses end there at the latest.
        let waiting = Retry::waiting(until);
        assert_eq!(waiting.pause_with(7, now + ms(90), |h| h), Some(ms(10)));
        assert_eq!(waiting.pause(1, until), None);
        // Never: for good.
        let unled = Retry::unled(Duration::from_secs(5));
        let far = now + Duration::from_secs(86_400);
        let pauses: Vec<_> = (1..9).map(|a| unled.pause(a, far).unwrap()).collect();
        let expected = [50, 100, 200, 400, 800, 1600, 3200, 5000].map(ms);
        assert_eq!(pauses, expected);
    }

    #[test]
    fn renewal_retries_back_off_with_jitter_up_to_a_cap() {
        let now = Instant::now();
        let far = now + Duration::from_secs(3600);
        let ttl = Duration::from_secs(30);
        // 30 s: first step 250 ms, cap 2 s; each delay is between half the step and the step.
        let mut step = ms(250);
        for failures in 1..12 {
            let delay = Retry::renewal(ttl, far).pause(failures, now).unwrap();
            assert!(
                delay >= step / 2 && delay <= step,
                "failure {failures}: {delay:?} vs {step:?}"
            );
            step = (step * 2).min(Duration::from_secs(2));
        }
        // A short lease still retries, never in a tight loop, and well within its validity.
        let short = ms(300);
        for failures in 1..40 {
            let delay = Retry::renewal(short, far).pause(failures, now).unwrap();
            assert!(delay >= ms(5), "{delay:?}");
            assert!(delay <= short / 4, "{delay:?}");
        }
        // The last try goes 20 ms before the lease ends.
        let valid_until = now + ms(300);
        let last = Retry::renewal(ttl, valid_until).pause(9, now).unwrap();
        assert_eq!(last, ms(280));
        assert_eq!(
            Retry::renewal(ttl, valid_until).pause(1, valid_until - ms(20)),
            None
        );
    }
}
