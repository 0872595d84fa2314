use distlock_runtime::{distributed_lock, LockError};

struct User {
    id: u64,
    profile: Profile,
}

struct Profile {
    region: &'static str,
}

struct Path<T>(T);

#[distributed_lock(["stock:{sku}", "wallet:{user.id}", "region:{user.profile.region}"])]
async fn buy(sku: String, user: &User) -> Result<(), LockError> {
    let _ = (sku, user.id);
    Ok(())
}

#[distributed_lock(["pair:{pair.0}", "literal:{{braces}}:{pair.1}"])]
async fn tuple_fields(pair: (u32, String)) -> Result<u32, LockError> {
    Ok(pair.0)
}

// `fair` on a single key, in an array of one.
#[distributed_lock(["queue:{sku}"], fair = true, wait = "250ms")]
async fn fair_one_key(sku: String) -> Result<(), LockError> {
    let _ = sku;
    Ok(())
}

// `fair = false` with several keys.
#[distributed_lock(["stock:{sku}", "wallet:{user.id}"], fair = false)]
async fn unfair_keys(sku: String, user: &User) -> Result<(), LockError> {
    let _ = (sku, user.id);
    Ok(())
}

#[distributed_lock("product:{product_id}")]
async fn handler(Path(product_id): Path<u64>, (a, b): (u8, u8)) -> Result<u64, LockError> {
    Ok(product_id + u64::from(a) + u64::from(b))
}

fn main() {
    let user = User { id: 1, profile: Profile { region: "eu" } };
    let _ = buy("sku".into(), &user);
    let _ = tuple_fields((1, "x".into()));
    let _ = handler(Path(1), (1, 2));
    let _ = fair_one_key("sku".into());
    let _ = unfair_keys("sku".into(), &user);
}
