//! What `inspect.lua` answers of a held lock, read once.

use redis::{FromRedisValue, ParsingError, Value};

/// One server's (or a quorum majority's) view of a held lock, as `scripts/inspect.lua` answers
/// it; a free lock answers nil (`Option<Inspected>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inspected {
    /// `x` (held exclusively), `h` (held exclusively by a hand-off's claim) or `s` (held
    /// shared or as permits).
    pub(crate) kind: String,
    /// The lock's time left in ms (held by members: until the last one's expiry); -1: no
    /// expiry.
    pub(crate) pttl: i64,
    /// The fencing counter's digits ("" when it has none).
    pub(crate) counter: String,
    /// The fair queue's entries (some may have lapsed).
    pub(crate) waiters: i64,
    /// How many live leases hold it.
    pub(crate) holders: i64,
    /// The live fair waiters in arrival order, each an owner token then its mode's word.
    pub(crate) queue: Vec<String>,
    /// The holders: the owner's token, or members in order of expiry (a token, or `N token`
    /// for a permit: see `holders.lua`).
    pub(crate) members: Vec<String>,
}

impl Inspected {
    /// The holders `reading` lists: none for a free lock.
    pub(crate) fn members_of(reading: &Option<Self>) -> &[String] {
        reading.as_ref().map_or(&[], |r| &r.members)
    }
}

impl FromRedisValue for Inspected {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let mut fields = Vec::<Value>::from_redis_value(v)?.into_iter();
        let mut next = || {
            fields
                .next()
                .ok_or_else(|| ParsingError::from("an inspect answer with too few fields"))
        };
        Ok(Self {
            kind: String::from_redis_value(next()?)?,
            pttl: i64::from_redis_value(next()?)?,
            counter: String::from_redis_value(next()?)?,
            waiters: i64::from_redis_value(next()?)?,
            holders: i64::from_redis_value(next()?)?,
            queue: Vec::from_redis_value(next()?)?,
            members: fields
                .map(String::from_redis_value)
                .collect::<Result<_, _>>()?,
        })
    }
}
