//! What a URL names: one server, a Redis Cluster node or a Sentinel, asked with one `HELLO` on a
//! connection of its own (and, of a Sentinel, which primaries it monitors). See
//! [`LockManagerBuilder::probe`](crate::LockManagerBuilder::probe).

use redis::Value;

use super::{dial, Timeouts};
use crate::error::Misconfiguration::{Permissions, Unsupported};
use crate::error::{LockError, Reply};
use crate::failed::failed;

/// What kind of server a URL names, as
/// [`LockManagerBuilder::probe`](crate::LockManagerBuilder::probe) found it, and so which
/// topology a manager for it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerKind {
    /// One Redis server (a primary or a replica), or one that would not say what it is (an ACL
    /// user without `+hello`, a server older than 6.2):
    /// [`LockManagerBuilder::url`](crate::LockManagerBuilder::url).
    Standalone,
    /// A Redis Cluster node: a seed for
    /// [`LockManagerBuilder::cluster`](crate::LockManagerBuilder::cluster).
    ClusterNode,
    /// A Sentinel: [`LockManagerBuilder::sentinel`](crate::LockManagerBuilder::sentinel) with
    /// one of the names it monitors.
    Sentinel {
        /// The names of the primaries it monitors, sorted.
        primaries: Vec<String>,
    },
}

/// Asks `client`'s server what it is: `HELLO` (no protocol switch), whose `mode` says
/// `standalone`, `cluster` or `sentinel`; of a Sentinel, `SENTINEL MASTERS` too. A server that
/// refuses `HELLO` (no right to it, or too old to know it) is taken for one server.
pub(crate) async fn probe(
    client: &redis::Client,
    timeouts: Timeouts,
) -> Result<ServerKind, LockError> {
    const OP: &str = "probe";
    let mut conn = dial(client, timeouts, OP).await?;
    let hello = match redis::cmd("HELLO").query_async::<Value>(&mut conn).await {
        Ok(hello) => hello,
        Err(source) => {
            return match Reply::of(&source) {
                // `NOPERM`, `ERR unknown command`: a server that would not say.
                Reply::Refused(Permissions | Unsupported) | Reply::Other
                    if !source.is_timeout() =>
                {
                    Ok(ServerKind::Standalone)
                }
                _ => Err(failed(OP, source, timeouts.response).error),
            };
        }
    };
    match field(&hello, "mode").as_deref() {
        Some("cluster") => Ok(ServerKind::ClusterNode),
        Some("sentinel") => {
            let masters = redis::cmd("SENTINEL")
                .arg("MASTERS")
                .query_async::<Vec<Value>>(&mut conn)
                .await
                .map_err(|source| LockError::from_redis(OP, source))?;
            let mut primaries: Vec<String> =
                masters.iter().filter_map(|m| field(m, "name")).collect();
            primaries.sort();
            Ok(ServerKind::Sentinel { primaries })
        }
        _ => Ok(ServerKind::Standalone),
    }
}

/// The text of field `name` of a map reply (a RESP3 map, or RESP2's flat array of pairs).
fn field(reply: &Value, name: &str) -> Option<String> {
    let text = |value: &Value| redis::from_redis_value_ref::<String>(value).ok();
    let named = |key: &Value, value: &Value| (text(key)? == name).then(|| text(value))?;
    match reply {
        Value::Map(pairs) => pairs.iter().find_map(|(key, value)| named(key, value)),
        Value::Array(items) => items
            .chunks_exact(2)
            .find_map(|pair| named(&pair[0], &pair[1])),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_from_resp2_pairs_and_resp3_maps() {
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![
            text("server"),
            text("redis"),
            text("proto"),
            Value::Int(2),
            text("mode"),
            text("cluster"),
        ]);
        assert_eq!(field(&resp2, "mode").as_deref(), Some("cluster"));
        let resp3 = Value::Map(vec![(text("name"), text("mymaster"))]);
        assert_eq!(field(&resp3, "name").as_deref(), Some("mymaster"));
        assert_eq!(field(&resp3, "mode"), None);
        assert_eq!(field(&Value::Nil, "mode"), None);
    }
}
