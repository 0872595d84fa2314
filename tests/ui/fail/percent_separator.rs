use distlock_runtime::{distributed_lock, LockError};

// Escaped values contain `%` ("x%" renders "x%25"), so `%` cannot tell two placeholders apart:
// ("x%", "25y") and ("x", "25%y") would both render "pair:x%25%25y".
#[distributed_lock("pair:{a}%{b}")]
async fn percent(a: String, b: String) -> Result<(), LockError> {
    let _ = (a, b);
    Ok(())
}

fn main() {}
