// Durations from constants and expressions, converted at every call.
use std::time::Duration;

use distlock_runtime::{distributed_lock, LockError};

const SETTINGS_TTL: u64 = 30;
const SETTINGS_WAIT: Duration = Duration::from_millis(1500);

struct Settings {
    hold: Duration,
}

#[distributed_lock("a:{id}", ttl = SETTINGS_TTL, wait = SETTINGS_WAIT)]
async fn from_consts(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("b:{id}", ttl = ttl_secs, wait = Duration::from_secs(1), hold_at_least = settings.hold)]
async fn from_arguments(id: u64, ttl_secs: i64, settings: &Settings) -> Result<(), LockError> {
    let _ = (id, ttl_secs, settings);
    Ok(())
}

fn main() {
    let _ = from_consts(1);
    let _ = from_arguments(1, 30, &Settings { hold: Duration::ZERO });
}
