//! Code shared by the example programs (`cargo run --example seckill|bench|basic`) and their
//! tests: the seckill service and finding a Redis to run against.

pub mod local_redis;
pub mod seckill;
