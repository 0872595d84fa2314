//! Finding a Redis for the demos and the benchmark: `REDIS_URL` if set; else a throwaway
//! `redis-server` on a free loopback port, started here and stopped on drop; else a clear
//! message on how to get one. Never a server nobody named: a Redis that happens to answer on
//! `127.0.0.1:6379` may be someone's development database.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A Redis to talk to, and the server process if this program started it.
pub struct LocalRedis {
    /// `redis://...`.
    pub url: String,
    /// Where the URL came from, for the user.
    pub origin: String,
    child: Option<Child>,
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
            child: None,
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

    /// Starts a throwaway `redis-server` (persistence off) on a free loopback port.
    ///
    /// # Errors
    /// A message for the user when `redis-server` is missing or does not come up.
    pub fn start() -> Result<Self, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free loopback port: {e}"))?
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|_| {
                "no Redis to use: REDIS_URL is not set, and redis-server (to start a throwaway \
                 one) is not on PATH. Install it (Debian/Ubuntu: `sudo apt-get install \
                 redis-server`, macOS: `brew install redis`) or set REDIS_URL=redis://host:port"
                    .to_owned()
            })?;
        let mut redis = Self {
            url: format!("redis://127.0.0.1:{port}"),
            origin: format!("a throwaway redis-server on port {port}, started for this run and stopped at its end"),
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if answers_ping(port) {
                return Ok(redis);
            }
            if let Some(child) = &mut redis.child {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("redis-server exited at start ({status})"));
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err("redis-server did not answer within 5 s".to_owned())
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether something on `127.0.0.1:port` answers `PING` with `PONG` within 300 ms.
fn answers_ping(port: u16) -> bool {
    let Ok(mut stream) =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(300))
    else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(300)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}
