//! The fair acquire's script call, built once per request, and its answer.

use std::sync::LazyLock;
use std::time::Duration;

use super::HANDOFF_CLAIM;
use crate::call::{Confirm, ScriptCall};
use crate::failed::Failed;
use crate::keys::LockKeys;
use crate::mode::Words;
use crate::scripts::{lua, lua_spliced, read_taking, Answered, Lua, Waiting};
use crate::time::millis;
use crate::topology::Serial;

/// Takes one lock key fairly, or joins its queue: `fair/acquire.lua`.
//
// `#!lua`, as the plain acquire (see `scripts/mod.rs`).
pub(crate) static ACQUIRE_FAIR: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(lua_spliced!(
        "#!lua";
        "scripts/shared.lua", "scripts/draw_now.lua", "scripts/join.lua", "fair/acquire.lua"
        at "--[[ functions ]]"; lua!(
            "scripts/owner.lua", "scripts/counter.lua", "scripts/draw.lua", "scripts/holders.lua"
        ),
        at "--[[ queue functions ]]"; concat!(lua!("scripts/mark.lua"), crate::scripts::serving!())
    ))
});

/// Moves the deadlines of a process's queued fair waiters of one key on: `fair/refresh.lua`.
pub(crate) static REFRESH_FAIR: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(lua!("#!lua"; "fair/entry.lua", "fair/refresh.lua")));

/// A fair request's queueing script call: its keys (and mode) and ttl; the token, the wait
/// left and the attempt's secret are added per attempt.
pub(crate) struct FairRequest {
    keys: LockKeys,
    ttl: Duration,
}

/// What one fair attempt found, with Redis's clock (ms) when the script ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FairAnswer {
    /// The caller holds the key now.
    Acquired { fencing_token: u64 },
    /// The caller is queued behind the holder, whose lease has `remaining` left (if it expires).
    Queued {
        remaining: Option<Duration>,
        server_ms: u64,
    },
}

impl FairRequest {
    pub(crate) fn new(keys: &LockKeys, ttl: Duration) -> Self {
        Self {
            keys: keys.clone(),
            ttl,
        }
    }

    /// One attempt by `token`, which waits `wait_left` more and stores `secret` in its entry.
    /// `waiting`: whether this request found the key held before.
    pub(crate) async fn send(
        &self,
        redis: &Serial,
        token: &str,
        secret: &str,
        wait_left: Duration,
        waiting: Waiting,
    ) -> Result<FairAnswer, Failed> {
        let k = &self.keys;
        let mut invocation = ScriptCall::new("acquire", &ACQUIRE_FAIR, Confirm::Write, 5);
        for key in [k.lock(), k.queue(), k.waiters(), k.fence(), k.holders()] {
            invocation.key(key);
        }
        // At most a century: the script does arithmetic on it in Lua numbers.
        let wait_ms = u64::try_from(wait_left.as_millis())
            .unwrap_or(u64::MAX)
            .min(100 * 365 * 86_400_000);
        invocation
            .arg(token)
            .arg(millis(self.ttl))
            .arg(millis(self.ttl.min(HANDOFF_CLAIM)))
            .arg(wait_ms)
            .arg(secret)
            .arg(redis.publish_command())
            .arg(waiting)
            .arg(Words(std::iter::once(k.word())));
        redis.call(&invocation).await
    }

    /// Keeps `waiters` (each an owner token and how long its entry is to last from now) in the
    /// queue; the tokens of those no longer in it.
    pub(crate) async fn refresh(
        &self,
        redis: &Serial,
        waiters: impl Iterator<Item = (&str, Duration)>,
    ) -> Result<Vec<String>, Failed> {
        let mut call = ScriptCall::new("refresh", &REFRESH_FAIR, Confirm::Write, 2);
        call.key(self.keys.queue())
            .key(self.keys.waiters())
            .arg(millis(self.ttl.min(HANDOFF_CLAIM)));
        for (token, keep) in waiters {
            call.arg(token).arg(millis(keep));
        }
        redis.call(&call).await
    }
}

impl redis::FromRedisValue for FairAnswer {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        let fields = match read_taking(v)? {
            Answered::Token(fencing_token) => return Ok(Self::Acquired { fencing_token }),
            Answered::Fields(fields) => fields,
        };
        let [0, pttl, now] = fields[..] else {
            return Err("unexpected fair acquire script reply".into());
        };
        Ok(Self::Queued {
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
            server_ms: u64::try_from(now).map_err(|_| "negative server time")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fair_scripts_answers_parse_a_bare_token_as_taken_and_an_array_as_queued() {
        use redis::{FromRedisValue, Value};
        let taken = FairAnswer::from_redis_value(Value::BulkString(b"1795000000123456".to_vec()));
        assert!(matches!(
            taken,
            Ok(FairAnswer::Acquired {
                fencing_token: 1_795_000_000_123_456
            })
        ));
        let queued = FairAnswer::from_redis_value(Value::Array(vec![
            Value::Int(0),
            Value::Int(2500),
            Value::Int(1_795_000_000_123),
        ]));
        assert!(matches!(
            queued,
            Ok(FairAnswer::Queued { remaining: Some(r), server_ms: 1_795_000_000_123 })
                if r == Duration::from_millis(2500)
        ));
        let no_expiry = FairAnswer::from_redis_value(Value::Array(vec![
            Value::Int(0),
            Value::Int(-1),
            Value::Int(5),
        ]));
        assert!(matches!(
            no_expiry,
            Ok(FairAnswer::Queued {
                remaining: None,
                ..
            })
        ));
        let wrong = FairAnswer::from_redis_value(Value::Array(vec![Value::Int(1), Value::Int(7)]));
        assert!(wrong.is_err());
    }
}
