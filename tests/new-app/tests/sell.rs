//! The app's test, written against `distlock_runtime::testing` alone: a throwaway redis-server,
//! 40 concurrent buyers for 10 units, exactly 10 sold.

use distlock_new_app::{sell, SaleError};
use distlock_runtime::testing::TestRedis;
use redis::AsyncCommands;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_buyers_ten_units_exactly_ten_sold() -> Result<(), Box<dyn std::error::Error>> {
    let redis = TestRedis::start().await?;
    let mut store = redis::Client::open(redis.url())?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = store.set("stock:7", 10).await?;
    let buyers: Vec<_> = (0..40)
        .map(|_| {
            let locks = redis.manager();
            let mut store = store.clone();
            tokio::spawn(async move { sell(&locks, &mut store, 7).await })
        })
        .collect();
    let (mut sold, mut sold_out) = (0, 0);
    for buyer in buyers {
        match buyer.await? {
            Ok(_) => sold += 1,
            Err(SaleError::SoldOut) => sold_out += 1,
            Err(other) => return Err(other.into()),
        }
    }
    assert_eq!((sold, sold_out), (10, 30));
    assert_eq!(store.get::<_, u64>("stock:7").await?, 0);
    Ok(())
}
