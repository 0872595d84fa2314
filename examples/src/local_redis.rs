//! Finding a Redis for the demos and the benchmark: `REDIS_URL` if set; else a throwaway
//! `redis-server` on a free loopback port, started here and stopped on drop; else a clear
//! message on how to get one. Never a server nobody named: a Redis that happens to answer on
//! `127.0.0.1:6379` may be someone's development database.

use distlock_runtime::testing::TestRedis;

/// A Redis to talk to, and the server process if this program started it.
pub struct LocalRedis {
    /// `redis://...`.
    pub url: String,
    /// Where the URL came from, for the user.
    pub origin: String,
    /// The server, when this program started it: stopped when dropped.
    _server: Option<TestRedis>,
}

impl LocalRedis {
    /// The Redis at `REDIS_URL` if it is set, else a throwaway one (see the module docs).
    ///
    /// # Errors
    /// A message for the user when `REDIS_URL` is not set and no server can be started.
    pub fn from_env_or_start() -> Result<Self, String> {
        match Self::from_env() {
            Some(redis) => Ok(redis),
            None => Self::start(),
        }
    }

    /// The Redis at `REDIS_URL`, if it is set.
    pub fn from_env() -> Option<Self> {
        let url = std::env::var("REDIS_URL").ok()?;
        Some(Self {
            url,
            origin: "REDIS_URL".to_owned(),
            _server: None,
        })
    }

    /// The Redis several processes share (instances started by hand in several terminals):
    /// `REDIS_URL`, never a throwaway server each, which would give each its own locks.
    ///
    /// # Errors
    /// A message saying how to name one when `REDIS_URL` is not set.
    pub fn shared() -> Result<Self, String> {
        Self::from_env().ok_or_else(|| {
            "instances started one by one must share a Redis: set REDIS_URL=redis://HOST:PORT \
             (or pass --redis-url) in each (a throwaway one: `redis-server --port 6390 --save ''`), \
             or run the demo, which starts its own"
                .to_owned()
        })
    }

    /// Starts a throwaway `redis-server` (persistence off) on a free loopback port, with the
    /// helper users test with ([`TestRedis`]).
    ///
    /// # Errors
    /// A message for the user when `redis-server` is missing (saying how to install it) or
    /// does not come up.
    pub fn start() -> Result<Self, String> {
        let server = TestRedis::start_blocking().map_err(|e| {
            format!(
                "no Redis to use: REDIS_URL is not set, and no throwaway one could be started: {e}"
            )
        })?;
        Ok(Self {
            url: server.url(),
            origin: format!(
                "a throwaway redis-server on port {}, started for this run and stopped at its end",
                server.port()
            ),
            _server: Some(server),
        })
    }
}
