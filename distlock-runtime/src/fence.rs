//! Fencing tokens: how each lease's token is drawn, and why tokens keep rising after Redis lost
//! its data.
//!
//! Storage that fences (remembers the greatest token it accepted and refuses smaller ones) is
//! what makes a holder that lost its lease without knowing it (paused past its ttl, cut off
//! from Redis) harmless. That needs tokens that only ever rise per key, across every client,
//! after a lease expired, and after Redis lost the counter: a restart without persistence, a
//! failover to a replica that missed the last writes, an eviction. A token is therefore at
//! least Redis's clock in microseconds, and one more than the last token of the key when
//! that is greater. The clock assumption: the Redis server's wall clock (and, after a
//! failover, the new primary's) does not step back by more than the time between the last
//! token drawn before the loss and the first one after. NTP-disciplined clocks slew rather than
//! step, and a failover takes longer than their offsets; a clock set back by hand breaks the
//! guarantee until the counter has caught up.
//!
//! The Lua: `scripts/draw.lua` draws a token (every script that takes a lock calls it),
//! `scripts/raise.lua` writes one back ([`RAISE`]).

/// Raises fencing counters to a token drawn elsewhere: `scripts/raise.lua`.
pub(crate) static RAISE: std::sync::LazyLock<crate::scripts::Lua> =
    std::sync::LazyLock::new(|| {
        crate::scripts::Lua::new(
            crate::scripts::lua!("#!lua"; "scripts/counter.lua", "scripts/raise.lua"),
        )
    });

/// The write-back of `token` to the fencing counters of the keys `taking` takes ([`RAISE`]).
pub(crate) fn raise_call(taking: &crate::call::Taking, token: u64) -> crate::call::ScriptCall {
    use crate::call::{Confirm, ScriptCall};
    let mut raise = ScriptCall::new(
        "acquire (fencing write-back)",
        &RAISE,
        Confirm::Write,
        taking.indices.len(),
    );
    for fence in taking.fences() {
        raise.key(fence);
    }
    raise.arg(token).arg(crate::time::millis(taking.ttl));
    raise
}
