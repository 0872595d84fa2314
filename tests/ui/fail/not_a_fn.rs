use distlock_runtime::distributed_lock;

#[distributed_lock("order:{id}")]
struct Order {
    id: u64,
}

#[distributed_lock("order:{id}")]
impl Order {
    fn id(&self) -> u64 {
        self.id
    }
}

fn main() {
    // The items are still emitted beside the errors: the struct and its method exist.
    let _ = Order { id: 1 }.id();
}
