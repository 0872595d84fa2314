use std::fmt::Display;
use std::sync::Arc;

use distlock_runtime::{distributed_lock, LockError, LockManager};

// A one-line body, and `impl Trait` inside the Result (the axum handler shape).
#[distributed_lock("t:{id}")]
async fn one_line(id: u32) -> Result<u32, LockError> { Ok(id) }

#[distributed_lock("t:{id}")]
async fn impl_in_result(id: u32) -> Result<impl Display + Send, LockError> {
    Ok(id)
}

// A raw identifier, and a parameter named like the generated locals.
#[distributed_lock("kind:{r#type}:{__distlock_keys}")]
async fn raw_ident(r#type: &str, __distlock_keys: u32) -> Result<String, LockError> {
    Ok(format!("{type}:{__distlock_keys}", type = r#type))
}

// Key literals passed through a macro_rules! macro resolve to the fn's parameters.
macro_rules! locked {
    ($key:literal, $name:ident) => {
        #[distributed_lock($key)]
        async fn $name(id: u32) -> Result<u32, LockError> {
            Ok(id)
        }
    };
}
locked!("from-macro:{id}", from_macro);

struct Svc {
    locks: Arc<LockManager>,
    id: u32,
}

impl Svc {
    #[distributed_lock("svc:{self.id}", manager = &self.locks)]
    async fn boxed(self: Box<Self>) -> Result<u32, LockError> {
        Ok(self.id)
    }
}

fn require_send<T: Send>(_: T) {}

fn main() {
    require_send(one_line(1));
    require_send(impl_in_result(1));
    let _ = raw_ident("a", 1);
    let _ = from_macro(1);
    let _ = Svc::boxed;
}
