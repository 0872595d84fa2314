use std::fmt::Display;

use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("item:{id}")]
async fn generic<T: Display + Send + Sync>(id: T) -> Result<String, LockError> {
    Ok(id.to_string())
}

#[distributed_lock("item:{id}")]
async fn with_where<T, U>(id: T, extra: U) -> Result<usize, LockError>
where
    T: Display + Send + Sync,
    U: IntoIterator<Item = u8> + Send,
{
    Ok(extra.into_iter().count())
}

#[distributed_lock("item:{id}")]
async fn impl_trait(id: impl Display + Send + Sync, items: impl Iterator<Item = u8> + Send) -> Result<u32, LockError> {
    Ok(items.map(u32::from).sum())
}

#[distributed_lock("name:{name}")]
async fn lifetimes<'a, 'b: 'a>(name: &'a str, other: &'b str) -> Result<&'a str, LockError> {
    Ok(if other.is_empty() { name } else { other })
}

#[distributed_lock("name:{name}")]
async fn elided(name: &str) -> Result<&str, LockError> {
    Ok(name)
}

fn main() {
    let _ = generic(1);
    let _ = with_where("a", vec![1u8]);
    let _ = impl_trait(3, [1u8].into_iter());
    let _ = lifetimes("a", "b");
    let _ = elided("a");
}
